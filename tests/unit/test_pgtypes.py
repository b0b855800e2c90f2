"""Type mapping per type family: Avro schema, value after a fastavro round trip, JSON output.

Every Avro value also goes through the compiled writer, which must write the very bytes fastavro
writes. Expected values come from independent references (the stdlib's Decimal, datetime, base64,
json), never from the code under test.
"""

from __future__ import annotations

import base64
import json
import struct
import uuid
from decimal import Decimal

import pytest

from cdc_worker.core.model import TypeInfo
from cdc_worker.core.pgtypes.oids import (
    VARHDRSZ,
    PgArrayType,
    PgType,
    numeric_precision_scale,
    type_modifier_suffix,
)
from cdc_worker.core.pgtypes.text import ConversionError
from tests.unit.pgtypes_helpers import avro_round_trip, json_value, mapped, numeric_typmod

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
