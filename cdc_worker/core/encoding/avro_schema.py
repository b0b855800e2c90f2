"""Key and value Avro schemas of a table, per the Kafka contract (docs/types.md, "Avro schemas").

Both are records named after the table's safe name in the namespace `AVRO_NAMESPACE_PREFIX.<schema>`
(Bottled Water's convention; the key and value subjects differ, so the shared name is harmless).
Field names are the columns' safe names; the original name and the Postgres type travel as the
`pg.column` and `pg.type` properties (Avro keeps unknown properties, registries ignore them when
checking compatibility), so a consumer can map fields back to columns.

Every value field is `["null", T]` with default null: a row may carry NULL anywhere, and a column
added later can be read from old data as null, which makes ADD COLUMN a BACKWARD-compatible change.
Key fields are not nullable: a key column is never NULL.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from cdc_worker.core.model import TableSchema
from cdc_worker.core.pgtypes.mapping import AvroSchema, ColumnType
from kafka_contract.avro_names import (
    AVRO_DATATYPES_NAMESPACE,
    avro_field_names,
    avro_namespace,
    avro_record_name,
)

COLUMN_PROPERTY = "pg.column"
TYPE_PROPERTY = "pg.type"
TABLE_PROPERTY = "pg.table"
CONTROL_RECORD_NAME = "ControlEvent"
# Avro named types may be defined once per schema; later uses must refer to them by full name.
_NAMED_KINDS = frozenset({"record", "enum", "fixed"})


def value_schema(table: TableSchema, column_types: Sequence[ColumnType]) -> dict[str, Any]:
    """The value record: every column, each `["null", T]` with default null."""
    return _record(table, range(len(table.columns)), column_types, nullable=True)


def key_schema(table: TableSchema, column_types: Sequence[ColumnType]) -> dict[str, Any] | None:
    """The key record: the key columns in key order, not nullable; None for an unkeyed table."""
    if not table.is_keyed:
        return None
    return _record(table, table.key_indexes, column_types, nullable=False)


def _record(
    table: TableSchema, indexes: Sequence[int], column_types: Sequence[ColumnType], *, nullable: bool
) -> dict[str, Any]:
    if len(column_types) != len(table.columns):
        raise ValueError(f"{len(column_types)} column types for the {len(table.columns)} columns of {table}")
    columns = [table.columns[i] for i in indexes]
    field_names = avro_field_names(table, [c.name for c in columns])
    namespace = avro_namespace(table)
    defined: set[str] = set()
    fields: list[dict[str, Any]] = []
    for index, column, field_name in zip(indexes, columns, field_names, strict=True):
        column_type = column_types[index]
        avro_type = _dedupe_named(copy.deepcopy(column_type.avro_schema), namespace, defined)
        field: dict[str, Any] = {"name": field_name, "type": ["null", avro_type] if nullable else avro_type}
        if nullable:
            field["default"] = None
        field["doc"] = column.name
        field[COLUMN_PROPERTY] = column.name
        field[TYPE_PROPERTY] = column_type.pg_name
        fields.append(field)
    return {
        "type": "record",
        "name": avro_record_name(table),
        "namespace": namespace,
        TABLE_PROPERTY: table.qualified_name,
        "fields": fields,
    }


def _dedupe_named(schema: AvroSchema, namespace: str, defined: set[str]) -> AvroSchema:
    """Replace the second and later definitions of a named type by a reference to its full name."""
    if isinstance(schema, list):
        return [_dedupe_named(branch, namespace, defined) for branch in schema]
    if isinstance(schema, str):
        return schema
    kind = schema.get("type")
    if kind in _NAMED_KINDS:
        space = schema.get("namespace", namespace)
        full_name = schema["name"] if "." in schema["name"] else f"{space}.{schema['name']}"
        if full_name in defined:
            return full_name
        defined.add(full_name)
        if kind == "record":
            for field in schema["fields"]:
                field["type"] = _dedupe_named(field["type"], space, defined)
        return schema
    if kind == "array":
        schema["items"] = _dedupe_named(schema["items"], namespace, defined)
    elif kind == "map":
        schema["values"] = _dedupe_named(schema["values"], namespace, defined)
    return schema


def control_key_schema() -> str:
    """Control-topic keys are the table's qualified name."""
    return "string"


# A column of a table after a DDL command (`core.ddl.DdlColumn`).
DDL_COLUMN_SCHEMA: dict[str, Any] = {
    "type": "record",
    "name": "DdlColumn",
    "fields": [
        {"name": "name", "type": "string"},
        {"name": "type", "type": "string"},
        {"name": "base_type", "type": "string"},
        {"name": "typmod", "type": "int"},
        {"name": "array", "type": "boolean"},
        {"name": "not_null", "type": "boolean"},
    ],
}


# A progress event's offset bound of one partition (kafka_contract.control).
PROGRESS_OFFSET_SCHEMA: dict[str, Any] = {
    "type": "record",
    "name": "ProgressOffset",
    "fields": [
        {"name": "topic", "type": "string"},
        {"name": "partition", "type": "int"},
        {"name": "offset", "type": "long"},
    ],
}


def control_value_schema() -> dict[str, Any]:
    """A TRUNCATE (op "t"), a re-snapshot event (op "snapshot_progress", "snapshot_done",
    "snapshot_failed"), a DDL (op "ddl") or the worker's progress (op "progress"), with the position
    it happened at."""
    return {
        "type": "record",
        "name": CONTROL_RECORD_NAME,
        "namespace": AVRO_DATATYPES_NAMESPACE,
        "fields": [
            {"name": "op", "type": "string"},
            {"name": "schema", "type": "string"},
            {"name": "table", "type": "string"},
            {"name": "topic", "type": "string"},
            {"name": "lsn", "type": "long"},
            {"name": "seq", "type": "long"},
            {"name": "xid", "type": "long"},
            {"name": "commit_ts", "type": {"type": "long", "logicalType": "timestamp-micros"}},
            {"name": "cascade", "type": "boolean"},
            {"name": "restart_identity", "type": "boolean"},
            # Re-snapshot events (op snapshot_*); added later, so nullable with defaults.
            {"name": "snapshot_id", "type": ["null", "string"], "default": None},
            {"name": "rows", "type": ["null", "long"], "default": None},
            {"name": "reason", "type": ["null", "string"], "default": None},
            # DDL events (op ddl, --capture-ddl); added later, so nullable with defaults.
            {"name": "ddl_command", "type": ["null", "string"], "default": None},
            {"name": "ddl_object_type", "type": ["null", "string"], "default": None},
            {"name": "ddl_object_identity", "type": ["null", "string"], "default": None},
            {"name": "ddl_statement", "type": ["null", "string"], "default": None},
            {"name": "ddl_renamed_to", "type": ["null", "string"], "default": None},
            {
                "name": "ddl_columns",
                "type": ["null", {"type": "array", "items": DDL_COLUMN_SCHEMA}],
                "default": None,
            },
            # Progress events (op progress); added later, so nullable with a default.
            {
                "name": "progress_offsets",
                "type": ["null", {"type": "array", "items": PROGRESS_OFFSET_SCHEMA}],
                "default": None,
            },
        ],
    }
