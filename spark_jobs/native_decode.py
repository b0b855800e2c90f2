"""Kafka records -> typed rows with Spark's own expressions: `from_avro`, `from_json`, no Python per record.

Same output, row for row, as the Python reference in `decoders` (held equal by
tests/integration/test_native_decode.py): the table's columns, then `_bw_lsn`, `_bw_seq`, `_bw_op`,
`_bw_commit_ts`, `_bw_unchanged`, and the Kafka partition and offset.

Avro: the 5-byte Confluent frame is cut off with `substring`, and each writer schema version in the
batch decodes its own messages (`from_avro` takes one schema per call, so the batch is split by the
frame's schema id inside one projection: one pass over the records). What Spark's Avro reader maps
otherwise than the lake is given back its Avro primitive and converted here:
time-micros (Spark 4.1+ reads it as TIME, the lake keeps `HH:MM:SS.ffffff` text) and decimals wider
than Spark's 38 digits (exact text, computed from the two's-complement bytes). Dates and timestamps
keep their logical types and are clamped into Spark's range, as the ±infinity sentinels must be.

JSON: one `from_json` per message in FAILFAST mode, so a value of the wrong type fails the batch
instead of becoming null. Dates, timestamps and intervals are read as text and converted here (the
contract's `infinity`, years outside 1..9999, ISO-8601 durations). A text column is read as a
VARIANT only to tell a JSON string from a JSON value (json/jsonb columns), which keeps Python's
`json.dumps` spelling (`{"a": 1}`, the spelling Postgres gives jsonb).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from pyspark.sql.types import (
    ArrayType,
    DataType,
    DateType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
    VariantType,
)

from kafka_contract.framing import CONFLUENT_MAGIC
from kafka_contract.headers import (
    HEADER_COMMIT_TS,
    HEADER_LSN,
    HEADER_OP,
    HEADER_SEQ,
    HEADER_UNCHANGED,
    OP_DELETE,
)
from spark_jobs import layout, wire
from spark_jobs.decoders import META_FIELDS, OFFSET, PARTITION
from spark_jobs.spark_types import COLUMN_PROPERTY, MAX_SPARK_DECIMAL_PRECISION

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

ColumnFn = Callable[["Column"], "Column"]
FRAME_BYTES = 5
MICROS_PER_SECOND = 1_000_000
MICROS_PER_MILLI = 1000
SECONDS_PER_MINUTE = 60
MINUTES_PER_HOUR = 60
MIN_YEAR, MAX_YEAR = 1, 9999
# Base of the limbs a wide decimal's magnitude is accumulated in: 9 decimal digits, so that
# limb * 256 + carry stays far inside a long.
_LIMB = 1_000_000_000
_LIMB_DIGITS = 9
_BYTE = 256
_DATE_TEXT = r"^([+-]?\d{4,})-(\d\d)-(\d\d)"
_ISO_DURATION = (
    r"^(-)?P(?:(-?\d+)Y)?(?:(-?\d+)M)?(?:(-?\d+)W)?(?:(-?\d+)D)?"
    r"(?:T(?:(-?\d+)H)?(?:(-?\d+)M)?(?:(-?\d+(?:\.\d+)?)S)?)?$"
)
# One JSON token outside a string, or a whole string, up to a separator: anchored with \G to where
# the previous match ended, so a separator inside a string is never taken for one.
_JSON_SEPARATOR = r"""\G((?:"(?:[^"\\]|\\.)*"|[^",:])*)([,:])"""
_INTERVAL_FIELDS = ("months", "days", "micros")


# --- record metadata: headers, partition, offset ------------------------------------------------


def _fail(where: Column, text: str) -> Column:
    from pyspark.sql import functions as F

    return F.raise_error(F.concat(where, F.lit(f": {text}")))


def _where() -> Column:
    from pyspark.sql import functions as F

    return F.concat_ws(
        " ", F.lit("topic"), "topic", F.lit("partition"), "partition", F.lit("offset"), "offset"
    )


HEADERS = "_bw_headers"


def headers_map() -> Column:
    """The record's headers as one map, built once per record (`meta_columns` reads it five times).
    A repeated header keeps its last value, as a dict of them does: the session's
    `spark.sql.mapKeyDedupPolicy` is LAST_WIN (spark_jobs.session)."""
    from pyspark.sql import functions as F

    return F.map_from_entries(F.col("headers")).alias(HEADERS)


def _header(name: str) -> Column:
    """The header's text; null when absent."""
    from pyspark.sql import functions as F

    return F.try_element_at(F.col(HEADERS), F.lit(name)).cast("string")


def _required(name: str) -> Column:
    from pyspark.sql import functions as F

    value = _header(name)
    missing = _fail(_where(), f"message without the {name} header: not written by bottledwater")
    return F.when(value.isNull(), missing).otherwise(value)


def meta_columns() -> list[Column]:
    from pyspark.sql import functions as F

    unchanged = _header(HEADER_UNCHANGED)
    neither = _fail(_where(), "a message with neither key nor value")
    op = (
        F.when(F.col("key").isNull() & F.col("value").isNull(), neither)
        .when(F.col("value").isNull(), F.lit(OP_DELETE))
        .otherwise(_required(HEADER_OP))
    )
    return [
        _required(HEADER_LSN).cast("long").alias(layout.LSN),
        _required(HEADER_SEQ).cast("long").alias(layout.SEQ),
        op.alias(layout.OP),
        _required(HEADER_COMMIT_TS).cast("timestamp").alias(layout.COMMIT_TS),
        F.when(unchanged != F.lit(""), F.split(unchanged, ",")).alias(layout.UNCHANGED),
        F.col("partition").alias(PARTITION),
        F.col("offset").alias(OFFSET),
    ]


# --- value converters shared by Avro and JSON ------------------------------------------------------


def _max_ntz() -> Column:
    from pyspark.sql import functions as F

    return F.expr("make_timestamp_ntz(9999, 12, 31, 23, 59, 59.999999)")


def _clamp(column: Column, data_type: DataType) -> Column:
    """A date or timestamp held inside the range Spark can format (the ±infinity sentinels included)."""
    from pyspark.sql import functions as F

    if isinstance(data_type, DateType):
        low = F.date_from_unix_date(F.lit(wire.SPARK_MIN_DAYS))
        high = F.date_from_unix_date(F.lit(wire.SPARK_MAX_DAYS))
    elif isinstance(data_type, TimestampType):
        low = F.timestamp_micros(F.lit(wire.SPARK_MIN_MICROS))
        high = F.timestamp_micros(F.lit(wire.SPARK_MAX_MICROS))
    else:
        low, high = F.expr("make_timestamp_ntz(1, 1, 1, 0, 0, 0)"), _max_ntz()
    # least/greatest skip nulls: a null stays null only behind the guard.
    return F.when(column.isNotNull(), F.greatest(F.least(column, high), low))


def _div(column: Column, divisor: int) -> Column:
    """Integer division of a non-negative long (exact: the quotient of a multiple is an integer)."""
    return ((column - column % divisor) / divisor).cast("long")


def time_text(micros: Column) -> Column:
    """time-micros -> `HH:MM:SS.ffffff` (24:00:00 kept), as `wire.time_text`."""
    from pyspark.sql import functions as F

    seconds = _div(micros, MICROS_PER_SECOND)
    minutes = _div(seconds, SECONDS_PER_MINUTE)
    return F.format_string(
        "%02d:%02d:%02d.%06d",
        _div(minutes, MINUTES_PER_HOUR),
        minutes % MINUTES_PER_HOUR,
        seconds % SECONDS_PER_MINUTE,
        micros % MICROS_PER_SECOND,
    )


def _times_plus(limbs: Column, factor: int, addend: Column) -> Column:
    """limbs * factor + addend, little-endian base-10^9 limbs, the carry walked through them."""
    from pyspark.sql import functions as F

    start = F.struct(F.array().cast("array<bigint>").alias("out"), addend.cast("long").alias("carry"))

    def step(state: Column, limb: Column) -> Column:
        total = limb * factor + state["carry"]
        return F.struct(
            F.concat(state["out"], F.array(total % _LIMB)).alias("out"), _div(total, _LIMB).alias("carry")
        )

    def finish(state: Column) -> Column:
        return F.when(state["carry"] > 0, F.concat(state["out"], F.array(state["carry"]))).otherwise(
            state["out"]
        )

    return F.aggregate(limbs, start, step, finish)


def wide_decimal_text(data: Column, scale: int) -> Column:
    """A decimal's two's-complement big-endian bytes -> its exact text with `scale` digits after the
    point, as `format(Decimal, "f")`: for precisions Spark's decimal cannot hold."""
    from pyspark.sql import functions as F

    def byte_at(i: Column) -> Column:
        return F.conv(F.hex(data.substr(i, F.lit(1))), 16, 10).cast("long")

    negative = byte_at(F.lit(1)) >= 128
    # A negative number's magnitude is its bytes complemented, plus one.
    values = F.transform(
        F.sequence(F.lit(1), F.length(data)),
        lambda i: F.when(negative, 255 - byte_at(i)).otherwise(byte_at(i)),
    )
    limbs = F.aggregate(values, F.array(F.lit(0).cast("long")), lambda acc, b: _times_plus(acc, _BYTE, b))
    limbs = F.when(negative, _times_plus(limbs, 1, F.lit(1))).otherwise(limbs)
    high_first = F.reverse(limbs)
    digits = F.concat(
        F.get(high_first, 0).cast("string"),
        F.array_join(
            F.transform(
                F.slice(high_first, 2, F.size(high_first)), lambda d: F.lpad(d.cast("string"), 9, "0")
            ),
            "",
        ),
    )
    if scale > 0:
        padded = F.lpad(digits, F.greatest(F.length(digits), F.lit(scale + 1)), "0")
        whole = padded.substr(F.lit(1), F.length(padded) - scale)
        digits = F.concat(whole, F.lit("."), padded.substr(F.length(padded) - scale + 1, F.lit(scale)))
    return F.when(data.isNotNull(), F.concat(F.when(negative, F.lit("-")).otherwise(F.lit("")), digits))


def _json_needs_conversion(data_type: DataType) -> bool:
    if isinstance(data_type, ArrayType):
        return _json_needs_conversion(data_type.elementType)
    if isinstance(data_type, MapType):
        return _json_needs_conversion(data_type.valueType)
    return isinstance(data_type, (StringType, DateType, TimestampType, TimestampNTZType, StructType))


# --- Avro ------------------------------------------------------------------------------------------


def reader_schema(schema: Any) -> Any:
    """The writer schema as `from_avro` is given it: time and wide-decimal logical types removed
    (their bytes are the same), so Spark yields the long or bytes that the converters turn to text."""
    stripped = copy.deepcopy(schema)

    def walk(node: Any) -> Any:
        if isinstance(node, list):
            return [walk(n) for n in node]
        if not isinstance(node, dict):
            return node
        logical = node.get("logicalType")
        if logical in ("time-micros", "time-millis"):
            return node["type"]
        if logical == "decimal" and int(node["precision"]) > MAX_SPARK_DECIMAL_PRECISION:
            return node["type"]
        if node.get("type") == "record":
            for field in node["fields"]:
                field["type"] = walk(field["type"])
        elif node.get("type") == "array":
            node["items"] = walk(node["items"])
        elif node.get("type") == "map":
            node["values"] = walk(node["values"])
        return node

    return walk(stripped)


def _avro_convert(schema: Any, named: dict[str, Any], namespace: str) -> ColumnFn | None:
    """The converter from what `from_avro` yields for this (writer) type to the lake's value."""
    from pyspark.sql import functions as F

    if isinstance(schema, list):
        (branch,) = [b for b in schema if b != "null"]
        return _avro_convert(branch, named, namespace)
    if isinstance(schema, str):
        full = schema if "." in schema else f"{namespace}.{schema}" if namespace else schema
        target = named.get(full, named.get(schema))
        return None if target is None else _avro_convert(target, named, namespace)
    kind, logical = schema["type"], schema.get("logicalType")
    if kind == "record":
        space = schema.get("namespace", namespace)
        name = schema["name"]
        named[name if "." in name else f"{space}.{name}" if space else name] = schema
        fields = [(f["name"], _avro_convert(f["type"], named, space)) for f in schema["fields"]]
        if all(c is None for _, c in fields):
            return None
        return lambda c: F.when(
            c.isNotNull(), F.struct(*[(fn(c[n]) if fn else c[n]).alias(n) for n, fn in fields])
        )
    if logical == "date":
        return lambda c: _clamp(c, DateType())
    if logical in ("timestamp-micros", "timestamp-millis"):
        return lambda c: _clamp(c, TimestampType())
    if logical in ("local-timestamp-micros", "local-timestamp-millis"):
        return lambda c: _clamp(c, TimestampNTZType())
    if logical in ("time-micros", "time-millis"):
        scale = 1 if logical == "time-micros" else MICROS_PER_MILLI
        return lambda c: F.when(c.isNotNull(), time_text(c * scale))
    if logical == "decimal" and int(schema["precision"]) > MAX_SPARK_DECIMAL_PRECISION:
        scale_digits = int(schema.get("scale", 0))
        return lambda c: wide_decimal_text(c, scale_digits)
    if kind == "array":
        item = _avro_convert(schema["items"], named, namespace)
        return None if item is None else (lambda c: F.transform(c, item))
    if kind == "map":
        value = _avro_convert(schema["values"], named, namespace)
        return None if value is None else (lambda c: F.transform_values(c, lambda _, v: value(v)))
    return None


def _avro_fields(schema: dict[str, Any]) -> dict[str, tuple[str, ColumnFn | None]]:
    """Postgres column name -> (Avro field name, converter) of one writer schema version."""
    named: dict[str, Any] = {}
    namespace = schema.get("namespace", "")
    return {
        f.get(COLUMN_PROPERTY, f["name"]): (f["name"], _avro_convert(f["type"], named, namespace))
        for f in schema["fields"]
    }


def _frame_id(part: str) -> Column:
    """The frame's 4 schema id bytes, compared as bytes (converting them to an int per record cost
    about 9 % of decoding and appending a batch, docs/lakehouse.md)."""
    from pyspark.sql import functions as F

    return F.substring(part, 2, 4)


def _frame_id_bytes(schema_id: int) -> Column:
    from pyspark.sql import functions as F

    return F.lit(bytearray(schema_id.to_bytes(4, "big")))


def _decoded_versions(part: str, schemas: dict[int, dict[str, Any]]) -> list[Column]:
    """One struct column per writer schema version: its messages decoded, null on the others."""
    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import from_avro

    payload = F.expr(f"substring({part}, {FRAME_BYTES + 1})")
    return [
        F.when(
            F.col(part).isNotNull() & (_frame_id(part) == _frame_id_bytes(schema_id)),
            from_avro(payload, json.dumps(reader_schema(schema))),
        ).alias(f"_bw_{part}_{schema_id}")
        for schema_id, schema in sorted(schemas.items())
    ]


def _frame_check(part: str, schema_ids: Sequence[int]) -> Column:
    """Null, or the error of a framed message this batch cannot decode."""
    from pyspark.sql import functions as F

    data = F.col(part)
    bad_magic = F.substring(part, 1, 1) != F.lit(bytearray((CONFLUENT_MAGIC,)))
    unknown = ~_frame_id(part).isin([_frame_id_bytes(i) for i in schema_ids]) if schema_ids else F.lit(True)
    return F.when(
        data.isNotNull() & (bad_magic | (F.length(data) < FRAME_BYTES)),
        _fail(_where(), f"{part} is not a Confluent-framed Avro message"),
    ).when(data.isNotNull() & unknown, _fail(_where(), f"{part} schema id not fetched for this batch"))


def decode_avro(
    rows: DataFrame,
    key_schemas: dict[int, dict[str, Any]],
    value_schemas: dict[int, dict[str, Any]],
    columns: Sequence[tuple[str, DataType]],
) -> DataFrame:
    """A table topic's Avro records -> the table's columns (the union over the writer schema versions,
    each value cast to the column's type) and the metadata columns."""
    from pyspark.sql import functions as F

    staged = rows.select("*", headers_map()).select(
        *_decoded_versions("key", key_schemas),
        *_decoded_versions("value", value_schemas),
        _frame_check("key", list(key_schemas)).alias("_bw_key_check"),
        _frame_check("value", list(value_schemas)).alias("_bw_value_check"),
        *meta_columns(),
    )
    versions = {
        part: {sid: _avro_fields(schema) for sid, schema in schemas.items()}
        for part, schemas in (("key", key_schemas), ("value", value_schemas))
    }

    def from_versions(part: str, name: str) -> Column | None:
        values = []
        for schema_id, fields in sorted(versions[part].items()):
            if name in fields:
                field, convert = fields[name]
                raw = F.col(f"_bw_{part}_{schema_id}")[field]
                values.append(convert(raw) if convert else raw)
        return None if not values else values[0] if len(values) == 1 else F.coalesce(*values)

    out = []
    tombstone = F.col(layout.OP) == F.lit(OP_DELETE)
    for name, data_type in columns:
        key_value, value_value = from_versions("key", name), from_versions("value", name)
        if key_value is not None and value_value is not None:
            value: Column = F.when(tombstone, key_value).otherwise(value_value)
        else:
            value = (
                key_value
                if key_value is not None
                else value_value
                if value_value is not None
                else F.lit(None)
            )
        out.append(value.cast(data_type).alias(name))
    checked = staged.where(F.coalesce(F.col("_bw_key_check"), F.col("_bw_value_check")).isNull())
    return checked.select(*out, *[F.col(f.name) for f in META_FIELDS])


# --- JSON ------------------------------------------------------------------------------------------


def _json_read_type(data_type: DataType) -> DataType:
    """The type `from_json` reads a column as: text for what the contract spells its own way."""
    if isinstance(data_type, StringType):
        return VariantType()
    if isinstance(data_type, (DateType, TimestampType, TimestampNTZType, StructType)):
        return StringType()
    if isinstance(data_type, ArrayType):
        return ArrayType(_json_read_type(data_type.elementType), True)
    if isinstance(data_type, MapType):
        return MapType(StringType(), _json_read_type(data_type.valueType), True)
    return data_type


def _python_json_spelling(text: Column) -> Column:
    """Spark's compact JSON -> `json.dumps`'s (a space after `,` and `:` outside strings)."""
    from pyspark.sql import functions as F

    return F.regexp_replace(text, _JSON_SEPARATOR, "$1$2 ")


def _json_date(text: Column, data_type: DataType) -> Column:
    from pyspark.sql import functions as F

    year = F.regexp_extract(text, _DATE_TEXT, 1).cast("int")
    unreadable = _fail(F.lit("JSON date/timestamp"), "unreadable")
    if isinstance(data_type, DateType):
        low_v = F.date_from_unix_date(F.lit(wire.SPARK_MIN_DAYS))
        high_v = F.date_from_unix_date(F.lit(wire.SPARK_MAX_DAYS))
        parsed = F.make_date(year, F.regexp_extract(text, _DATE_TEXT, 2).cast("int"),
                             F.regexp_extract(text, _DATE_TEXT, 3).cast("int"))  # fmt: skip
    elif isinstance(data_type, TimestampType):
        low_v = F.timestamp_micros(F.lit(wire.SPARK_MIN_MICROS))
        high_v = F.timestamp_micros(F.lit(wire.SPARK_MAX_MICROS))
        parsed = text.cast("timestamp")
    else:
        low_v, high_v = F.expr("make_timestamp_ntz(1, 1, 1, 0, 0, 0)"), _max_ntz()
        parsed = text.cast("timestamp_ntz")
    return (
        F.when(text.isNull(), F.lit(None).cast(data_type))
        .when(text == F.lit("infinity"), high_v)
        .when(text == F.lit("-infinity"), low_v)
        .when(~text.rlike(_DATE_TEXT), unreadable)
        .when(year < MIN_YEAR, low_v)
        .when(year > MAX_YEAR, high_v)
        .otherwise(parsed)
    )


def interval_from_iso(text: Column) -> Column:
    """An ISO-8601 duration -> struct<months, days, micros>, as `wire.interval_from_iso`."""
    from pyspark.sql import functions as F

    def part(group: int) -> Column:
        return F.coalesce(F.nullif(F.regexp_extract(text, _ISO_DURATION, group), F.lit("")), F.lit("0"))

    sign = F.when(F.regexp_extract(text, _ISO_DURATION, 1) == F.lit("-"), -1).otherwise(1)
    months = part(2).cast("int") * 12 + part(3).cast("int")
    days = part(4).cast("int") * 7 + part(5).cast("int")
    micros = (part(6).cast("long") * 3600 + part(7).cast("long") * 60) * MICROS_PER_SECOND + (
        part(8).cast("decimal(38,6)") * MICROS_PER_SECOND
    ).cast("long")
    unreadable = ~text.rlike(_ISO_DURATION) | text.isin("P", "PT")
    return F.when(
        unreadable, _fail(F.concat(F.lit("JSON interval "), text), "unreadable ISO-8601")
    ).otherwise(
        F.struct(
            (sign * months).cast("int").alias("months"),
            (sign * days).cast("int").alias("days"),
            (sign * micros).cast("long").alias("micros"),
        )
    )


def _json_convert(column: Column, data_type: DataType) -> Column | None:
    from pyspark.sql import functions as F

    if isinstance(data_type, StringType):
        is_text = F.schema_of_variant(column) == F.lit("STRING")
        raw = _python_json_spelling(F.to_json(column))
        return (
            F.when(column.isNull() | F.is_variant_null(column), F.lit(None).cast("string"))
            .when(is_text, F.variant_get(column, "$", "string"))
            .otherwise(raw)
        )
    if isinstance(data_type, (DateType, TimestampType, TimestampNTZType)):
        return _json_date(column, data_type)
    if isinstance(data_type, StructType):
        return F.when(column.startswith("{"), F.from_json(column, data_type)).when(
            column.isNotNull(), interval_from_iso(column).cast(data_type)
        )
    if isinstance(data_type, ArrayType) and _json_needs_conversion(data_type):
        element = data_type.elementType
        return F.transform(column, lambda x: _or_same(_json_convert(x, element), x))
    if isinstance(data_type, MapType) and _json_needs_conversion(data_type):
        value_type = data_type.valueType
        return F.transform_values(column, lambda _, v: _or_same(_json_convert(v, value_type), v))
    return None


def _or_same(converted: Column | None, column: Column) -> Column:
    return column if converted is None else converted


def decode_json(rows: DataFrame, keys: Sequence[str], columns: Sequence[tuple[str, DataType]]) -> DataFrame:
    """A table topic's JSON records -> the given columns (types from the lake or catalog) and metadata."""
    from pyspark.sql import functions as F

    types = dict(columns)
    value_schema = StructType([StructField(n, _json_read_type(t), True) for n, t in columns])
    key_schema = StructType([StructField(n, _json_read_type(types[n]), True) for n in keys if n in types])
    options = {"mode": "FAILFAST"}
    staged = rows.select("*", headers_map()).select(
        F.from_json(F.col("key").cast("string"), key_schema, options).alias("_bw_key"),
        F.from_json(F.col("value").cast("string"), value_schema, options).alias("_bw_value"),
        *meta_columns(),
    )
    out = []
    tombstone = F.col(layout.OP) == F.lit(OP_DELETE)
    for name, data_type in columns:
        raw = F.col("_bw_value")[name]
        if name in key_schema.fieldNames():
            raw = F.when(tombstone, F.col("_bw_key")[name]).otherwise(raw)
        converted = _json_convert(raw, data_type)
        out.append((raw if converted is None else converted).cast(data_type).alias(name))
    return staged.select(*out, *[F.col(f.name) for f in META_FIELDS])
