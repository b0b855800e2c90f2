"""The reference decoder's value converters: what fastavro yields for an Avro type, read with its
date/time logical types stripped (plain integers, no datetime objects per value, which Arrow takes
directly) -> the value the lake holds. The types themselves are the production mapping's
(`spark_jobs.decoding.spark_types`)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from pyspark.sql.types import StringType

from spark_jobs.decoding.spark_types import (
    COLUMN_PROPERTY,
    LOCAL_TIMESTAMP_LOGICAL,
    TIME_LOGICAL,
    TIMESTAMP_LOGICAL,
    decimal_type,
    resolve,
)
from tests.reference import wire

Converter = Callable[[Any], Any]
MILLIS = 1000
# Logical types stripped so that the values arrive as the integers Arrow takes directly.
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


def _scale(logical: str) -> int:
    return MILLIS if logical.endswith("-millis") else 1


def avro_converter(schema: Any, named: dict[str, Any], namespace: str = "") -> Converter | None:
    """The converter of an Avro type's stripped-logical-type decoding (None: the value as is)."""
    node, namespace = resolve(schema, named, namespace)
    if isinstance(node, str) or node["type"] in ("enum", "fixed"):
        return None
    kind = node["type"]
    logical = node.get("logicalType")
    if kind == "record":
        return _record_converter(node, named, namespace)
    if logical == "decimal":
        mapped = decimal_type(int(node["precision"]), int(node.get("scale", 0)))
        return _decimal_text if isinstance(mapped, StringType) else None
    if logical == "date":
        return wire.clamp_days
    if logical in TIMESTAMP_LOGICAL or logical in LOCAL_TIMESTAMP_LOGICAL:
        scale = _scale(logical)
        return lambda v: wire.clamp_micros(v * scale)
    if logical in TIME_LOGICAL:
        scale = _scale(logical)
        return lambda v: wire.time_text(v * scale)
    if kind == "array":
        convert = avro_converter(node["items"], named, namespace)
        return None if convert is None else _each(convert)
    if kind == "map":
        convert = avro_converter(node["values"], named, namespace)
        return None if convert is None else _each_value(convert)
    return avro_converter(kind, named, namespace)


def _record_converter(schema: dict[str, Any], named: dict[str, Any], namespace: str) -> Converter | None:
    converters: dict[str, Converter] = {}
    for field in schema["fields"]:
        convert = avro_converter(field["type"], named, namespace)
        if convert is not None:
            converters[field["name"]] = convert
    if not converters:
        return None

    def convert_record(record: dict[str, Any]) -> dict[str, Any]:
        return {k: (converters[k](v) if k in converters and v is not None else v) for k, v in record.items()}

    return convert_record


def field_converters(schema: dict[str, Any]) -> dict[str, Converter | None]:
    """Per column of a table's key or value record (by its Postgres name), its converter."""
    named: dict[str, Any] = {}
    namespace = schema.get("namespace", "")
    return {
        field.get(COLUMN_PROPERTY, field["name"]): avro_converter(field["type"], named, namespace)
        for field in schema["fields"]
    }


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
