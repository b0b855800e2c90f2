"""The record envelope's expressions built once per JVM (`spark_envelope.once_per_jvm`) and shared by
every table's plan, on the unit tier's real JVM: built again they cost round trips, shared they must
still read each frame's own records. Beside them, the frame check (Spark SQL text): a record the
batch cannot decode fails it, named."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING

import pytest

from kafka_contract.headers import HEADER_COMMIT_TS, HEADER_LSN, HEADER_OP, HEADER_SEQ, HEADER_UNCHANGED
from spark_jobs.decoding.spark_envelope import headers_map, meta_columns, meta_field_columns, once_per_jvm
from spark_jobs.rules import layout
from tests.unit.jvm_round_trips import round_trips

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

RECORD = (
    "topic string, partition int, offset long, key binary, value binary,"
    " headers array<struct<key:string,value:binary>>"
)


def _record(offset: int, lsn: int, op: str, value: bytes | None) -> tuple[object, ...]:
    headers = [
        (HEADER_LSN, str(lsn).encode()),
        (HEADER_SEQ, b"0"),
        (HEADER_OP, op.encode()),
        (HEADER_COMMIT_TS, b"2024-01-02T03:04:05+00:00"),
        (HEADER_UNCHANGED, b"notes" if op == "u" else b""),
    ]
    return ("t", 0, offset, b"k", value, headers)


def _meta(frame: DataFrame) -> list[tuple[object, ...]]:
    rows = frame.select("*", headers_map()).select(*meta_columns()).select(*meta_field_columns())
    return [tuple(r) for r in rows.orderBy(layout.LSN).collect()]


def test_the_envelope_is_built_once_and_each_plan_reads_its_own_records(spark: SparkSession) -> None:
    first = spark.createDataFrame([_record(5, 100, "c", b"v"), _record(6, 101, "u", b"w")], RECORD)
    # Another table's records, its columns in another order: the shared columns resolve by name.
    second = spark.createDataFrame([_record(9, 200, "u", None)], RECORD).select(
        "headers", "value", "key", "offset", "partition", "topic"
    )
    assert _meta(first)  # built here (or by an earlier test)
    with round_trips(spark) as sent:
        meta_columns(), headers_map(), meta_field_columns()
    assert sent == []
    at = datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC).astimezone().replace(tzinfo=None)
    assert _meta(first) == [(100, 0, "c", at, None, 0, 5), (101, 0, "u", at, ["notes"], 0, 6)]
    assert _meta(second) == [(200, 0, "d", at, ["notes"], 0, 9)]  # no value: a delete


def test_a_missing_header_still_names_the_record(spark: SparkSession) -> None:
    record = ("orders", 2, 17, b"k", b"v", [(HEADER_OP, b"c")])
    frame = spark.createDataFrame([record], RECORD)
    with pytest.raises(
        Exception, match=f"topic orders partition 2 offset 17: message without the {HEADER_LSN} header"
    ):
        _meta(frame)


def test_another_gateway_builds_them_anew(monkeypatch: pytest.MonkeyPatch) -> None:
    from pyspark import SparkContext

    built: list[object] = []

    @once_per_jvm
    def expression() -> object:
        built.append(object())
        return built[-1]

    assert expression() is expression()
    assert len(built) == 1
    monkeypatch.setattr(SparkContext, "_gateway", object())  # as after a new JVM was launched
    assert expression() is built[-1]
    assert len(built) == 2
    assert expression() is built[-1]
    assert len(built) == 2


FRAMED_SCHEMA = {"type": "record", "name": "k", "fields": [{"name": "id", "type": "long"}]}


@pytest.mark.parametrize(
    ("key", "error"),
    [
        (b"\x01\x00\x00\x00\x01\x02", "key is not a Confluent-framed Avro message"),  # wrong magic byte
        (b"\x00\x00\x01", "key is not a Confluent-framed Avro message"),  # shorter than a frame
        (b"\x00\x00\x00\x00\x07\x02", "key schema id not fetched for this batch"),
    ],
    ids=["magic", "short", "unknown id"],
)
def test_a_record_the_batch_cannot_decode_fails_naming_it(
    spark: SparkSession, key: bytes, error: str
) -> None:
    """The frame check (Spark SQL text) fails the batch on the record, not a null row in its place;
    a well-framed record beside it decodes."""
    from pyspark.sql.types import LongType

    from spark_jobs.decoding.spark_decode import decode_avro

    good = ("orders", 0, 4, b"\x00\x00\x00\x00\x01\x02", None, _record(4, 100, "d", None)[5])
    bad = ("orders", 3, 41, key, None, _record(41, 101, "d", None)[5])
    schemas = {1: FRAMED_SCHEMA}
    decoded = decode_avro(spark.createDataFrame([good], RECORD), schemas, {}, [("id", LongType())])
    assert [(r["id"], r[layout.OP]) for r in decoded.collect()] == [(1, "d")]
    frame = decode_avro(spark.createDataFrame([good, bad], RECORD), schemas, {}, [("id", LongType())])
    with pytest.raises(Exception, match=f"topic orders partition 3 offset 41: {error}"):
        frame.collect()
