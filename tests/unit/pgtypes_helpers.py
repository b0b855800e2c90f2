"""Helpers shared by the type-mapping tests: resolve a type, round-trip a value, read its JSON."""

from __future__ import annotations

import io
import json
from datetime import date
from typing import Any

import fastavro

from cdc_worker.core.encoding.avro_writer import compile_record_writer
from cdc_worker.core.model import TypeInfo
from cdc_worker.core.pgtypes.mapping import ColumnType, TypeMappingOptions, resolve_type
from cdc_worker.core.pgtypes.oids import VARHDRSZ

EPOCH = date(1970, 1, 1)


def numeric_typmod(precision: int, scale: int) -> int:
    return ((precision << 16) | (scale & 0x7FF)) + VARHDRSZ


def mapped(
    oid: int, typmod: int = -1, infos: dict[int, TypeInfo] | None = None, **options: Any
) -> ColumnType:
    return resolve_type(oid, typmod, infos or {}, TypeMappingOptions(**options))


def record_schema(column_type: ColumnType) -> dict[str, Any]:
    return {
        "type": "record",
        "name": "r",
        "fields": [{"name": "v", "type": ["null", column_type.avro_schema]}],
    }


def avro_round_trip(column_type: ColumnType, text: str, *, logical: bool = True) -> Any:
    """fastavro writes the converted value, the compiled writer must match it, fastavro reads it."""
    schema = record_schema(column_type)
    reference = io.BytesIO()
    fastavro.schemaless_writer(reference, fastavro.parse_schema(schema), {"v": column_type.avro_value(text)})
    compiled = compile_record_writer(schema, [column_type.to_avro])([text])
    assert compiled == reference.getvalue()
    if not logical:  # sentinels: read the underlying primitive, which no datetime can hold
        schema = json.loads(json.dumps(schema).replace('"logicalType"', '"ignoredLogicalType"'))
    return fastavro.schemaless_reader(io.BytesIO(compiled), fastavro.parse_schema(schema))["v"]


def json_value(column_type: ColumnType, text: str) -> Any:
    return json.loads(column_type.json_text(text))
