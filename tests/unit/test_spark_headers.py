"""A Kafka record's `bw.*` headers read with Spark's expressions (`decoding.spark_envelope`), as the
merge and the changelog read them: a header's text, null when absent; the header at the worker's
position when it is there by that name, else a repeated header's last value (as the worker's own
reading, a dict of them, takes it)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kafka_contract.headers import HEADER_LSN, HEADER_OP, HEADER_SEQ
from spark_jobs.decoding.spark_envelope import HEADERS_MAP, header, headers_map

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

SCHEMA = "id int, headers array<struct<key:string,value:binary>>"


def test_headers_are_read_at_their_place_else_by_name_a_repeated_ones_last(spark: SparkSession) -> None:
    records = spark.createDataFrame(
        [
            (1, [(HEADER_OP, b"u"), (HEADER_LSN, b"42"), (HEADER_SEQ, b"7")]),
            (2, [(HEADER_LSN, b"1"), (HEADER_OP, b"c"), (HEADER_LSN, b"2")]),  # repeated: the last
            (3, [(HEADER_OP, b"d"), (HEADER_LSN, None)]),  # a header without a value
            (4, []),
            (5, None),  # a record without headers
            (
                6,
                [(HEADER_OP, b"c"), (HEADER_LSN, b"9"), (HEADER_SEQ, b"3"), (HEADER_LSN, b"8")],
            ),  # at its place
            (7, [(HEADER_SEQ, b"5"), (HEADER_OP, b"r"), (HEADER_LSN, b"6")]),  # elsewhere: by name
        ],
        SCHEMA,
    )
    read = records.select("id", "headers", headers_map()).select(
        "id",
        header(HEADER_OP).alias("op"),
        header(HEADER_LSN).cast("long").alias("lsn"),
        header(HEADER_SEQ).alias("seq"),
    )
    # The changelog reads them without the map column, building the map only where it is needed.
    inline = records.select(
        "id",
        header(HEADER_OP, HEADERS_MAP).alias("op"),
        header(HEADER_LSN, HEADERS_MAP).cast("long").alias("lsn"),
        header(HEADER_SEQ, HEADERS_MAP).alias("seq"),
    )
    expected = {
        1: ("u", 42, "7"),
        2: ("c", 2, None),
        3: ("d", None, None),
        4: (None, None, None),
        5: (None, None, None),
        6: ("c", 9, "3"),
        7: ("r", 6, "5"),
    }
    for frame in (read, inline):
        assert {r["id"]: (r["op"], r["lsn"], r["seq"]) for r in frame.collect()} == expected
