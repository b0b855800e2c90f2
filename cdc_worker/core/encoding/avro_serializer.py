"""The Avro serializer: Confluent-framed Avro keys and values, schemas registered per relation
version (subjects `<topic>-key` and `<topic>-value`, TopicNameStrategy), written by writers
compiled once per version (`avro_writer`)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from confluent_kafka.schema_registry import Schema

from cdc_worker.core.encoding import avro_schema
from cdc_worker.core.encoding.avro_writer import (
    compile_fused_writer,
    compile_keyed_writer,
    compile_record_writer,
    zigzag_long,
)
from cdc_worker.core.encoding.serializers import (
    EventSerializer,
    InsertEncoder,
    Plan,
    RowWriter,
    SchemaRegistrar,
    TupleReading,
    epoch_micros,
    is_string,
)
from cdc_worker.core.errors import RegistryUnavailable
from cdc_worker.core.model import TableSchema, TypeInfo
from cdc_worker.core.pgtypes.mapping import DEFAULT_OPTIONS, ColumnType, TypeMappingOptions
from kafka_contract.framing import frame_prefix


class AvroEventSerializer(EventSerializer):
    """Confluent-framed Avro (0x00, 4-byte schema id, Avro binary) with registered schemas.

    Schema ids are asked of `registry` (a `SchemaRegistryClient`) once per schema version and
    subject; that is the only I/O, and it happens on the first event of a new relation version.
    """

    _target = "avro"

    def __init__(
        self,
        registry: SchemaRegistrar,
        type_infos: Mapping[int, TypeInfo],
        *,
        topic_prefix: str | None = None,
        options: TypeMappingOptions = DEFAULT_OPTIONS,
    ) -> None:
        super().__init__(type_infos, topic_prefix=topic_prefix, options=options)
        self.registry = registry
        self._schema_ids: dict[tuple[str, str], int] = {}
        self._control_writer: RowWriter | None = None

    def schema_id(self, subject: str, schema: object) -> int:
        """The registry's id for `schema` under `subject`, registering it on first use."""
        schema_str = json.dumps(schema, separators=(",", ":"))
        cached = self._schema_ids.get((subject, schema_str))
        if cached is None:
            try:
                cached = self.registry.register_schema(subject, Schema(schema_str, "AVRO"))
            except Exception as exc:  # the client raises its own, httpx's and OS errors alike
                raise RegistryUnavailable(
                    f"registering the schema of subject {subject} failed: {exc}"
                ) from exc
            self._schema_ids[(subject, schema_str)] = cached
        return cached

    def framing(self, subject: str, schema: object) -> bytes:
        return frame_prefix(self.schema_id(subject, schema))

    def _build_plan(self, table: TableSchema, topic: str, column_types: tuple[ColumnType, ...]) -> Plan:
        value = avro_schema.value_schema(table, column_types)
        converters = [t.to_avro for t in column_types]
        value_prefix = self.framing(f"{topic}-value", value)
        value_writer = compile_record_writer(value, converters, value_prefix)
        # Text columns published as Avro strings as they are: the fused path copies their bytes.
        raw = [i for i, t in enumerate(column_types) if t.to_avro is None and is_string(t.avro_schema)]
        width = len(column_types)
        key = avro_schema.key_schema(table, column_types)
        if key is None:

            def fuse_unkeyed(reading: TupleReading) -> InsertEncoder:
                reader = reading.source(width, raw)
                return compile_fused_writer(
                    value, converters, value_prefix, key=None, raw_strings=raw, reader=reader
                )

            return Plan(table, topic, None, value_writer, None, column_types, fuse_unkeyed)
        key_prefix = self.framing(f"{topic}-key", key)
        key_converters = [column_types[i].to_avro for i in table.key_indexes]
        key_writer = compile_record_writer(key, key_converters, key_prefix)
        row_writer = compile_keyed_writer(
            value,
            converters,
            value_prefix,
            key_schema=key,
            key_fields=table.key_indexes,
            key_prefix=key_prefix,
        )
        keyed = (key, table.key_indexes, key_prefix)

        def fuse(reading: TupleReading) -> InsertEncoder:
            reader = reading.source(width, raw)
            return compile_fused_writer(
                value, converters, value_prefix, key=keyed, raw_strings=raw, reader=reader
            )

        return Plan(table, topic, key_writer, value_writer, row_writer, column_types, fuse)

    def _control_key(self, qualified_name: str) -> bytes:
        prefix = self.framing(f"{self.control_topic}-key", avro_schema.control_key_schema())
        encoded = qualified_name.encode()
        return prefix + zigzag_long(len(encoded)) + encoded

    def _control_value(self, record: dict[str, Any]) -> bytes:
        schema = avro_schema.control_value_schema()
        if self._control_writer is None:  # compiled on the first control event, which may never come
            prefix = self.framing(f"{self.control_topic}-value", schema)
            self._control_writer = compile_record_writer(schema, None, prefix)
        values = {**record, "commit_ts": epoch_micros(record["commit_ts"])}
        return self._control_writer([values.get(f["name"]) for f in schema["fields"]])
