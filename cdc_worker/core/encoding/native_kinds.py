"""The native codec's column kinds: for each column, the family of conversions the Rust side
applies (`int`, `decimal:P:S`, `timestamptz`, `array:,:text`, ...), derived step for step as
`mapping.resolve_type` resolves the type, and checked against what the reference's `ColumnType`
holds, so that a change of the reference mapping sends the relation to the Python path instead of
to wrong bytes."""

from __future__ import annotations

from collections.abc import Mapping

from cdc_worker.core.model import TableSchema, TypeInfo
from cdc_worker.core.pgtypes import temporal, text
from cdc_worker.core.pgtypes.mapping import (
    DEFAULT_OPTIONS,
    HSTORE,
    KIND_BASE,
    KIND_DOMAIN,
    MAX_TYPE_NESTING,
    ColumnType,
    TypeMappingOptions,
    resolve_type,
)
from cdc_worker.core.pgtypes.oids import (
    ARRAY_DELIMITER,
    ARRAY_DELIMITER_OVERRIDES,
    ARRAY_ELEMENT,
    PgType,
    numeric_precision_scale,
)


class UnsupportedColumn(ValueError):
    """A column the native codec does not encode: its relation stays on the Python path."""


_FIXED_KINDS: dict[int, str] = {
    PgType.BOOL: "bool",
    PgType.INT2: "int",
    PgType.INT4: "int",
    PgType.INT8: "int",
    PgType.OID: "int",
    PgType.FLOAT4: "float4",
    PgType.FLOAT8: "float8",
    PgType.MONEY: "money",
    PgType.BYTEA: "bytea",
    PgType.UUID: "quoted",
    PgType.JSON: "raw",
    PgType.JSONB: "raw",
    PgType.DATE: "date",
    PgType.TIMESTAMP: "timestamp",
    PgType.TIMESTAMPTZ: "timestamptz",
    PgType.TIME: "time",
    PgType.INTERVAL: "interval",
}
_BUILTIN_OIDS = frozenset(PgType)
# What the reference's ColumnType holds for each kind: (to_avro, to_json); checked at compile time,
# so that a change of the reference mapping sends the relation to the Python path, never to wrong
# bytes.
_REFERENCE_CONVERTERS: dict[str, tuple[object, object]] = {
    "bool": (text.BOOLEAN_VALUES.__getitem__, text.BOOLEAN_JSON.__getitem__),
    "int": (int, None),
    "float4": (float, text.float_json),
    "float8": (float, text.float_json),
    "money": (text.money_to_decimal, text.money_json),
    "bytea": (text.bytea_value, text.bytea_json),
    "quoted": (None, text.quoted_json),
    "raw": (None, None),
    "text": (None, text.string_json),
    "date": (temporal.date_days, temporal.date_json),
    "timestamp": (temporal.timestamp_micros, temporal.timestamp_json),
    "timestamptz": (temporal.timestamptz_micros, temporal.timestamptz_json),
    "time": (temporal.time_micros, temporal.time_json),
    "interval": (temporal.interval_record, temporal.interval_json),
    "hstore": (text.hstore_value, text.hstore_json),
}
_FLOAT_SCHEMAS = {"float4": "float", "float8": "double"}


def _array_kind(element: str, delimiter: str) -> str:
    if element.startswith("array:"):
        raise UnsupportedColumn("an array whose elements are arrays (a domain over an array type)")
    return f"array:{delimiter}:{element}"


def _kind(
    type_oid: int, typmod: int, infos: Mapping[int, TypeInfo], options: TypeMappingOptions, depth: int
) -> str:
    """`mapping._resolve`, step for step, naming the family instead of building converters."""
    if depth == 0:
        raise UnsupportedColumn(f"type {type_oid} nests domains or arrays deeper than {MAX_TYPE_NESTING}")
    if type_oid in ARRAY_ELEMENT:
        element_oid = ARRAY_ELEMENT[type_oid]
        element = _kind(element_oid, typmod, infos, options, depth - 1)
        return _array_kind(element, ARRAY_DELIMITER_OVERRIDES.get(element_oid, ARRAY_DELIMITER))
    if type_oid in _BUILTIN_OIDS:
        fixed = _FIXED_KINDS.get(type_oid)
        if fixed is not None:
            return fixed
        if type_oid != PgType.NUMERIC:
            return "text"
        precision_scale = numeric_precision_scale(typmod) or options.unconstrained_numeric
        if precision_scale is None:
            return "quoted"
        precision, scale = precision_scale
        avro_precision, avro_scale = (precision - scale, 0) if scale < 0 else (max(precision, scale), scale)
        return f"decimal:{avro_precision}:{avro_scale}"
    info = infos.get(type_oid)
    if info is None:
        return "text"
    if info.element_oid:
        return _array_kind(_kind(info.element_oid, typmod, infos, options, depth - 1), ARRAY_DELIMITER)
    if info.kind == KIND_DOMAIN:
        return _kind(info.base_oid, info.base_typmod, infos, options, depth - 1)
    if info.name == HSTORE and info.kind == KIND_BASE:
        return "hstore"
    return "text"


def _check_scalar(kind: str, reference: ColumnType) -> bool:
    if kind.startswith("decimal:"):
        _, precision, scale = kind.split(":")
        schema = {"type": "bytes", "logicalType": "decimal", "precision": int(precision), "scale": int(scale)}
        return reference.avro_schema == schema and reference.to_json is text.quoted_json
    to_avro, to_json = _REFERENCE_CONVERTERS[kind]
    if kind in _FLOAT_SCHEMAS and reference.avro_schema != _FLOAT_SCHEMAS[kind]:
        return False
    # Identity for functions; == for the bound dict methods of bool (a new object at every access).
    return reference.to_avro == to_avro and reference.to_json == to_json


def _element_oid(type_oid: int, infos: Mapping[int, TypeInfo]) -> int:
    if type_oid in ARRAY_ELEMENT:
        return int(ARRAY_ELEMENT[type_oid])
    info = infos.get(type_oid)
    return info.element_oid if info is not None else 0


def _checked_kind(
    type_oid: int, typmod: int, infos: Mapping[int, TypeInfo], options: TypeMappingOptions
) -> str:
    """The column's kind, checked against the reference's own `resolve_type`."""
    kind = _kind(type_oid, typmod, infos, options, MAX_TYPE_NESTING)
    reference = resolve_type(type_oid, typmod, infos, options)
    # Domains resolve to their base type's converters: follow them to the array or the scalar.
    oid, mod = type_oid, typmod
    for _ in range(MAX_TYPE_NESTING):
        info = infos.get(oid)
        if oid in _BUILTIN_OIDS or info is None or info.kind != KIND_DOMAIN:
            break
        oid, mod = info.base_oid, info.base_typmod
    if kind.startswith("array:"):
        element = kind[len("array:") + 2 :]
        element_reference = resolve_type(_element_oid(oid, infos), mod, infos, options)
        schema = {"type": "array", "items": ["null", element_reference.avro_schema]}
        good = reference.avro_schema == schema and _check_scalar(element, element_reference)
    else:
        good = _check_scalar(kind, reference)
    if not good:
        raise UnsupportedColumn(f"type {type_oid} ({reference.pg_name}): the reference maps it otherwise")
    return kind


def native_column_kinds(
    table: TableSchema, type_infos: Mapping[int, TypeInfo], options: TypeMappingOptions = DEFAULT_OPTIONS
) -> list[str]:
    """The native kind of every column of `table`; `UnsupportedColumn` says why one has none."""
    return [_checked_kind(c.type_oid, c.typmod, type_infos, options) for c in table.columns]
