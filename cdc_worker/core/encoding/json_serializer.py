"""The JSON serializer: one UTF-8 JSON object per message, plain values, original column names;
no registry."""

from __future__ import annotations

import json
from typing import Any

from cdc_worker.core.encoding.json_writer import compile_json_writer, compile_keyed_json_writer
from cdc_worker.core.encoding.serializers import (
    EventSerializer,
    InsertEncoder,
    Plan,
    TupleReading,
    reading_into,
)
from cdc_worker.core.model import TableSchema
from cdc_worker.core.pgtypes.mapping import ColumnType
from kafka_contract.headers import iso_utc


class JsonEventSerializer(EventSerializer):
    """One UTF-8 JSON object per message, plain values, original column names; no registry."""

    _target = "json"

    def _build_plan(self, table: TableSchema, topic: str, column_types: tuple[ColumnType, ...]) -> Plan:
        names = [c.name for c in table.columns]
        converters = [t.to_json for t in column_types]
        value_writer = compile_json_writer(names, converters)
        width = len(column_types)
        if not table.is_keyed:

            def fuse_unkeyed(reading: TupleReading) -> InsertEncoder:
                return reading_into(reading.reader(width), lambda row: (None, value_writer(row)))

            return Plan(table, topic, None, value_writer, None, column_types, fuse_unkeyed)
        key_converters = [column_types[i].to_json for i in table.key_indexes]
        key_writer = compile_json_writer(table.key_columns, key_converters, nullable=False)
        row_writer = compile_keyed_json_writer(names, converters, table.key_indexes)

        def fuse(reading: TupleReading) -> InsertEncoder:
            return reading_into(reading.reader(width), row_writer)

        return Plan(table, topic, key_writer, value_writer, row_writer, column_types, fuse)

    def _control_key(self, qualified_name: str) -> bytes:
        return json.dumps(qualified_name, ensure_ascii=False).encode()

    def _control_value(self, record: dict[str, Any]) -> bytes:
        control = {**record, "commit_ts": iso_utc(record["commit_ts"])}
        return json.dumps(control, ensure_ascii=False).encode()
