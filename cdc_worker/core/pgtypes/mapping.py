"""Postgres type -> Avro type, JSON representation and text converters (docs/types.md).

`resolve_type` maps one (type OID, typmod) to a `ColumnType` once per relation version; the hot path
then only calls the converters it holds, never looks a type up again. Builtin types are known by
OID (`pgoids`); enums, domains, extension types (hstore, citext) and arrays of them are resolved
through the `TypeInfo`s the shell loads from `pg_type`, which must include every non-builtin type a
published column uses (and, for arrays and domains, their element and base types). A type that is
neither builtin nor in that mapping is published as its text output, like every unmapped type.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from cdc_worker.core.errors import DataError
from cdc_worker.core.model import TableSchema, TypeInfo, UnchangedToast
from cdc_worker.core.pgtypes import temporal as pgtemporal
from cdc_worker.core.pgtypes import text as pgtext
from cdc_worker.core.pgtypes.oids import (
    ARRAY_DELIMITER,
    ARRAY_DELIMITER_OVERRIDES,
    ARRAY_ELEMENT,
    PgType,
    numeric_precision_scale,
    type_modifier_suffix,
)
from kafka_contract.avro_names import AVRO_DATATYPES_NAMESPACE

# Text -> the value an encoder takes. None stands for "the text itself", so the hot path skips a call.
AvroConverter = Callable[[str], Any]
JsonConverter = Callable[[str], str]
# An Avro schema in its JSON form: a primitive's name, a complex type's object, or a union's list.
AvroSchema = str | dict[str, Any] | list[Any]

# pg_type.typtype values the mapping distinguishes.
KIND_BASE = "b"
KIND_DOMAIN = "d"
# Extension types recognised by name, whatever schema the extension was installed in.
HSTORE = "hstore"
CITEXT = "citext"
# Domains over domains are legal; a chain this long can only be a corrupt catalog.
MAX_TYPE_NESTING = 32
# money is an int64 count of cents: 19 digits.
MONEY_PRECISION = 19
VALUE_PREVIEW_LENGTH = 80

INTERVAL_RECORD_NAME = "Interval"
INTERVAL_FULL_NAME = f"{AVRO_DATATYPES_NAMESPACE}.{INTERVAL_RECORD_NAME}"


class TypeMappingError(ValueError):
    """A column type the mapping cannot handle at all (as opposed to one bad value)."""


class UnrepresentableValue(DataError, ValueError):
    """A value that cannot be published without altering it: a data error for `--on-error`."""

    def __init__(
        self, table: str, column: str, type_name: str, value: object, *, reason: str, fix: str
    ) -> None:
        preview = repr(value)
        if len(preview) > VALUE_PREVIEW_LENGTH:
            preview = preview[:VALUE_PREVIEW_LENGTH] + "…"
        super().__init__(
            f"table {table}, column {column} ({type_name}): cannot publish value {preview}: {reason}; {fix}"
        )
        self.table = table
        self.column = column
        self.type_name = type_name
        self.value = value
        self.reason = reason
        self.fix = fix


@dataclass(frozen=True)
class TypeMappingOptions:
    """Choices the type table leaves open.

    `unconstrained_numeric`: None (default) publishes `numeric` without typmod as an exact string;
    `(precision, scale)` publishes it as Avro decimal(precision, scale) instead, and a value with more
    digits than that is a data error (never rounded).
    """

    unconstrained_numeric: tuple[int, int] | None = None


DEFAULT_OPTIONS = TypeMappingOptions()


@dataclass(frozen=True, eq=False)
class ColumnType:
    """How one column type is published. `avro_schema` is the non-nullable Avro type."""

    pg_name: str
    avro_schema: AvroSchema
    to_avro: AvroConverter | None
    to_json: JsonConverter | None

    def avro_value(self, text: str) -> Any:
        return text if self.to_avro is None else self.to_avro(text)

    def json_text(self, text: str) -> str:
        return text if self.to_json is None else self.to_json(text)


def _logical(base: str, logical_type: str, **extra: int) -> dict[str, Any]:
    return {"type": base, "logicalType": logical_type, **extra}


def _decimal_schema(precision: int, scale: int) -> dict[str, Any]:
    return _logical("bytes", "decimal", precision=precision, scale=scale)


def interval_schema() -> dict[str, Any]:
    return {
        "type": "record",
        "name": INTERVAL_RECORD_NAME,
        "namespace": AVRO_DATATYPES_NAMESPACE,
        "fields": [
            {"name": "months", "type": "int"},
            {"name": "days", "type": "int"},
            {"name": "micros", "type": "long"},
        ],
    }


def _string(pg_name: str) -> ColumnType:
    return ColumnType(pg_name, "string", None, pgtext.string_json)


# Builtin types whose mapping does not depend on the typmod: Avro schema and both converters.
_FIXED: dict[int, tuple[AvroSchema, AvroConverter | None, JsonConverter | None]] = {
    PgType.BOOL: ("boolean", pgtext.BOOLEAN_VALUES.__getitem__, pgtext.BOOLEAN_JSON.__getitem__),
    PgType.INT2: ("int", int, None),
    PgType.INT4: ("int", int, None),
    PgType.INT8: ("long", int, None),
    PgType.OID: ("long", int, None),
    PgType.FLOAT4: ("float", float, pgtext.float_json),
    PgType.FLOAT8: ("double", float, pgtext.float_json),
    PgType.MONEY: (
        _decimal_schema(MONEY_PRECISION, pgtext.MONEY_SCALE), pgtext.money_to_decimal, pgtext.money_json
    ),
    PgType.BYTEA: ("bytes", pgtext.bytea_value, pgtext.bytea_json),
    PgType.UUID: (_logical("string", "uuid"), None, pgtext.quoted_json),
    PgType.JSON: ("string", None, None),
    PgType.JSONB: ("string", None, None),
    PgType.DATE: (_logical("int", "date"), pgtemporal.date_days, pgtemporal.date_json),
    PgType.TIMESTAMP: (
        _logical("long", "local-timestamp-micros"), pgtemporal.timestamp_micros, pgtemporal.timestamp_json
    ),
    PgType.TIMESTAMPTZ: (
        _logical("long", "timestamp-micros"), pgtemporal.timestamptz_micros, pgtemporal.timestamptz_json
    ),
    PgType.TIME: (_logical("long", "time-micros"), pgtemporal.time_micros, pgtemporal.time_json),
    PgType.INTERVAL: (interval_schema(), pgtemporal.interval_record, pgtemporal.interval_json),
}  # fmt: skip


_BUILTIN_OIDS = frozenset(PgType)


def resolve_type(
    type_oid: int,
    typmod: int,
    type_infos: Mapping[int, TypeInfo],
    options: TypeMappingOptions = DEFAULT_OPTIONS,
) -> ColumnType:
    """The `ColumnType` of a column of type `type_oid` with modifier `typmod`."""
    return _resolve(type_oid, typmod, type_infos, options, MAX_TYPE_NESTING)


def _resolve(
    type_oid: int, typmod: int, infos: Mapping[int, TypeInfo], options: TypeMappingOptions, depth: int
) -> ColumnType:
    if depth == 0:
        raise TypeMappingError(f"type {type_oid} nests domains or arrays deeper than {MAX_TYPE_NESTING}")
    if type_oid in ARRAY_ELEMENT:
        element = _resolve(ARRAY_ELEMENT[type_oid], typmod, infos, options, depth - 1)
        return _array(element, ARRAY_DELIMITER_OVERRIDES.get(ARRAY_ELEMENT[type_oid], ARRAY_DELIMITER))
    if type_oid in _BUILTIN_OIDS:
        return _builtin(PgType(type_oid), typmod, options)
    info = infos.get(type_oid)
    if info is None:
        return _string(f"oid {type_oid}")
    qualified = f"{info.namespace}.{info.name}"
    if info.element_oid:
        return _array(_resolve(info.element_oid, typmod, infos, options, depth - 1), ARRAY_DELIMITER)
    if info.kind == KIND_DOMAIN:
        base = _resolve(info.base_oid, info.base_typmod, infos, options, depth - 1)
        return ColumnType(qualified, base.avro_schema, base.to_avro, base.to_json)
    if info.name == HSTORE and info.kind == KIND_BASE:
        return ColumnType(
            qualified, {"type": "map", "values": ["null", "string"]}, pgtext.hstore_value, pgtext.hstore_json
        )
    # enums, citext, composites, ranges and every other type: the type's text output.
    return _string(qualified)


def _builtin(pg_type: PgType, typmod: int, options: TypeMappingOptions) -> ColumnType:
    pg_name = pg_type.name.lower() + type_modifier_suffix(pg_type, typmod)
    fixed = _FIXED.get(pg_type)
    if fixed is not None:
        return ColumnType(pg_name, *fixed)
    if pg_type == PgType.NUMERIC:
        precision_scale = numeric_precision_scale(typmod) or options.unconstrained_numeric
        if precision_scale is None:
            return ColumnType(pg_name, "string", None, pgtext.quoted_json)
        precision, scale = precision_scale
        # Avro wants 0 <= scale <= precision; numeric(3, -2) counts tens, numeric(2, 4) is all fraction.
        avro_precision, avro_scale = (precision - scale, 0) if scale < 0 else (max(precision, scale), scale)
        return ColumnType(
            pg_name,
            _decimal_schema(avro_precision, avro_scale),
            pgtext.decimal_converter(avro_precision, avro_scale),
            pgtext.quoted_json,
        )
    return _string(pg_name)


def _array(element: ColumnType, delimiter: str) -> ColumnType:
    schema = {"type": "array", "items": ["null", element.avro_schema]}
    return ColumnType(
        element.pg_name + "[]",
        schema,
        _array_to_avro(element.to_avro, delimiter),
        _array_to_json(element.to_json, delimiter),
    )


def _array_to_avro(to_item: AvroConverter | None, delimiter: str) -> AvroConverter:
    items = pgtext.array_items
    if to_item is None:
        return lambda text: items(text, delimiter)
    convert = to_item

    def converted_items(text: str) -> list[Any]:
        return [None if item is None else convert(item) for item in items(text, delimiter)]

    return converted_items


def _array_to_json(item_json: JsonConverter | None, delimiter: str) -> JsonConverter:
    items = pgtext.array_items
    convert: JsonConverter = (lambda text: text) if item_json is None else item_json

    def json_array(text: str) -> str:
        return (
            "[" + ",".join("null" if item is None else convert(item) for item in items(text, delimiter)) + "]"
        )

    return json_array


def table_column_types(
    table: TableSchema, type_infos: Mapping[int, TypeInfo], options: TypeMappingOptions = DEFAULT_OPTIONS
) -> tuple[ColumnType, ...]:
    """One `ColumnType` per column of `table`, in column order: build once per relation version."""
    return tuple(resolve_type(c.type_oid, c.typmod, type_infos, options) for c in table.columns)


def find_unrepresentable(
    table: TableSchema,
    column_names: Sequence[str],
    column_types: Sequence[ColumnType],
    values: Sequence[object],
    target: Literal["avro", "json"],
) -> UnrepresentableValue | None:
    """After a row failed to encode, the first value that cannot be converted for `target`.

    This is the slow path: the compiled encoders convert without per-column error handling and call
    this only when something raised, to say which column and value are to blame.
    """
    for name, column_type, value in zip(column_names, column_types, values, strict=True):
        if value is None or isinstance(value, UnchangedToast):
            continue
        if not isinstance(value, str):
            return UnrepresentableValue(
                table.qualified_name, name, column_type.pg_name, value,
                reason="the value is not text", fix="the worker must request pgoutput's text format",
            )  # fmt: skip
        convert = column_type.json_text if target == "json" else column_type.avro_value
        try:
            convert(value)
        except pgtext.ConversionError as exc:
            return UnrepresentableValue(
                table.qualified_name, name, column_type.pg_name, value, reason=exc.reason, fix=exc.fix
            )
        except (ValueError, KeyError, TypeError, OverflowError) as exc:
            return UnrepresentableValue(
                table.qualified_name, name, column_type.pg_name, value,
                reason=f"not valid {column_type.pg_name} text ({exc})", fix="report this value as a bug",
            )  # fmt: skip
    return None


def null_key_error(table: TableSchema, column: str, type_name: str) -> UnrepresentableValue:
    return UnrepresentableValue(
        table.qualified_name, column, type_name, None, reason="a key column is NULL",
        fix="make the replica identity index's columns NOT NULL",
    )  # fmt: skip


__all__ = [
    "DEFAULT_OPTIONS",
    "AvroConverter",
    "AvroSchema",
    "ColumnType",
    "JsonConverter",
    "TypeMappingError",
    "TypeMappingOptions",
    "UnrepresentableValue",
    "find_unrepresentable",
    "interval_schema",
    "resolve_type",
    "table_column_types",
]
