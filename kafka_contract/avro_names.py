"""Avro names of the Kafka contract: record name = the table's safe name, namespace = a fixed prefix
plus the safe schema name (docs/types.md, "Avro schemas"), field names = safe column names. Same
escape as topics.
"""

from __future__ import annotations

from collections.abc import Iterable

from kafka_contract.topics import NamingError, SourceTable, safe_name

# Bottled Water's namespace for generated table schemas, kept so that Avro readers written for it
# still resolve our records.
AVRO_NAMESPACE_PREFIX = "com.martinkl.bottledwater.dbschema"
# Namespace of the named helper types that several tables share (the interval record, the control
# event), so that they do not clash with a table that happens to be called `interval`.
AVRO_DATATYPES_NAMESPACE = "com.martinkl.bottledwater.datatypes"


def avro_record_name(table: SourceTable) -> str:
    """The Avro record name of the table's key and value schemas: its safe name."""
    return safe_name(table.name)


def avro_namespace(table: SourceTable) -> str:
    """The Avro namespace of the table's schemas: the fixed prefix plus the safe schema name."""
    return f"{AVRO_NAMESPACE_PREFIX}.{safe_name(table.namespace)}"


def avro_field_names(table: SourceTable, column_names: Iterable[str]) -> list[str]:
    """Safe Avro field names for `column_names` of `table`, refusing two columns that escape alike."""
    seen: dict[str, str] = {}
    names: list[str] = []
    for column in column_names:
        field = safe_name(column)
        if field in seen:
            raise NamingError(
                f"columns {seen[field]!r} and {column!r} of table {table.qualified_name} both become the "
                f"Avro field name {field!r}: rename one of them"
            )
        seen[field] = column
        names.append(field)
    return names
