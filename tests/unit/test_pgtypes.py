"""Type mapping per type family: Avro schema, value after a fastavro round trip, JSON output.

Every Avro value also goes through the compiled writer, which must write the very bytes fastavro
writes. Expected values come from independent references (the stdlib's Decimal, datetime, base64,
json), never from the code under test.
"""

from __future__ import annotations

import base64
import io
import json
import struct
import uuid
from datetime import UTC, date, datetime, time, timedelta, timezone
from decimal import Decimal
from typing import Any

import fastavro
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdc_worker.avro_binary import compile_record_writer
from cdc_worker.model import TypeInfo
from cdc_worker.pgoids import (
    VARHDRSZ,
    PgArrayType,
    PgType,
    numeric_precision_scale,
    type_modifier_suffix,
)
from cdc_worker.pgtemporal import (
    DATE_NEG_INFINITY,
    DATE_POS_INFINITY,
    TIMESTAMP_NEG_INFINITY,
    TIMESTAMP_POS_INFINITY,
    civil_from_days,
    days_from_civil,
)
from cdc_worker.pgtext import ConversionError
from cdc_worker.pgtypes import ColumnType, TypeMappingOptions, resolve_type

EPOCH = date(1970, 1, 1)


def numeric_typmod(precision: int, scale: int) -> int:
    return ((precision << 16) | (scale & 0x7FF)) + VARHDRSZ


def mapped(
    oid: int, typmod: int = -1, infos: dict[int, TypeInfo] | None = None, **options: Any
) -> ColumnType:
    return resolve_type(oid, typmod, infos or {}, TypeMappingOptions(**options))


def record_schema(column_type: ColumnType) -> dict[str, Any]:
    return {
        "type": "record",
        "name": "r",
        "fields": [{"name": "v", "type": ["null", column_type.avro_schema]}],
    }


def avro_round_trip(column_type: ColumnType, text: str, *, logical: bool = True) -> Any:
    """fastavro writes the converted value, the compiled writer must match it, fastavro reads it."""
    schema = record_schema(column_type)
    reference = io.BytesIO()
    fastavro.schemaless_writer(reference, fastavro.parse_schema(schema), {"v": column_type.avro_value(text)})
    compiled = compile_record_writer(schema, [column_type.to_avro])([text])
    assert compiled == reference.getvalue()
    if not logical:  # sentinels: read the underlying primitive, which no datetime can hold
        schema = json.loads(json.dumps(schema).replace('"logicalType"', '"ignoredLogicalType"'))
    return fastavro.schemaless_reader(io.BytesIO(compiled), fastavro.parse_schema(schema))["v"]


def json_value(column_type: ColumnType, text: str) -> Any:
    return json.loads(column_type.json_text(text))


# --- numbers -----------------------------------------------------------------------------------


def test_bool() -> None:
    column = mapped(PgType.BOOL)
    assert column.avro_schema == "boolean"
    assert (avro_round_trip(column, "t"), avro_round_trip(column, "f")) == (True, False)
    assert (json_value(column, "t"), json_value(column, "f")) == (True, False)


@pytest.mark.parametrize(
    ("oid", "avro", "texts"),
    [
        (PgType.INT2, "int", ["-32768", "32767", "0"]),
        (PgType.INT4, "int", ["-2147483648", "2147483647", "8191", "8192"]),
        (PgType.INT8, "long", ["-9223372036854775808", "9223372036854775807", "-1"]),
        (PgType.OID, "long", ["0", "4294967295"]),
    ],
)
def test_integers(oid: int, avro: str, texts: list[str]) -> None:
    column = mapped(oid)
    assert column.avro_schema == avro
    for text in texts:
        assert avro_round_trip(column, text) == int(text)
        assert json_value(column, text) == int(text)


@pytest.mark.parametrize("text", ["1.5", "-0", "1e+30", "1.1", "3.4028235e+38", "1e-45"])
def test_float4_keeps_the_float32_value(text: str) -> None:
    column = mapped(PgType.FLOAT4)
    assert column.avro_schema == "float"
    (float32,) = struct.unpack("<f", struct.pack("<f", float(text)))
    assert avro_round_trip(column, text) == float32
    assert json_value(column, text) == float(text)


@pytest.mark.parametrize("text", ["1.5", "-0", "1e+308", "0.1", "5e-324", "-1.2345678901234567e-300"])
def test_float8_exact(text: str) -> None:
    column = mapped(PgType.FLOAT8)
    assert column.avro_schema == "double"
    assert avro_round_trip(column, text) == float(text)
    assert json_value(column, text) == float(text)


@pytest.mark.parametrize(
    ("oid", "text"),
    [(o, t) for o in (PgType.FLOAT4, PgType.FLOAT8) for t in ("NaN", "Infinity", "-Infinity")],
)
def test_float_specials_are_kept_and_strings_in_json(oid: int, text: str) -> None:
    column = mapped(oid)
    value = avro_round_trip(column, text)
    assert repr(value) == repr(float(text))  # nan != nan, so compare the spelling
    assert json_value(column, text) == text


@pytest.mark.parametrize(
    ("precision", "scale", "text"),
    [
        (10, 2, "-1234.50"),
        (10, 2, "0.00"),
        (5, 0, "-99999"),
        (38, 10, "1234567890123456789012345678.0123456789"),
        (3, 5, "0.00123"),
    ],
)
def test_numeric_with_typmod_is_an_exact_decimal(precision: int, scale: int, text: str) -> None:
    column = mapped(PgType.NUMERIC, numeric_typmod(precision, scale))
    assert column.avro_schema == {
        "type": "bytes",
        "logicalType": "decimal",
        "precision": max(precision, scale),
        "scale": scale,
    }
    value = avro_round_trip(column, text)
    assert value == Decimal(text) and value.as_tuple().exponent == -scale
    assert json_value(column, text) == text
    assert column.pg_name == f"numeric({precision},{scale})"


def test_numeric_negative_scale_counts_whole_digits() -> None:
    column = mapped(PgType.NUMERIC, numeric_typmod(2, -2))
    assert numeric_precision_scale(numeric_typmod(2, -2)) == (2, -2)
    assert column.avro_schema["precision"] == 4 and column.avro_schema["scale"] == 0  # type: ignore[index]
    assert avro_round_trip(column, "9900") == Decimal("9900")


@pytest.mark.parametrize("text", ["NaN", "Infinity", "-Infinity"])
def test_numeric_nan_under_decimal_is_a_data_error(text: str) -> None:
    column = mapped(PgType.NUMERIC, numeric_typmod(10, 2))
    with pytest.raises(ConversionError, match="without a typmod"):
        column.avro_value(text)


def test_decimal_that_does_not_fit_is_a_data_error() -> None:
    column = mapped(PgType.NUMERIC, numeric_typmod(4, 2))
    with pytest.raises(ConversionError, match="more than 4 digits"):
        column.avro_value("123.45")


def test_numeric_without_typmod_is_an_exact_string() -> None:
    column = mapped(PgType.NUMERIC)
    text = "3.14159265358979323846264338327950288419716939937510"
    assert column.avro_schema == "string"
    assert avro_round_trip(column, text) == text and avro_round_trip(column, "NaN") == "NaN"
    assert json_value(column, text) == text


def test_numeric_without_typmod_in_decimal_mode() -> None:
    column = mapped(PgType.NUMERIC, unconstrained_numeric=(20, 4))
    assert avro_round_trip(column, "12.5") == Decimal("12.5000")
    assert avro_round_trip(column, "-7") == Decimal("-7.0000")
    with pytest.raises(ConversionError, match="fraction digits"):
        column.avro_value("0.00001")


@pytest.mark.parametrize(
    ("text", "amount"),
    [("$1,234.56", "1234.56"), ("-$92,233,720,368,547,758.08", "-92233720368547758.08"), ("$0.00", "0.00")],
)
def test_money_is_a_decimal_of_scale_2(text: str, amount: str) -> None:
    column = mapped(PgType.MONEY)
    assert column.avro_schema == {"type": "bytes", "logicalType": "decimal", "precision": 19, "scale": 2}
    assert avro_round_trip(column, text) == Decimal(amount)
    assert json_value(column, text) == amount


def test_money_in_another_locale_is_a_data_error() -> None:
    with pytest.raises(ConversionError, match="lc_monetary=C"):
        mapped(PgType.MONEY).avro_value("1.234,56 €")


# --- strings and bytes -------------------------------------------------------------------------


@pytest.mark.parametrize("oid", [PgType.TEXT, PgType.VARCHAR, PgType.BPCHAR, PgType.NAME, PgType.CHAR])
@pytest.mark.parametrize("text", ["", 'Zoë 👩‍🔬 "quoted" \\ back', "tab\tnew\nline\x01", "x" * 9000])
def test_strings(oid: int, text: str) -> None:
    column = mapped(oid)
    assert column.avro_schema == "string"
    assert avro_round_trip(column, text) == text
    assert json_value(column, text) == text


def test_typmods_show_in_the_type_name() -> None:
    assert mapped(PgType.VARCHAR, 20 + VARHDRSZ).pg_name == "varchar(20)"
    assert mapped(PgType.BPCHAR, 3 + VARHDRSZ).pg_name == "bpchar(3)"
    assert mapped(PgType.TIMESTAMPTZ, 3).pg_name == "timestamptz(3)"
    assert mapped(PgType.TIME, 0).pg_name == "time(0)"
    assert mapped(PgType.VARBIT, 8).pg_name == "varbit(8)"
    assert type_modifier_suffix(PgType.INTERVAL, 0x7FFF0002) == "(2)"  # all fields, precision 2
    assert type_modifier_suffix(PgType.INTERVAL, 0x7FFFFFFF) == ""  # all fields, no precision


def test_bytea_keeps_nul_bytes_and_is_base64_in_json() -> None:
    column = mapped(PgType.BYTEA)
    data = bytes(range(256)) + b"\x00\x00"
    text = "\\x" + data.hex()
    assert column.avro_schema == "bytes"
    assert avro_round_trip(column, text) == data
    assert base64.b64decode(json_value(column, text)) == data
    assert avro_round_trip(column, "\\x") == b""


def test_bytea_escape_format_is_refused() -> None:
    with pytest.raises(ConversionError, match="bytea_output=hex"):
        mapped(PgType.BYTEA).avro_value("abc\\000")


def test_uuid() -> None:
    column = mapped(PgType.UUID)
    text = "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"
    assert column.avro_schema == {"type": "string", "logicalType": "uuid"}
    assert avro_round_trip(column, text) == uuid.UUID(text)
    assert json_value(column, text) == text


@pytest.mark.parametrize("oid", [PgType.JSON, PgType.JSONB])
@pytest.mark.parametrize(
    "text", ['{"a": [1, 2.50, null, "é"], "b": {"c": true}}', "12345678901234567890.123", '"s"', "null", "[]"]
)
def test_json_is_a_string_in_avro_and_embedded_in_json(oid: int, text: str) -> None:
    column = mapped(oid)
    assert column.avro_schema == "string"
    assert avro_round_trip(column, text) == text
    assert json_value(column, text) == json.loads(text)


# --- dates and times ---------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["2024-02-29", "1970-01-01", "0001-01-01", "9999-12-31", "1969-12-31"])
def test_date(text: str) -> None:
    column = mapped(PgType.DATE)
    assert column.avro_schema == {"type": "int", "logicalType": "date"}
    assert avro_round_trip(column, text) == date.fromisoformat(text)
    assert json_value(column, text) == text


def test_bc_and_far_future_dates_are_exact_days() -> None:
    column = mapped(PgType.DATE)
    # 1 BC is astronomical year 0, a leap year: 366 days before 0001-01-01.
    first_ad = (date(1, 1, 1) - EPOCH).days
    assert avro_round_trip(column, "0001-01-01 BC", logical=False) == first_ad - 366
    assert avro_round_trip(column, "0001-12-31 BC", logical=False) == first_ad - 1
    assert json_value(column, "0001-01-01 BC") == "0000-01-01"
    assert json_value(column, "0044-03-15 BC") == "-0043-03-15"
    # 10000-01-01 is 365 days after 9999-01-01 (9999 is not a leap year).
    assert avro_round_trip(column, "10000-01-01", logical=False) == (date(9999, 1, 1) - EPOCH).days + 365
    assert json_value(column, "10000-01-01") == "+10000-01-01"


@pytest.mark.parametrize(
    ("text", "sentinel"), [("infinity", DATE_POS_INFINITY), ("-infinity", DATE_NEG_INFINITY)]
)
def test_date_infinities_are_sentinels(text: str, sentinel: int) -> None:
    column = mapped(PgType.DATE)
    assert avro_round_trip(column, text, logical=False) == sentinel
    assert json_value(column, text) == text


@given(st.integers(min_value=-3_000_000, max_value=3_000_000))
def test_civil_calendar_round_trips(days: int) -> None:
    year, month, day = civil_from_days(days)
    assert days_from_civil(year, month, day) == days
    if 1 <= year <= 9999:
        assert date(year, month, day) == EPOCH + timedelta(days=days)


@pytest.mark.parametrize(
    "text",
    ["2024-01-02 03:04:05.123456", "2024-01-02 03:04:05", "1900-02-28 23:59:59.5", "0001-01-01 00:00:00"],
)
def test_timestamp_is_local_micros(text: str) -> None:
    column = mapped(PgType.TIMESTAMP)
    assert column.avro_schema == {"type": "long", "logicalType": "local-timestamp-micros"}
    expected = datetime.fromisoformat(text)
    assert avro_round_trip(column, text) == expected
    assert json_value(column, text) == expected.isoformat(timespec="microseconds")


@pytest.mark.parametrize(
    "text",
    [
        "2024-01-02 03:04:05.123456+00",
        "2024-01-02 08:34:05.5+05:30",
        "2023-12-31 22:04:05-05",
        "1800-01-01 05:53:28+05:53:28",
        "1969-12-31 23:59:59.999999+00",
    ],
)
def test_timestamptz_is_utc_micros_whatever_the_offset(text: str) -> None:
    column = mapped(PgType.TIMESTAMPTZ)
    assert column.avro_schema == {"type": "long", "logicalType": "timestamp-micros"}
    hours, _, rest = text.rpartition("+") if "+" in text[19:] else text.rpartition("-")
    offset_text = text[len(hours) :]
    sign = 1 if offset_text[0] == "+" else -1
    parts = [int(p) for p in offset_text[1:].split(":")] + [0, 0]
    offset = timezone(sign * timedelta(hours=parts[0], minutes=parts[1], seconds=parts[2]))
    expected = datetime.fromisoformat(hours).replace(tzinfo=offset).astimezone(UTC)
    assert avro_round_trip(column, text) == expected
    assert json_value(column, text) == expected.replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"


def test_bc_timestamps_are_exact() -> None:
    column = mapped(PgType.TIMESTAMPTZ)
    first_ad = (date(1, 1, 1) - EPOCH).days
    micros = avro_round_trip(column, "0001-12-31 23:00:00+00 BC", logical=False)
    assert micros == ((first_ad - 1) * 86_400 + 23 * 3600) * 1_000_000
    assert json_value(column, "0001-12-31 23:00:00+00 BC") == "0000-12-31T23:00:00.000000Z"
    assert json_value(mapped(PgType.TIMESTAMP), "0044-03-15 12:00:00 BC") == "-0043-03-15T12:00:00.000000"


@pytest.mark.parametrize("oid", [PgType.TIMESTAMP, PgType.TIMESTAMPTZ])
@pytest.mark.parametrize(
    ("text", "sentinel"), [("infinity", TIMESTAMP_POS_INFINITY), ("-infinity", TIMESTAMP_NEG_INFINITY)]
)
def test_timestamp_infinities_are_sentinels(oid: int, text: str, sentinel: int) -> None:
    column = mapped(oid)
    assert avro_round_trip(column, text, logical=False) == sentinel
    assert json_value(column, text) == text


def test_timestamp_beyond_avro_long_is_a_data_error() -> None:
    with pytest.raises(ConversionError, match="timestamp-micros"):
        mapped(PgType.TIMESTAMPTZ).avro_value("294276-12-31 23:59:59+00")


@pytest.mark.parametrize("text", ["00:00:00", "04:05:06.789", "23:59:59.999999"])
def test_time(text: str) -> None:
    column = mapped(PgType.TIME)
    assert column.avro_schema == {"type": "long", "logicalType": "time-micros"}
    assert avro_round_trip(column, text) == time.fromisoformat(text)
    assert json_value(column, text) == time.fromisoformat(text).isoformat(timespec="microseconds")


def test_time_end_of_day() -> None:
    column = mapped(PgType.TIME)
    assert avro_round_trip(column, "24:00:00", logical=False) == 86_400 * 1_000_000
    assert json_value(column, "24:00:00") == "24:00:00.000000"


def test_timetz_is_its_iso_text() -> None:
    column = mapped(PgType.TIMETZ)
    assert column.avro_schema == "string"
    assert avro_round_trip(column, "04:05:06.5+05:30") == "04:05:06.5+05:30"
    assert json_value(column, "04:05:06-08") == "04:05:06-08"


@pytest.mark.parametrize(
    ("text", "months", "days", "micros"),
    [
        ("00:00:00", 0, 0, 0),
        ("1 year 2 mons 3 days 04:05:06.5", 14, 3, (4 * 3600 + 5 * 60 + 6) * 1_000_000 + 500_000),
        ("-1 years -2 mons +3 days -04:05:06.5", -14, 3, -((4 * 3600 + 5 * 60 + 6) * 1_000_000 + 500_000)),
        ("1 day 25:00:00", 0, 1, 25 * 3600 * 1_000_000),
        ("-00:00:00.000001", 0, 0, -1),
        ("1 mon", 1, 0, 0),
        ("2562047788:00:54.775807", 0, 0, 2**63 - 1),
    ],
)
def test_interval_record(text: str, months: int, days: int, micros: int) -> None:
    column = mapped(PgType.INTERVAL)
    assert column.avro_schema["type"] == "record"  # type: ignore[index]
    assert avro_round_trip(column, text) == {"months": months, "days": days, "micros": micros}


@pytest.mark.parametrize(
    ("text", "iso"),
    [
        ("00:00:00", "PT0S"),
        ("-1 years -2 mons +3 days -04:05:06.5", "P-1Y-2M3DT-4H-5M-6.5S"),
        ("1 day 25:00:00", "P1DT25H"),
        ("-00:00:00.5", "PT-0.5S"),
        ("1 mon -00:00:00.000001", "P1MT-0.000001S"),
    ],
)
def test_interval_json_is_postgres_iso_8601(text: str, iso: str) -> None:
    # The expected spellings are Postgres 15's own under IntervalStyle=iso_8601 for the same values.
    assert json_value(mapped(PgType.INTERVAL), text) == iso


# --- arrays, enum, domain, extension types -----------------------------------------------------


def test_int_array_with_nulls() -> None:
    column = mapped(PgArrayType.INT4)
    assert column.avro_schema == {"type": "array", "items": ["null", "int"]}
    assert avro_round_trip(column, "{1,NULL,-3}") == [1, None, -3]
    assert json_value(column, "{1,NULL,-3}") == [1, None, -3]
    assert avro_round_trip(column, "{}") == []


def test_text_array_with_quoting() -> None:
    column = mapped(PgArrayType.TEXT)
    text = '{"a b","NULL",NULL,"x\\"y\\\\z","",plain,"{braces}","a,b"}'
    expected = ["a b", "NULL", None, 'x"y\\z', "", "plain", "{braces}", "a,b"]
    assert avro_round_trip(column, text) == expected
    assert json_value(column, text) == expected


def test_array_of_converted_items() -> None:
    numeric = mapped(PgArrayType.NUMERIC, numeric_typmod(5, 2))
    assert avro_round_trip(numeric, "{1.50,NULL,-2.00}") == [Decimal("1.50"), None, Decimal("-2.00")]
    assert json_value(numeric, "{1.50,NULL,-2.00}") == ["1.50", None, "-2.00"]
    jsonb = mapped(PgArrayType.JSONB)
    assert json_value(jsonb, '{"{\\"a\\": 1}",NULL}') == [{"a": 1}, None]
    stamps = mapped(PgArrayType.TIMESTAMPTZ)
    assert json_value(stamps, '{"2024-01-02 03:04:05+00",infinity}') == [
        "2024-01-02T03:04:05.000000Z",
        "infinity",
    ]


def test_box_array_uses_semicolons() -> None:
    column = mapped(PgArrayType.BOX)
    assert avro_round_trip(column, "{(3,4),(1,2);(1,1),(0,0)}") == ["(3,4),(1,2)", "(1,1),(0,0)"]


@pytest.mark.parametrize(
    ("text", "reason"), [("{{1,2},{3,4}}", "multi-dimensional"), ("[0:1]={1,2}", "explicit bounds")]
)
def test_unrepresentable_arrays(text: str, reason: str) -> None:
    with pytest.raises(ConversionError, match=reason):
        mapped(PgArrayType.INT4).avro_value(text)


ENUM = TypeInfo(90001, "public", "mood", "e")
ENUM_ARRAY = TypeInfo(90002, "public", "_mood", "b", element_oid=ENUM.oid)
DOMAIN = TypeInfo(90003, "public", "price", "d", base_oid=PgType.NUMERIC, base_typmod=numeric_typmod(6, 2))
DOMAIN_ARRAY = TypeInfo(90004, "public", "_price", "b", element_oid=DOMAIN.oid)
HSTORE = TypeInfo(90005, "extensions", "hstore", "b")
CITEXT = TypeInfo(90006, "public", "citext", "b")
COMPOSITE = TypeInfo(90007, "public", "pair", "c")
INFOS = {info.oid: info for info in (ENUM, ENUM_ARRAY, DOMAIN, DOMAIN_ARRAY, HSTORE, CITEXT, COMPOSITE)}


def test_enum_is_a_string() -> None:
    column = mapped(ENUM.oid, infos=INFOS)
    assert column.avro_schema == "string" and column.pg_name == "public.mood"
    assert avro_round_trip(column, "happy") == "happy" and json_value(column, "happy") == "happy"
    assert avro_round_trip(mapped(ENUM_ARRAY.oid, infos=INFOS), "{happy,NULL}") == ["happy", None]


def test_domain_is_its_base_type() -> None:
    column = mapped(DOMAIN.oid, infos=INFOS)
    assert column.avro_schema == {"type": "bytes", "logicalType": "decimal", "precision": 6, "scale": 2}
    assert avro_round_trip(column, "12.30") == Decimal("12.30")
    assert avro_round_trip(mapped(DOMAIN_ARRAY.oid, infos=INFOS), "{1.00}") == [Decimal("1.00")]


def test_hstore_is_a_map_of_nullable_strings() -> None:
    column = mapped(HSTORE.oid, infos=INFOS)
    text = '"a"=>"1", "b"=>NULL, "q\\"k"=>"v\\\\w", ""=>""'
    expected = {"a": "1", "b": None, 'q"k': "v\\w", "": ""}
    assert column.avro_schema == {"type": "map", "values": ["null", "string"]}
    assert avro_round_trip(column, text) == expected
    assert json_value(column, text) == expected
    assert avro_round_trip(column, "") == {}


def test_hstore_garbage_is_a_data_error() -> None:
    with pytest.raises(ConversionError, match="hstore"):
        mapped(HSTORE.oid, infos=INFOS).avro_value('"a"=>')


@pytest.mark.parametrize(
    ("oid", "text"),
    [
        (CITEXT.oid, "MiXeD"),
        (COMPOSITE.oid, '(1,"a b")'),
        (PgType.INET, "192.168.0.1/24"),
        (PgType.TSTZRANGE, '["2024-01-01 00:00:00+00",)'),
        (424242, "unknown type text"),
    ],
)
def test_everything_else_is_its_text(oid: int, text: str) -> None:
    column = mapped(oid, infos=INFOS)
    assert column.avro_schema == "string"
    assert avro_round_trip(column, text) == text
    assert json_value(column, text) == text
