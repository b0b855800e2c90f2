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
