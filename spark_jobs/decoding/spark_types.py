"""Avro writer schemas and Postgres column types -> Spark types, plus the value converters.

DESIGN.md's type table, carried into the lake:

| Avro (Postgres) | Spark |
| --- | --- |
| boolean, int, long, float, double, bytes, string | the same |
| bytes decimal(p, s) (numeric(p, s), money) | DecimalType(p, s); p > 38 -> StringType, exact |
| int date | DateType |
| long timestamp-micros (timestamptz) | TimestampType |
| long local-timestamp-micros (timestamp) | TimestampNTZType |
| long time-micros (time) | StringType `HH:MM:SS.ffffff` (Delta has no time type) |
| Interval record | struct<months:int, days:int, micros:bigint> |
| array, map | ArrayType, MapType(string, ...) |
| string uuid, enum, everything else | StringType |

The decoders read Avro with date/time logical types stripped, so those arrive as plain integers and
go to Arrow as integers (no datetime objects per value); the converters clamp the ±infinity
sentinels into Spark's range.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from spark_jobs import wire

Converter = Callable[[Any], Any]
MAX_SPARK_DECIMAL_PRECISION = 38
COLUMN_PROPERTY = "pg.column"
TABLE_PROPERTY = "pg.table"
# Logical types the decoders strip so that the values arrive as the integers Arrow takes directly.
_STRIPPED_LOGICAL = frozenset(
    {
        "date",
        "timestamp-micros",
        "local-timestamp-micros",
        "time-micros",
        "timestamp-millis",
        "local-timestamp-millis",
        "time-millis",
    }
)
INTERVAL_TYPE = StructType(
    [
        StructField("months", IntegerType()),
        StructField("days", IntegerType()),
        StructField("micros", LongType()),
    ]
)
_PRIMITIVES: dict[str, DataType] = {
    "boolean": BooleanType(),
    "int": IntegerType(),
    "long": LongType(),
    "float": FloatType(),
    "double": DoubleType(),
    "bytes": BinaryType(),
    "string": StringType(),
}
MILLIS = 1000


class SchemaMappingError(ValueError):
    """An Avro schema the lake cannot represent; the text names the field and the fix."""


@dataclass(frozen=True)
class ColumnSpec:
    """One column of a decoded table: its Postgres name, Avro field name, Spark type, converter."""

    name: str
    field: str
    data_type: DataType
    convert: Converter | None


def decimal_type(precision: int, scale: int) -> DataType:
    """decimal(p, s) as Spark holds it; wider than Spark's 38 digits -> exact text."""
    if precision > MAX_SPARK_DECIMAL_PRECISION:
        return StringType()
    return DecimalType(precision, scale)


def _decimal_text(value: Decimal) -> str:
    return format(value, "f")


def _each(convert: Converter) -> Converter:
    def convert_items(items: list[Any]) -> list[Any]:
        return [None if item is None else convert(item) for item in items]

    return convert_items


def _each_value(convert: Converter) -> Converter:
    def convert_values(mapping: dict[str, Any]) -> dict[str, Any]:
        return {k: None if v is None else convert(v) for k, v in mapping.items()}

    return convert_values


def avro_type(schema: Any, named: dict[str, Any], namespace: str = "") -> tuple[DataType, Converter | None]:
    """The Spark type of an Avro type, and the converter from its stripped-logical-type decoding."""
    if isinstance(schema, list):
        branches = [b for b in schema if b != "null"]
        if len(branches) != 1:
            raise SchemaMappingError(f'union {schema} is not ["null", T]: the lake maps only nullable T')
        return avro_type(branches[0], named, namespace)
    if isinstance(schema, str):
        if schema in _PRIMITIVES:
            return _PRIMITIVES[schema], None
        full = schema if "." in schema else f"{namespace}.{schema}" if namespace else schema
        if full in named:
            return avro_type(named[full], named, namespace)
        if schema in named:
            return avro_type(named[schema], named, namespace)
        raise SchemaMappingError(f"unknown Avro type {schema!r}")
    kind = schema["type"]
    logical = schema.get("logicalType")
    if kind in ("record", "enum", "fixed"):
        space = schema.get("namespace", namespace)
        name = schema["name"]
        named[name if "." in name else f"{space}.{name}" if space else name] = schema
        if kind == "enum":
            return StringType(), None
        if kind == "fixed":
            return BinaryType(), None
        return _record_type(schema, named, space)
    if logical == "decimal":
        precision, scale = int(schema["precision"]), int(schema.get("scale", 0))
        mapped = decimal_type(precision, scale)
        return mapped, (_decimal_text if isinstance(mapped, StringType) else None)
    if logical == "date":
        return DateType(), wire.clamp_days
    if logical in ("timestamp-micros", "timestamp-millis"):
        scale = 1 if logical == "timestamp-micros" else MILLIS
        return TimestampType(), (lambda v: wire.clamp_micros(v * scale))
    if logical in ("local-timestamp-micros", "local-timestamp-millis"):
        scale = 1 if logical == "local-timestamp-micros" else MILLIS
        return TimestampNTZType(), (lambda v: wire.clamp_micros(v * scale))
    if logical in ("time-micros", "time-millis"):
        scale = 1 if logical == "time-micros" else MILLIS
        return StringType(), (lambda v: wire.time_text(v * scale))
    if kind == "array":
        item_type, convert = avro_type(schema["items"], named, namespace)
        return ArrayType(item_type, True), (None if convert is None else _each(convert))
    if kind == "map":
        value_type, convert = avro_type(schema["values"], named, namespace)
        return MapType(StringType(), value_type, True), (None if convert is None else _each_value(convert))
    return avro_type(kind, named, namespace)


def _record_type(
    schema: dict[str, Any], named: dict[str, Any], namespace: str
) -> tuple[DataType, Converter | None]:
    fields: list[StructField] = []
    converters: dict[str, Converter] = {}
    for field in schema["fields"]:
        field_type, convert = avro_type(field["type"], named, namespace)
        fields.append(StructField(field["name"], field_type, True))
        if convert is not None:
            converters[field["name"]] = convert
    if not converters:
        return StructType(fields), None

    def convert_record(record: dict[str, Any]) -> dict[str, Any]:
        return {k: (converters[k](v) if k in converters and v is not None else v) for k, v in record.items()}

    return StructType(fields), convert_record


def record_columns(schema: dict[str, Any]) -> list[ColumnSpec]:
    """The columns of a table's key or value record, named by `pg.column` (the Postgres name)."""
    if schema.get("type") != "record":
        raise SchemaMappingError(f"a table's key and value schemas are records, not {schema.get('type')!r}")
    named: dict[str, Any] = {}
    namespace = schema.get("namespace", "")
    columns = []
    for field in schema["fields"]:
        data_type, convert = avro_type(field["type"], named, namespace)
        columns.append(
            ColumnSpec(field.get(COLUMN_PROPERTY, field["name"]), field["name"], data_type, convert)
        )
    return columns


def strip_logical_types(schema: Any) -> Any:
    """A copy of `schema` without date/time logical types: fastavro then yields their integers."""
    stripped = copy.deepcopy(schema)

    def walk(node: Any) -> Any:
        if isinstance(node, list):
            return [walk(n) for n in node]
        if not isinstance(node, dict):
            return node
        if node.get("logicalType") in _STRIPPED_LOGICAL:
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


# --- Postgres catalog types (JSON topics, schema drift, reconciliation) ---------------------------

_PG_TYPES: dict[str, DataType] = {
    "bool": BooleanType(),
    "int2": IntegerType(),
    "int4": IntegerType(),
    "int8": LongType(),
    "oid": LongType(),
    "float4": FloatType(),
    "float8": DoubleType(),
    "bytea": BinaryType(),
    "date": DateType(),
    "timestamp": TimestampNTZType(),
    "timestamptz": TimestampType(),
    "interval": INTERVAL_TYPE,
    "money": DecimalType(19, 2),
}
HSTORE = "hstore"


def pg_type(
    type_name: str, numeric_typmod: tuple[int, int] | None = None, *, array: bool = False
) -> DataType:
    """The Spark type of a Postgres column: `type_name` is the base type's pg_type.typname (domains
    resolved, the element's name for arrays); numeric's (precision, scale) when it has a typmod."""
    if type_name == "numeric":
        if numeric_typmod is None:
            base: DataType = StringType()
        else:
            precision, scale = numeric_typmod
            # Avro wants 0 <= scale <= precision; the worker maps numeric(3,-2) and numeric(2,4) so too.
            base = (
                decimal_type(precision - scale, 0)
                if scale < 0
                else decimal_type(max(precision, scale), scale)
            )
    elif type_name == HSTORE:
        base = MapType(StringType(), StringType(), True)
    else:
        base = _PG_TYPES.get(type_name, StringType())
    return ArrayType(base, True) if array else base
