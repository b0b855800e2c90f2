"""Spark SQL text built in Python (`rules.names.string`, `rules.changes.newer_than_sql`), parsed by
the unit tier's real JVM: a literal reads back as the value it was made from, and the text form of
the (lsn, seq) guard decides as its Column form does, unknown positions included."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

from spark_jobs.rules.changes import newer_than, newer_than_sql
from spark_jobs.rules.names import string

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def test_a_string_literal_reads_back_as_its_value(spark: SparkSession) -> None:
    values = ["plain", "it's", "back\\slash", "\\'", "a`b", 'double "quotes"', "new\nline", "", "ünï"]
    row = spark.sql("SELECT " + ", ".join(f"{string(v)} AS c{i}" for i, v in enumerate(values))).first()
    assert row is not None
    assert list(row) == values


def test_the_guard_as_text_decides_as_the_guard_as_columns(spark: SparkSession) -> None:
    from pyspark.sql import functions as F

    positions = [None, 1, 2]
    grid = list(itertools.product(positions, repeat=4))
    frame = spark.createDataFrame(grid, "l long, s long, ol long, os long")
    as_columns = newer_than(F.col("l"), F.col("s"), F.col("ol"), F.col("os"))
    as_text = F.expr(newer_than_sql("`l`", "`s`", "`ol`", "`os`"))
    rows = frame.select(as_columns.alias("columns"), as_text.alias("text")).collect()
    assert len(rows) == len(grid)
    assert [r["columns"] for r in rows] == [r["text"] for r in rows]


def test_a_plain_type_named_in_sql_casts_to_that_type(spark: SparkSession) -> None:
    from pyspark.sql import types as T

    from spark_jobs.decoding.spark_decode import sql_type

    plain = [
        T.BooleanType(),
        T.ShortType(),
        T.IntegerType(),
        T.LongType(),
        T.FloatType(),
        T.DoubleType(),
        T.DecimalType(38, 9),
        T.StringType(),
        T.BinaryType(),
        T.DateType(),
        T.TimestampType(),
        T.TimestampNTZType(),
        T.DayTimeIntervalType(),
    ]
    text = ", ".join(f"CAST(NULL AS {sql_type(t)}) AS c{i}" for i, t in enumerate(plain))
    previous = spark.conf.get("spark.sql.timestampType")
    # A bare `timestamp` would follow this setting; the lake's timestamps keep their time zone.
    spark.conf.set("spark.sql.timestampType", "TIMESTAMP_NTZ")
    try:
        schema = spark.sql(f"SELECT {text}").schema
    finally:
        spark.conf.set("spark.sql.timestampType", previous or "TIMESTAMP_LTZ")
    assert [f.dataType for f in schema.fields] == plain
