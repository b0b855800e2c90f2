"""The merge's pure helpers: frames, headers, value normalisers, type mapping, row hashing."""

from __future__ import annotations

import struct
from datetime import UTC, date, datetime
from decimal import Decimal

import pytest
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    TimestampNTZType,
    TimestampType,
)

from cdc_worker.core.encoding.avro_schema import value_schema
from cdc_worker.core.model import Column, TableSchema
from cdc_worker.core.pgtypes.mapping import table_column_types
from cdc_worker.core.pgtypes.oids import PgArrayType, PgType
from kafka_contract.framing import parse_frame
from kafka_contract.headers import EventHeaders, WireFormatError, parse_headers
from spark_jobs.connections import postgres_catalog
from spark_jobs.decoding import spark_types
from spark_jobs.merging import batch_schema
from spark_jobs.rules import layout, names, rowhash
from tests.reference import avro_values, decoders, wire


def test_frame_gives_schema_id_and_body_offset() -> None:
    assert parse_frame(b"\x00" + struct.pack(">I", 70000) + b"body") == (70000, 5)
    with pytest.raises(WireFormatError, match="--format json"):
        parse_frame(b'{"id": 1}')
    with pytest.raises(WireFormatError):
        parse_frame(b"\x00\x01")


def test_headers_parse_and_a_missing_one_is_an_error() -> None:
    headers = {"bw.op": b"u", "bw.lsn": b"18446744073709551615", "bw.seq": b"3", "bw.xid": b"9",
               "bw.commit_ts": b"2024-05-06T07:08:09.123456Z", "bw.unchanged": b"body,notes"}  # fmt: skip
    parsed = parse_headers(headers, {})
    expected_ts = int(datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=UTC).timestamp()) * 10**6 + 123456
    assert parsed == EventHeaders("u", 2**64 - 1, 3, 9, expected_ts, ("body", "notes"))
    del headers["bw.lsn"]
    with pytest.raises(WireFormatError, match="bw.lsn"):
        parse_headers(headers)


def test_infinity_sentinels_clamp_into_sparks_range() -> None:
    assert wire.clamp_days(2**31 - 1) == (date(9999, 12, 31) - date(1970, 1, 1)).days
    assert wire.clamp_days(-(2**31)) == (date(1, 1, 1) - date(1970, 1, 1)).days
    assert wire.clamp_micros(2**63 - 1) == spark_types.SPARK_MAX_MICROS
    assert wire.clamp_micros(12345) == 12345
    assert wire.time_text(13 * 3600 * 10**6 + 5 * 10**6 + 7) == "13:00:05.000007"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("PT0S", (0, 0, 0)),
        ("P1Y2M3DT4H5M6.5S", (14, 3, (4 * 3600 + 5 * 60 + 6) * 10**6 + 500000)),
        ("P-1M-2DT-3H", (-1, -2, -3 * 3600 * 10**6)),
        ("PT-0.000001S", (0, 0, -1)),
        ("P2W", (0, 14, 0)),
    ],
)
def test_iso_intervals_become_the_avro_record(text: str, expected: tuple[int, int, int]) -> None:
    assert wire.interval_from_iso(text) == dict(zip(("months", "days", "micros"), expected, strict=True))


def test_avro_value_schema_maps_to_spark_types_by_postgres_name() -> None:
    table = TableSchema(1, "public", "t", (
        Column("id", PgType.INT4, -1), Column("price tag", PgType.NUMERIC, (10 << 16 | 2) + 4),
        Column("at", PgType.TIMESTAMPTZ, -1), Column("local", PgType.TIMESTAMP, -1),
        Column("day", PgType.DATE, -1), Column("blob", PgType.BYTEA, -1),
        Column("span", PgType.INTERVAL, -1), Column("clock", PgType.TIME, -1),
        Column("tags", PgArrayType.TEXT, -1), Column("ratio", PgType.FLOAT4, -1),
        Column("big", PgType.INT8, -1), Column("wide", PgType.NUMERIC, (50 << 16 | 5) + 4),
    ), key_columns=("id",))  # fmt: skip
    schema = value_schema(table, table_column_types(table, {}))
    columns = spark_types.record_columns(schema)
    assert [(c.name, c.data_type) for c in columns] == [
        ("id", IntegerType()), ("price tag", DecimalType(10, 2)), ("at", TimestampType()),
        ("local", TimestampNTZType()), ("day", DateType()), ("blob", BinaryType()),
        ("span", spark_types.INTERVAL_TYPE), ("clock", StringType()), ("tags", ArrayType(StringType(), True)),
        ("ratio", FloatType()), ("big", LongType()), ("wide", StringType()),
    ]  # fmt: skip
    assert columns[1].field == "price_20_tag"
    stripped = avro_values.strip_logical_types(schema)
    assert stripped["fields"][2]["type"] == ["null", "long"]  # timestamptz arrives as its integer
    converters = avro_values.field_converters(schema)
    clock, wide = converters["clock"], converters["wide"]
    assert clock is not None and clock(1_000_000) == "00:00:01.000000"
    assert wide is not None and wide(Decimal("1E+3")) == "1000"


def test_postgres_catalog_types_match_the_avro_mapping() -> None:
    assert spark_types.pg_type("numeric", (3, -2)) == DecimalType(5, 0)
    assert spark_types.pg_type("numeric", (2, 4)) == DecimalType(4, 4)
    assert spark_types.pg_type("numeric") == StringType()
    assert spark_types.pg_type("timestamptz", array=True) == ArrayType(TimestampType(), True)
    assert spark_types.pg_type("hstore") == MapType(StringType(), StringType(), True)
    assert spark_types.pg_type("inet") == StringType()
    assert postgres_catalog.numeric_precision_scale((10 << 16 | 2) + 4) == (10, 2)
    assert postgres_catalog.numeric_precision_scale(-1) is None
    assert postgres_catalog.split_qualified("sales.orders") == ("sales", "orders")


def test_json_values_convert_to_the_column_type() -> None:
    assert decoders.json_value("12.50", DecimalType(10, 2)) == Decimal("12.50")
    assert decoders.json_value("2024-01-02T03:04:05.000006Z", TimestampType()) == 1704164645000006
    assert decoders.json_value("infinity", DateType()) == spark_types.SPARK_MAX_DAYS
    assert decoders.json_value("-0044-03-15", DateType()) == spark_types.SPARK_MIN_DAYS
    assert decoders.json_value("AAE=", BinaryType()) == b"\x00\x01"
    assert decoders.json_value({"a": [1, 2]}, StringType()) == '{"a": [1, 2]}'
    assert decoders.json_value("NaN", DoubleType()) != decoders.json_value("NaN", DoubleType())  # NaN kept
    assert decoders.json_value("P1D", spark_types.INTERVAL_TYPE) == {"months": 0, "days": 1, "micros": 0}
    with pytest.raises(WireFormatError, match="--postgres"):
        decoders.json_value(0.5, LongType())
    assert spark_types.infer_json_type([1, 2]) == LongType()
    assert spark_types.infer_json_type([1, 2.5]) == DoubleType()
    assert spark_types.infer_json_type(["x", 1]) == StringType()
    assert decoders.days_from_civil(2000, 3, 1) == (date(2000, 3, 1) - date(1970, 1, 1)).days


def test_layout_from_topic_names() -> None:
    assert layout.location_for_topic("app.people", "app") == layout.TableLocation(
        "app.people", "public", "people"
    )
    located = layout.location_for_topic("sales.orders")
    assert located.path("s3a://lake/") == "s3a://lake/sales/orders"
    assert located.tombstones_path("/w") == "/w/_bw_state/sales/orders/tombstones"
    with pytest.raises(ValueError, match="--topic-prefix"):
        layout.location_for_topic("a.b.c")
    assert layout.parse_position(layout.format_position(5, 2)) == (5, 2)


def test_identifiers_are_quoted_with_backticks() -> None:
    assert names.quote("we`ird name") == "`we``ird name`"
    assert names.column("t", "a.b") == "`t`.`a.b`"
    assert names.delta_path("/tmp/x`y") == "delta.`/tmp/x``y`"


def test_row_hashes_agree_across_the_two_sides_python_forms() -> None:
    types = [
        IntegerType(),
        DecimalType(10, 2),
        TimestampType(),
        TimestampNTZType(),
        FloatType(),
        MapType(StringType(), StringType()),
    ]
    hasher = rowhash.RowHasher(types)
    # What psycopg2 returns ...
    postgres = [
        1,
        Decimal("2.5"),
        datetime(2024, 1, 1, 1, tzinfo=UTC).astimezone(tz=None),
        datetime(2024, 1, 1),
        1.1,
        {"b": "2", "a": None},
    ]
    # ... and what Arrow returns for the same Delta row.
    delta = [
        1,
        Decimal("2.50"),
        datetime(2024, 1, 1, 1, tzinfo=UTC),
        datetime(2024, 1, 1),
        struct.unpack(">f", struct.pack(">f", 1.1))[0],
        [("a", None), ("b", "2")],
    ]
    assert hasher.hash(postgres) == hasher.hash(delta)
    assert hasher.hash([2, *delta[1:]]) != hasher.hash(delta)
    one, other = rowhash.Fingerprint(), rowhash.Fingerprint()
    for h in (5, 7, rowhash.MOD - 1):
        one.add(h)
    for h in (rowhash.MOD - 1, 7, 5):
        other.add(h)
    assert (one.count, one.checksum) == (other.count, other.checksum) == (3, 11)
    assert rowhash.key_text(["id", "at"], [1, date(2024, 1, 1)]) == '{"id": 1, "at": "2024-01-01"}'


def test_batch_identity_depends_only_on_the_end_offsets() -> None:
    one = batch_schema.BatchSummary(offsets={("t", 0): 10, ("t", 1): 4, ("ctl", 0): 0}, table_messages=7)
    same_ends = batch_schema.BatchSummary(
        offsets={("ctl", 0): 0, ("t", 1): 4, ("t", 0): 10}, table_messages=3
    )
    further = batch_schema.BatchSummary(offsets={("t", 0): 11, ("t", 1): 4, ("ctl", 0): 0})
    assert one.identity() == same_ends.identity()
    assert one.identity() != further.identity()
