"""The native (Rust) row codec's Python face: per relation version, a `NativePlan` that encodes whole
batches of snapshot rows (COPY TEXT) or pgoutput Insert/Update/Delete payloads into Kafka-ready
key and value bytes in one call each.

Guarantees, which `tests/unit/test_native_codec.py` holds it to:

- **Byte-identical to the Python reference** (the serializers in `core.encoding` fed with the rows
  `core.pgtypes.copy_text` parses, or the events `core.pgoutput` + `core.changes.assembler` make):
  same keys, same values, same `bw.unchanged` column names, same events per message (an Update that
  changes the key is a tombstone for the old key then the new row; the delete of an unkeyed table
  is an event that takes a `seq` but publishes nothing).
- **Identical errors**: the Rust side accepts only the canonical text Postgres writes. At the first
  row or message it declines (a value the reference refuses, bad or truncated bytes, anything
  unusual) it stops and reports where; this module runs that one item through the Python reference,
  which raises its exact exception (or encodes it, when it only looked unusual), and goes on
  natively after it. So an error is always the reference's own exception, type and message.
- **Never panics, never hangs**: every read is bounds-checked; a panic would be caught in Rust and
  raised as `NativeCodecError`, never crossing into Python. Batches over 32 kB are encoded with the
  GIL released.

If the extension is not built (no Rust toolchain at install), `NATIVE_AVAILABLE` is False,
`compile_native_plan` returns None and the worker keeps the Python path; `codec_description()` says
which codec runs, for `bottledwater --version` and the start-up line.

This module is the face and compiles a plan for a relation version; the parts are
`native_extension` (loading the extension, its classes' shapes, the start-up lines) and
`native_plan` (`NativePlan`: the batches, and the reference behind them).
"""

from __future__ import annotations

from collections.abc import Mapping
from json.encoder import encode_basestring
from typing import Literal

from cdc_worker.core.encoding import avro_schema
from cdc_worker.core.encoding.avro_serializer import AvroEventSerializer
from cdc_worker.core.encoding.json_serializer import JsonEventSerializer
from cdc_worker.core.encoding.native_extension import (
    CODEC_ENV,
    EXTENSION,
    NATIVE_AVAILABLE,
    CopyRow,
    EncodedChange,
    NativeProducer,
    NativeProducerUnavailable,
    build_native_producer,
    codec_description,
    producer_description,
)
from cdc_worker.core.encoding.native_kinds import UnsupportedColumn, native_column_kinds
from cdc_worker.core.encoding.native_plan import NativePlan, ProducedChanges, Serializer
from cdc_worker.core.model import Op, TableSchema, TypeInfo
from cdc_worker.core.pgtypes.mapping import (
    DEFAULT_OPTIONS,
    TypeMappingOptions,
    resolve_type,
)
from kafka_contract.framing import frame_prefix

__all__ = [
    "CODEC_ENV",
    "NATIVE_AVAILABLE",
    "CopyRow",
    "EncodedChange",
    "NativePlan",
    "ProducedChanges",
    "UnsupportedColumn",
    "codec_description",
    "compile_native_plan",
    "native_column_kinds",
    "native_plan_for",
    "NativeProducer",
    "NativeProducerUnavailable",
    "build_native_producer",
    "producer_description",
]


class _FixedSchemaIds:
    """A registrar that answers with ids the caller registered already (the low-level API)."""

    def __init__(self, key_schema_id: int | None, value_schema_id: int) -> None:
        self.key_schema_id = key_schema_id
        self.value_schema_id = value_schema_id

    def register_schema(self, subject_name: str, schema: object, normalize_schemas: bool = False) -> int:
        if subject_name.endswith("-key"):
            if self.key_schema_id is None:
                raise ValueError(f"no key schema id was given for subject {subject_name}")
            return self.key_schema_id
        return self.value_schema_id


def compile_native_plan(
    table: TableSchema,
    type_infos: Mapping[int, TypeInfo],
    *,
    output_format: Literal["avro", "json"],
    key_schema_id: int | None = None,
    value_schema_id: int | None = None,
    options: TypeMappingOptions = DEFAULT_OPTIONS,
    topic_prefix: str | None = None,
    reference: Serializer | None = None,
) -> NativePlan | None:
    """The native plan of one relation version, or None when the extension is not built or a
    column has no native kind (`native_column_kinds` says which): then use the Python path.

    Avro needs the schema ids the registry gave `<topic>-value` (and `<topic>-key` when keyed)
    for `avro_schema.value_schema` / `key_schema` of this table. `reference` is the serializer that
    encodes declined items; by default one is made from the same inputs (`native_plan_for` passes
    the worker's own, so its plan cache and registry client are shared).
    """
    if EXTENSION is None:
        return None
    try:
        kinds = native_column_kinds(table, type_infos, options)
    except UnsupportedColumn:
        return None
    if output_format == "avro":
        if value_schema_id is None or (table.is_keyed and key_schema_id is None):
            raise ValueError(f"Avro needs the registered schema ids of {table.qualified_name}")
        key_prefix = frame_prefix(key_schema_id) if key_schema_id is not None else b""
        value_prefix = frame_prefix(value_schema_id)
        if reference is None:
            registrar = _FixedSchemaIds(key_schema_id, value_schema_id)
            reference = AvroEventSerializer(registrar, type_infos, topic_prefix=topic_prefix, options=options)
    else:
        key_prefix = value_prefix = b""
        if reference is None:
            reference = JsonEventSerializer(type_infos, topic_prefix=topic_prefix, options=options)
    columns = [
        (c.name, kind, encode_basestring(c.name).encode(), c.in_replica_identity)
        for c, kind in zip(table.columns, kinds, strict=True)
    ]
    raw = EXTENSION.Plan(
        relation=table.qualified_name,
        relation_oid=table.oid,
        columns=columns,
        key_indexes=list(table.key_indexes),
        output_format=output_format,
        key_prefix=key_prefix,
        value_prefix=value_prefix,
        ops=(Op.INSERT, Op.UPDATE, Op.DELETE),
    )
    return NativePlan(raw, table, reference)


def native_plan_for(serializer: Serializer, table: TableSchema) -> NativePlan | None:
    """`compile_native_plan` for a relation version the worker's `serializer` encodes: the same
    type infos, options and topic prefix, and for Avro the schema ids it registered (registering
    them now if it has not yet, as its own first event of this version would)."""
    if EXTENSION is None:
        return None
    if isinstance(serializer, AvroEventSerializer):
        try:
            column_types = tuple(
                resolve_type(c.type_oid, c.typmod, serializer.type_infos, serializer.options)
                for c in table.columns
            )
        except ValueError:
            return None
        topic = serializer.topic_for(table)
        value_id = serializer.schema_id(f"{topic}-value", avro_schema.value_schema(table, column_types))
        key = avro_schema.key_schema(table, column_types)
        key_id = None if key is None else serializer.schema_id(f"{topic}-key", key)
        return compile_native_plan(
            table,
            serializer.type_infos,
            output_format="avro",
            key_schema_id=key_id,
            value_schema_id=value_id,
            options=serializer.options,
            reference=serializer,
        )
    return compile_native_plan(
        table, serializer.type_infos, output_format="json", options=serializer.options, reference=serializer
    )
