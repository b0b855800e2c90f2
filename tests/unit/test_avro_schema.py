"""Key and value Avro schemas of a table, and BACKWARD compatibility of ADD COLUMN."""

from __future__ import annotations

import io
from typing import Any

import fastavro
import pytest

from cdc_worker.core.encoding.avro_schema import (
    COLUMN_PROPERTY,
    TYPE_PROPERTY,
    control_value_schema,
    key_schema,
    value_schema,
)
from cdc_worker.core.encoding.avro_writer import compile_record_writer
from cdc_worker.core.model import Column, TableSchema
from cdc_worker.core.pgtypes.mapping import ColumnType, table_column_types
from cdc_worker.core.pgtypes.oids import VARHDRSZ, PgArrayType, PgType
from kafka_contract.avro_names import AVRO_NAMESPACE_PREFIX
from kafka_contract.topics import NamingError

COLUMNS = (
    Column("id", PgType.INT8, -1),
    Column("person.name/surname", PgType.VARCHAR, 40 + VARHDRSZ),
    Column("crêpes", PgType.INTERVAL, -1),
    Column("wait", PgType.INTERVAL, -1),
    Column("tags", PgArrayType.TEXT, -1),
    Column("1st", PgType.DATE, -1),
)
TABLE = TableSchema(7, "sales", "order items", COLUMNS, key_columns=("1st", "id"))


def types_of(table: TableSchema) -> tuple[ColumnType, ...]:
    return table_column_types(table, {})


def test_value_schema_names_fields_safely_and_keeps_the_original_names() -> None:
    schema = value_schema(TABLE, types_of(TABLE))
    assert schema["type"] == "record"
    assert schema["name"] == "order_20_items"
    assert schema["namespace"] == f"{AVRO_NAMESPACE_PREFIX}.sales"
    names = [f["name"] for f in schema["fields"]]
    assert names == ["id", "person_2e_name_2f_surname", "cr_c3__aa_pes", "wait", "tags", "_31_st"]
    assert [f[COLUMN_PROPERTY] for f in schema["fields"]] == [c.name for c in COLUMNS]
    assert [f["doc"] for f in schema["fields"]] == [c.name for c in COLUMNS]
    assert schema["fields"][1][TYPE_PROPERTY] == "varchar(40)"


def test_value_fields_are_nullable_with_default_null() -> None:
    for field in value_schema(TABLE, types_of(TABLE))["fields"]:
        assert field["type"][0] == "null"
        assert "default" in field and field["default"] is None


def test_key_schema_has_the_key_columns_in_key_order_not_nullable() -> None:
    schema = key_schema(TABLE, types_of(TABLE))
    assert schema is not None
    assert schema["name"] == "order_20_items" and schema["namespace"] == f"{AVRO_NAMESPACE_PREFIX}.sales"
    assert [f["name"] for f in schema["fields"]] == ["_31_st", "id"]
    assert [f["type"] for f in schema["fields"]] == [{"type": "int", "logicalType": "date"}, "long"]
    assert all("default" not in f for f in schema["fields"])


def test_unkeyed_table_has_no_key_schema() -> None:
    unkeyed = TableSchema(8, "public", "log", COLUMNS[:2])
    assert key_schema(unkeyed, types_of(unkeyed)) is None


def test_a_named_type_used_twice_is_defined_once() -> None:
    schema = value_schema(TABLE, types_of(TABLE))
    first, second = schema["fields"][2]["type"][1], schema["fields"][3]["type"][1]
    assert first["type"] == "record"
    assert second == f"{first['namespace']}.{first['name']}"
    fastavro.parse_schema(schema)  # raises on a redefined name


def test_schemas_parse_and_the_control_schema_too() -> None:
    for schema in (
        value_schema(TABLE, types_of(TABLE)),
        key_schema(TABLE, types_of(TABLE)),
        control_value_schema(),
    ):
        fastavro.parse_schema(schema)


def test_columns_that_escape_alike_are_refused() -> None:
    clash = TableSchema(9, "public", "t", (Column("a.b", PgType.TEXT, -1), Column("a_2e_b", PgType.TEXT, -1)))
    with pytest.raises(NamingError, match="rename"):
        value_schema(clash, types_of(clash))


def write(schema: dict[str, Any], column_types: tuple[ColumnType, ...], row: tuple[str | None, ...]) -> bytes:
    return compile_record_writer(schema, [t.to_avro for t in column_types])(row)


def read(data: bytes, writer: dict[str, Any], reader: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = fastavro.schemaless_reader(
        io.BytesIO(data), fastavro.parse_schema(writer), fastavro.parse_schema(reader)
    )
    return result


def test_add_column_is_backward_compatible() -> None:
    """A reader with the new schema reads data written with the old one; the new column is null."""
    old_table = TableSchema(1, "public", "t", COLUMNS[:2], key_columns=("id",))
    new_table = TableSchema(
        1, "public", "t", (*COLUMNS[:2], Column("added", PgType.NUMERIC, -1)), key_columns=("id",)
    )
    old_schema, new_schema = (
        value_schema(old_table, types_of(old_table)),
        value_schema(new_table, types_of(new_table)),
    )
    old_data = write(old_schema, types_of(old_table), ("1", "Zoë"))
    assert read(old_data, old_schema, new_schema) == {
        "id": 1,
        "person_2e_name_2f_surname": "Zoë",
        "added": None,
    }
    assert key_schema(old_table, types_of(old_table)) == key_schema(new_table, types_of(new_table))
    # And the other way round (FORWARD) holds as well: old readers ignore the new field.
    new_data = write(new_schema, types_of(new_table), ("2", None, "1.5"))
    assert read(new_data, new_schema, old_schema) == {"id": 2, "person_2e_name_2f_surname": None}
