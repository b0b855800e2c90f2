"""Kafka records -> typed rows with Spark's own expressions: `from_avro`, `from_json`, no Python per record.

Same output, row for row, as the Python reference in tests/reference/decoders.py (held equal by
tests/integration/test_spark_decode.py): the table's columns, then `_bw_lsn`, `_bw_seq`, `_bw_op`,
`_bw_commit_ts`, `_bw_unchanged`, and the Kafka partition and offset.

Avro: the 5-byte Confluent frame is cut off with `substring`, and each writer schema version in the
batch decodes its own messages (`from_avro` takes one schema per call, so the batch is split by the
frame's schema id inside one projection: one pass over the records). What Spark's Avro reader maps
otherwise than the lake is given back its Avro primitive and converted (`spark_values`):
time-micros (Spark 4.1+ reads it as TIME, the lake keeps `HH:MM:SS.ffffff` text) and decimals wider
than Spark's 38 digits (exact text, computed from the two's-complement bytes). Dates and timestamps
keep their logical types and are clamped into Spark's range, as the ±infinity sentinels must be.

JSON: one `from_json` per message in FAILFAST mode, so a value of the wrong type fails the batch
instead of becoming null. Dates, timestamps and intervals are read as text and converted (the
contract's `infinity`, years outside 1..9999, ISO-8601 durations). A text column is read as a
VARIANT only to tell a JSON string from a JSON value (json/jsonb columns), which keeps Python's
`json.dumps` spelling (`{"a": 1}`, the spelling Postgres gives jsonb).

The record's envelope (headers, partition, offset, the Confluent frame) is read by `spark_envelope`;
the values converted to the lake's conventions by `spark_values`; this module decodes per format and
per writer schema version.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
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

from kafka_contract.headers import OP_DELETE
from spark_jobs.decoding.spark_envelope import (
    FRAME_BYTES,
    META_FIELDS,
    META_SQL,
    OFFSET,
    PARTITION,
    frame_check_sql,
    frame_id_literal,
    frame_id_sql,
    headers_map,
    meta_columns,
    meta_field_columns,
)
from spark_jobs.decoding.spark_types import COLUMN_PROPERTY, MAX_SPARK_DECIMAL_PRECISION
from spark_jobs.decoding.spark_values import (
    MICROS_PER_MILLI,
    clamp_sql,
    interval_from_iso,
    json_date,
    python_json_spelling,
    time_text_sql,
    wide_decimal_text_sql,
)
from spark_jobs.rules import layout
from spark_jobs.rules.names import quote, select, string

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

# A converter from what `from_avro` yields to the lake's value, as Spark SQL text over the value's
# (text) reference: a table's whole decoding is then a few expressions the JVM parses in one call
# each, where Columns cost a round trip per operator (tables are decoded by the hundred).
TextFn = Callable[[str], str]


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


def _avro_convert(schema: Any, named: dict[str, Any], namespace: str, depth: int = 0) -> TextFn | None:
    """The converter from what `from_avro` yields for this (writer) type to the lake's value; `depth`
    names the lambda variables of nested arrays and maps apart."""
    if isinstance(schema, list):
        (branch,) = [b for b in schema if b != "null"]
        return _avro_convert(branch, named, namespace, depth)
    if isinstance(schema, str):
        full = schema if "." in schema else f"{namespace}.{schema}" if namespace else schema
        target = named.get(full, named.get(schema))
        return None if target is None else _avro_convert(target, named, namespace, depth)
    kind, logical = schema["type"], schema.get("logicalType")
    if kind == "record":
        space = schema.get("namespace", namespace)
        name = schema["name"]
        named[name if "." in name else f"{space}.{name}" if space else name] = schema
        fields = [(f["name"], _avro_convert(f["type"], named, space, depth)) for f in schema["fields"]]
        if all(c is None for _, c in fields):
            return None

        def record(c: str) -> str:
            refs = [(n, f"{c}.{quote(n)}", fn) for n, fn in fields]
            parts = [f"{string(n)}, {fn(ref) if fn else ref}" for n, ref, fn in refs]
            return f"CASE WHEN {c} IS NOT NULL THEN named_struct({', '.join(parts)}) END"

        return record
    if logical == "date":
        return lambda c: clamp_sql(c, DateType())
    if logical in ("timestamp-micros", "timestamp-millis"):
        return lambda c: clamp_sql(c, TimestampType())
    if logical in ("local-timestamp-micros", "local-timestamp-millis"):
        return lambda c: clamp_sql(c, TimestampNTZType())
    if logical in ("time-micros", "time-millis"):
        scale = 1 if logical == "time-micros" else MICROS_PER_MILLI
        return lambda c: f"CASE WHEN {c} IS NOT NULL THEN {time_text_sql(f'({c} * {scale})')} END"
    if logical == "decimal" and int(schema["precision"]) > MAX_SPARK_DECIMAL_PRECISION:
        scale_digits = int(schema.get("scale", 0))
        return lambda c: wide_decimal_text_sql(c, scale_digits)
    item_var = f"bw_x{depth}"
    if kind == "array":
        item = _avro_convert(schema["items"], named, namespace, depth + 1)
        return None if item is None else (lambda c: f"transform({c}, {item_var} -> {item(item_var)})")
    if kind == "map":
        value = _avro_convert(schema["values"], named, namespace, depth + 1)
        return (
            None
            if value is None
            else (lambda c: f"transform_values({c}, (bw_k{depth}, {item_var}) -> {value(item_var)})")
        )
    return None


def _avro_fields(schema: dict[str, Any]) -> dict[str, tuple[str, TextFn | None]]:
    """Postgres column name -> (Avro field name, converter) of one writer schema version."""
    named: dict[str, Any] = {}
    namespace = schema.get("namespace", "")
    return {
        f.get(COLUMN_PROPERTY, f["name"]): (f["name"], _avro_convert(f["type"], named, namespace))
        for f in schema["fields"]
    }


def _decoded_versions(part: str, schemas: dict[int, dict[str, Any]]) -> list[str]:
    """One struct column per writer schema version, as Spark SQL text: its messages decoded, null on
    the others."""
    payload = f"substring({part}, {FRAME_BYTES + 1})"
    return [
        f"CASE WHEN {part} IS NOT NULL AND {frame_id_sql(part)} = {frame_id_literal(schema_id)}"
        f" THEN from_avro({payload}, {string(json.dumps(reader_schema(schema)))}) END"
        f" AS {quote(f'_bw_{part}_{schema_id}')}"
        for schema_id, schema in sorted(schemas.items())
    ]


@dataclass(frozen=True)
class AvroDecoding:
    """A table's Avro decoding as Spark SQL text: `decoded` (each writer schema version decoded, the
    frame checks) and the metadata, kept where `checked` holds, then `picked` (the table's columns,
    then the metadata). `staged` reads the metadata from the records' headers map (`HEADERS_MAP_SQL`,
    `META_SQL`); `sql` takes records that carry it (`spark_envelope.with_metadata`). Text, so that
    it is a few JVM calls per table, or one statement."""

    decoded: list[str]
    checked: str
    picked: list[str | Column]

    @property
    def staged(self) -> list[str]:
        return [*self.decoded, *META_SQL]

    def sql(self, records: str) -> str | None:
        """The whole decoding as one SELECT over `records` (a relation: a quoted view name or a
        parenthesized query), analyzed by the JVM once; None when a column is cast as a Column
        (`_picked`: nested types). The records carry their metadata columns already
        (`spark_envelope.with_metadata`: read from the headers once for many tables' statements,
        `changelog_tail.tails`)."""
        if not all(isinstance(p, str) for p in self.picked):
            return None
        staged = select([*self.decoded, *(quote(f.name) for f in META_FIELDS)], records)
        return select(map(str, self.picked), f"({staged})", where=self.checked)


def avro_decoding(
    key_schemas: dict[int, dict[str, Any]],
    value_schemas: dict[int, dict[str, Any]],
    columns: Sequence[tuple[str, DataType]],
    *,
    positions: bool = True,
) -> AvroDecoding:
    """A table topic's Avro records -> the table's columns (the union over the writer schema versions,
    each value cast to the column's type) and the metadata columns (`_selected`)."""
    versions = {
        part: {sid: _avro_fields(schema) for sid, schema in schemas.items()}
        for part, schemas in (("key", key_schemas), ("value", value_schemas))
    }

    def from_versions(part: str, name: str) -> list[tuple[str, TextFn | None]]:
        """The column's field in each writer schema version that has it, with its converter."""
        return [
            (f"{quote(f'_bw_{part}_{schema_id}')}.{quote(fields[name][0])}", fields[name][1])
            for schema_id, fields in sorted(versions[part].items())
            if name in fields
        ]

    decoded = [
        *_decoded_versions("key", key_schemas),
        *_decoded_versions("value", value_schemas),
        f"{frame_check_sql('key', list(key_schemas))} AS _bw_key_check",
        f"{frame_check_sql('value', list(value_schemas))} AS _bw_value_check",
    ]
    picked = [
        _picked(name, data_type, from_versions("key", name), from_versions("value", name))
        for name, data_type in columns
    ]
    meta = [quote(name) for name in metadata_names(positions)]
    return AvroDecoding(decoded, "coalesce(`_bw_key_check`, `_bw_value_check`) IS NULL", [*picked, *meta])


def decode_avro(
    rows: DataFrame,
    key_schemas: dict[int, dict[str, Any]],
    value_schemas: dict[int, dict[str, Any]],
    columns: Sequence[tuple[str, DataType]],
    *,
    positions: bool = True,
) -> DataFrame:
    """`avro_decoding` applied to the records `rows`."""
    from pyspark.sql import functions as F

    decoding = avro_decoding(key_schemas, value_schemas, columns, positions=positions)
    checked = rows.select("*", headers_map()).selectExpr(*decoding.staged).where(decoding.checked)
    if all(isinstance(p, str) for p in decoding.picked):
        return checked.selectExpr(*[str(p) for p in decoding.picked])
    return checked.select(*[F.expr(p) if isinstance(p, str) else p for p in decoding.picked])


def metadata_names(positions: bool) -> list[str]:
    """The metadata columns the decoders select after the table's columns (`_selected`)."""
    return [f.name for f in META_FIELDS if _selected(f.name, positions)]


def _selected(meta_field: str, positions: bool) -> bool:
    """Whether the decoders select this metadata field: the record's Kafka partition and offset only
    with `positions` (only an unkeyed table's rows need them, as their identity; leaving them out
    here spares the caller a projection of its own to drop them)."""
    return positions or meta_field not in (PARTITION, OFFSET)


def _metadata(positions: bool) -> list[Column]:
    """The metadata columns the decoders select last (`_selected`)."""
    return [c for f, c in zip(META_FIELDS, meta_field_columns(), strict=True) if _selected(f.name, positions)]


def _picked(
    name: str,
    data_type: DataType,
    key_fields: list[tuple[str, TextFn | None]],
    value_fields: list[tuple[str, TextFn | None]],
) -> str | Column:
    """One decoded column: the key's field on a delete, the value's otherwise, cast to the column's
    type. Spark SQL text (one round trip to the JVM; tables are read by the hundred), except that a
    nested type is cast as a Column: its SQL name would lose its fields' nullability."""
    from pyspark.sql import functions as F

    key_text, value_text = _coalesced_text(key_fields), _coalesced_text(value_fields)
    if key_text is not None and value_text is not None:
        value_text = (
            f"CASE WHEN {quote(layout.OP)} = {string(OP_DELETE)} THEN {key_text} ELSE {value_text} END"
        )
    text = value_text if value_text is not None else key_text if key_text is not None else "NULL"
    if isinstance(data_type, (StructType, ArrayType, MapType)):
        return F.expr(text).cast(data_type).alias(name)
    return f"CAST({text} AS {sql_type(data_type)}) AS {quote(name)}"


def sql_type(data_type: DataType) -> str:
    """The type's name in Spark SQL; a timestamp spelled with its time zone, since a bare `timestamp`
    follows the session's `spark.sql.timestampType`."""
    return "timestamp_ltz" if isinstance(data_type, TimestampType) else data_type.simpleString()


def _coalesced_text(fields: list[tuple[str, TextFn | None]]) -> str | None:
    values = [convert(ref) if convert else ref for ref, convert in fields]
    return None if not values else values[0] if len(values) == 1 else f"coalesce({', '.join(values)})"


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


def _json_needs_conversion(data_type: DataType) -> bool:
    if isinstance(data_type, ArrayType):
        return _json_needs_conversion(data_type.elementType)
    if isinstance(data_type, MapType):
        return _json_needs_conversion(data_type.valueType)
    return isinstance(data_type, (StringType, DateType, TimestampType, TimestampNTZType, StructType))


def _json_convert(column: Column, data_type: DataType) -> Column | None:
    from pyspark.sql import functions as F

    if isinstance(data_type, StringType):
        is_text = F.schema_of_variant(column) == F.lit("STRING")
        raw = python_json_spelling(F.to_json(column))
        return (
            F.when(column.isNull() | F.is_variant_null(column), F.lit(None).cast("string"))
            .when(is_text, F.variant_get(column, "$", "string"))
            .otherwise(raw)
        )
    if isinstance(data_type, (DateType, TimestampType, TimestampNTZType)):
        return json_date(column, data_type)
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


def decode_json(
    rows: DataFrame, keys: Sequence[str], columns: Sequence[tuple[str, DataType]], *, positions: bool = True
) -> DataFrame:
    """A table topic's JSON records -> the given columns (types from the lake or catalog) and metadata
    (`_metadata`)."""
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
    return staged.select(*out, *_metadata(positions))
