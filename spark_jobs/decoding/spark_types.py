"""Avro writer schemas and Postgres column types -> the lake's Spark types.

The lake's types (docs/lakehouse.md, "Table layout"), carried over from the worker's Avro mapping
(docs/types.md, "The mapping, with an example per type"):

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

Dates and timestamps beyond Spark's range (the worker's ±infinity sentinels) become its ends,
`SPARK_MIN_*`/`SPARK_MAX_*`. Types only: the values are converted by Spark's own expressions
(`spark_values`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
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

from kafka_contract.headers import MICROS_PER_SECOND, SECONDS_PER_DAY
from spark_jobs.errors import DataError

MAX_SPARK_DECIMAL_PRECISION = 38
COLUMN_PROPERTY = "pg.column"
TABLE_PROPERTY = "pg.table"
# The worker writes ±infinity dates and timestamps as the ends of Avro's int and long ranges. Spark
# can store those numbers but no client can read them back (Python's datetime stops at year 9999),
# so the lake holds the first and last instants Spark can format instead (docs/lakehouse.md).
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
SPARK_MIN_DAYS = (datetime(1, 1, 1, tzinfo=UTC) - _EPOCH).days
SPARK_MAX_DAYS = (datetime(9999, 12, 31, tzinfo=UTC) - _EPOCH).days
SPARK_MIN_MICROS = SPARK_MIN_DAYS * SECONDS_PER_DAY * MICROS_PER_SECOND
SPARK_MAX_MICROS = (SPARK_MAX_DAYS + 1) * SECONDS_PER_DAY * MICROS_PER_SECOND - 1
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
TIMESTAMP_LOGICAL = ("timestamp-micros", "timestamp-millis")
LOCAL_TIMESTAMP_LOGICAL = ("local-timestamp-micros", "local-timestamp-millis")
TIME_LOGICAL = ("time-micros", "time-millis")


class SchemaMappingError(DataError, ValueError):
    """An Avro schema the lake cannot represent; the text names the field and the fix."""


@dataclass(frozen=True)
class ColumnSpec:
    """One column of a decoded table: its Postgres name, Avro field name and Spark type."""

    name: str
    field: str
    data_type: DataType


def decimal_type(precision: int, scale: int) -> DataType:
    """decimal(p, s) as Spark holds it; wider than Spark's 38 digits -> exact text."""
    if precision > MAX_SPARK_DECIMAL_PRECISION:
        return StringType()
    return DecimalType(precision, scale)


def resolve(schema: Any, named: dict[str, Any], namespace: str) -> tuple[Any, str]:
    """The Avro type `schema` stands for: a nullable union's one branch and a name's definition
    followed, a named type's definition kept in `named` for later references; with the namespace
    its own names are in. A primitive comes back as its name, every other type as its dict."""
    if isinstance(schema, list):
        branches = [b for b in schema if b != "null"]
        if len(branches) != 1:
            raise SchemaMappingError(f'union {schema} is not ["null", T]: the lake maps only nullable T')
        return resolve(branches[0], named, namespace)
    if isinstance(schema, str):
        if schema in _PRIMITIVES:
            return schema, namespace
        full = schema if "." in schema else f"{namespace}.{schema}" if namespace else schema
        if full in named:
            return resolve(named[full], named, namespace)
        if schema in named:
            return resolve(named[schema], named, namespace)
        raise SchemaMappingError(f"unknown Avro type {schema!r}")
    if schema["type"] in ("record", "enum", "fixed"):
        space = schema.get("namespace", namespace)
        name = schema["name"]
        named[name if "." in name else f"{space}.{name}" if space else name] = schema
        return schema, space
    return schema, namespace


def avro_type(schema: Any, named: dict[str, Any], namespace: str = "") -> DataType:
    """The Spark type of an Avro type."""
    node, namespace = resolve(schema, named, namespace)
    if isinstance(node, str):
        return _PRIMITIVES[node]
    kind = node["type"]
    logical = node.get("logicalType")
    if kind == "enum":
        return StringType()
    if kind == "fixed":
        return BinaryType()
    if kind == "record":
        return StructType(
            [StructField(f["name"], avro_type(f["type"], named, namespace), True) for f in node["fields"]]
        )
    if logical == "decimal":
        return decimal_type(int(node["precision"]), int(node.get("scale", 0)))
    if logical == "date":
        return DateType()
    if logical in TIMESTAMP_LOGICAL:
        return TimestampType()
    if logical in LOCAL_TIMESTAMP_LOGICAL:
        return TimestampNTZType()
    if logical in TIME_LOGICAL:
        return StringType()
    if kind == "array":
        return ArrayType(avro_type(node["items"], named, namespace), True)
    if kind == "map":
        return MapType(StringType(), avro_type(node["values"], named, namespace), True)
    return avro_type(kind, named, namespace)


def record_columns(schema: dict[str, Any]) -> list[ColumnSpec]:
    """The columns of a table's key or value record, named by `pg.column` (the Postgres name)."""
    if schema.get("type") != "record":
        raise SchemaMappingError(f"a table's key and value schemas are records, not {schema.get('type')!r}")
    named: dict[str, Any] = {}
    namespace = schema.get("namespace", "")
    return [
        ColumnSpec(
            field.get(COLUMN_PROPERTY, field["name"]),
            field["name"],
            avro_type(field["type"], named, namespace),
        )
        for field in schema["fields"]
    ]


def infer_json_type(samples: list[Any]) -> DataType:
    """The type of a column known only from JSON sample values (no catalog, not yet in the lake):
    booleans, integers (bigint), numbers with a fraction anywhere (double), else text. A float8
    column whose sample holds only whole numbers is typed bigint, which is why --postgres is the
    exact way to type JSON topics."""
    kinds = {type(v) for v in samples}
    if kinds == {bool}:
        return BooleanType()
    if kinds == {int}:
        return LongType()
    if kinds and kinds <= {int, float}:
        return DoubleType()
    return StringType()


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
