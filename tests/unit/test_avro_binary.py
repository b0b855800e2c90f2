"""The compiled Avro writer against fastavro, byte for byte, on generated schemas and values."""

from __future__ import annotations

import io
import itertools
from typing import Any

import fastavro
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdc_worker.core.encoding.avro_writer import (
    VARINT_TABLE_SIZE,
    UnsupportedSchema,
    compile_keyed_writer,
    compile_record_writer,
    zigzag_long,
)

PRIMITIVE_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "boolean": st.booleans(),
    "int": st.integers(-(2**31), 2**31 - 1),
    "long": st.integers(-(2**63), 2**63 - 1),
    "float": st.floats(width=32),
    "double": st.floats(),
    "string": st.text(),
    "bytes": st.binary(),
}


def _not_union(schema: Any) -> bool:
    return not isinstance(schema, list)


# A type tree: primitives, arrays and maps of nullable items, nullable types, records. Avro forbids
# a union directly inside a union, so only non-unions are made nullable.
TYPES = st.recursive(
    st.sampled_from(sorted(PRIMITIVE_VALUES)),
    lambda inner: st.one_of(
        inner.filter(_not_union).map(lambda t: ["null", t]),
        inner.filter(_not_union).map(lambda t: {"type": "array", "items": ["null", t]}),
        inner.map(lambda t: {"type": "map", "values": t}),
        st.lists(inner, min_size=1, max_size=3).map(
            lambda ts: {"type": "record", "fields": [{"name": f"f{i}", "type": t} for i, t in enumerate(ts)]}
        ),
    ),
    max_leaves=8,
)


def name_records(schema: Any, counter: itertools.count[int]) -> Any:
    """Give every generated record a unique name, as Avro requires."""
    if isinstance(schema, list):
        return [name_records(branch, counter) for branch in schema]
    if isinstance(schema, dict):
        named = dict(schema)
        if named["type"] == "record":
            named["name"] = f"R{next(counter)}"
            named["fields"] = [{**f, "type": name_records(f["type"], counter)} for f in named["fields"]]
        elif named["type"] == "array":
            named["items"] = name_records(named["items"], counter)
        elif named["type"] == "map":
            named["values"] = name_records(named["values"], counter)
        return named
    return schema


def values_for(schema: Any) -> st.SearchStrategy[Any]:
    if isinstance(schema, list):
        return st.one_of(st.none(), values_for(schema[1]))
    if isinstance(schema, str):
        return PRIMITIVE_VALUES[schema]
    if schema["type"] == "array":
        return st.lists(values_for(schema["items"]), max_size=4)
    if schema["type"] == "map":
        return st.dictionaries(st.text(max_size=5), values_for(schema["values"]), max_size=3)
    return st.fixed_dictionaries({f["name"]: values_for(f["type"]) for f in schema["fields"]})


def fastavro_bytes(schema: dict[str, Any], record: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
    return out.getvalue()


@settings(max_examples=300, deadline=None)
@given(st.lists(TYPES, min_size=1, max_size=5), st.data())
def test_compiled_writer_matches_fastavro(field_types: list[Any], data: st.DataObject) -> None:
    counter = itertools.count()
    fields = [{"name": f"c{i}", "type": name_records(t, counter)} for i, t in enumerate(field_types)]
    schema = {"type": "record", "name": "Top", "namespace": "test.ns", "fields": fields}
    values = [data.draw(values_for(f["type"])) for f in fields]
    record = {f["name"]: v for f, v in zip(fields, values, strict=True)}
    assert compile_record_writer(schema)(values) == fastavro_bytes(schema, record)


@pytest.mark.parametrize(
    "length", [0, 1, 63, 64, VARINT_TABLE_SIZE // 2 - 1, VARINT_TABLE_SIZE // 2, 100_000]
)
def test_lengths_around_the_varint_tables(length: int) -> None:
    schema = {
        "type": "record",
        "name": "r",
        "fields": [{"name": "s", "type": ["null", "string"]}, {"name": "b", "type": "bytes"}],
    }
    values = ["é" * length, b"\x00" * length]
    assert compile_record_writer(schema)(values) == fastavro_bytes(schema, {"s": values[0], "b": values[1]})


@pytest.mark.parametrize(
    "number", [0, -1, 63, -64, 64, VARINT_TABLE_SIZE // 2 - 1, VARINT_TABLE_SIZE // 2, -(2**63), 2**63 - 1]
)
def test_longs_around_the_varint_tables(number: int) -> None:
    schema = {
        "type": "record",
        "name": "r",
        "fields": [{"name": "a", "type": "long"}, {"name": "b", "type": ["null", "long"]}],
    }
    assert compile_record_writer(schema)([number, number]) == fastavro_bytes(
        schema, {"a": number, "b": number}
    )
    assert zigzag_long(number) == fastavro_bytes(schema, {"a": number, "b": None})[:-1]


def test_named_type_used_twice_and_prefix_and_converters() -> None:
    interval = {"type": "record", "name": "I", "namespace": "x", "fields": [{"name": "m", "type": "int"}]}
    schema = {
        "type": "record",
        "name": "r",
        "namespace": "y",
        "fields": [
            {"name": "a", "type": ["null", interval]},
            {"name": "b", "type": "x.I"},
            {"name": "c", "type": ["null", "long"]},
        ],
    }
    record = {"a": {"m": 5}, "b": {"m": -5}, "c": 12}
    writer = compile_record_writer(schema, [None, None, int], prefix=b"\x00\x00\x00\x00\x07")
    assert writer([{"m": 5}, {"m": -5}, "12"]) == b"\x00\x00\x00\x00\x07" + fastavro_bytes(schema, record)


@pytest.mark.parametrize(
    "field_type",
    [
        ["string", "null"],
        ["null", "int", "string"],
        {"type": "enum", "name": "E", "symbols": ["A"]},
        {"type": "fixed", "name": "F", "size": 2},
    ],
)
def test_unsupported_constructs_are_refused_at_compile_time(field_type: Any) -> None:
    with pytest.raises(UnsupportedSchema):
        compile_record_writer({"type": "record", "name": "r", "fields": [{"name": "a", "type": field_type}]})


def test_keyed_writer_writes_the_key_and_value_records_of_one_row() -> None:
    value_schema = {
        "type": "record",
        "name": "v",
        "fields": [
            {"name": "a", "type": ["null", "long"]},
            {"name": "b", "type": ["null", "string"]},
            {"name": "c", "type": ["null", "double"]},
        ],
    }
    key_schema = {
        "type": "record",
        "name": "k",
        "fields": [{"name": "c", "type": "double"}, {"name": "a", "type": "long"}],
    }
    converters = [int, None, float]
    writer = compile_keyed_writer(
        value_schema,
        converters,
        b"\x00\x00\x00\x00\x01",
        key_schema=key_schema,
        key_fields=[2, 0],
        key_prefix=b"K",
    )
    key, value = writer(["-42", "é", "1.5"])
    assert key == b"K" + fastavro_bytes(key_schema, {"c": 1.5, "a": -42})
    assert value == b"\x00\x00\x00\x00\x01" + fastavro_bytes(value_schema, {"a": -42, "b": "é", "c": 1.5})
    with pytest.raises(TypeError):
        writer([None, "x", "1.5"])  # a NULL key column cannot be written


STRING_FIELDS = ["string", ["null", "string"], {"type": "string", "logicalType": "uuid"}]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(range(len(STRING_FIELDS))), st.none() | st.text()), min_size=1))
def test_raw_string_fields_write_the_same_bytes_as_str_fields(fields: list[tuple[int, str | None]]) -> None:
    """The fused Insert path hands string fields over as their UTF-8 bytes."""
    types = [STRING_FIELDS[kind] if value is not None else ["null", "string"] for kind, value in fields]
    schema = {
        "type": "record",
        "name": "r",
        "fields": [{"name": f"f{i}", "type": t} for i, t in enumerate(types)],
    }
    key = {"type": "record", "name": "k", "fields": [{"name": "f0", "type": "string"}]}
    row = [value for _, value in fields]
    raw_row = [None if value is None else value.encode() for value in row]
    every = range(len(row))
    assert compile_record_writer(schema, raw_strings=every)(raw_row) == compile_record_writer(schema)(row)
    if row[0] is not None:
        keyed = {"key_schema": key, "key_fields": [0], "key_prefix": b"\x00k"}
        raw_writer = compile_keyed_writer(schema, None, b"\x00v", **keyed, raw_strings=every)
        assert raw_writer(raw_row) == compile_keyed_writer(schema, None, b"\x00v", **keyed)(row)


@pytest.mark.parametrize("field_type", ["long", "bytes", {"type": "array", "items": "string"}])
def test_raw_strings_only_for_string_fields(field_type: Any) -> None:
    schema = {"type": "record", "name": "r", "fields": [{"name": "f", "type": field_type}]}
    with pytest.raises(UnsupportedSchema, match="raw bytes"):
        compile_record_writer(schema, raw_strings=[0])


def test_raw_strings_only_without_converter() -> None:
    schema = {"type": "record", "name": "r", "fields": [{"name": "f", "type": "string"}]}
    with pytest.raises(UnsupportedSchema, match="raw bytes"):
        compile_record_writer(schema, [str.upper], raw_strings=[0])
