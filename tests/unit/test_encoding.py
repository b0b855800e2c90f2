"""The Avro and JSON event serializers: framing, subjects, schema ids, headers, tombstones, errors.

The registry is confluent-kafka's in-memory one (`mock://`), the only stand-in in the unit tier; the
integration tier registers with the real registry.
"""

from __future__ import annotations

import base64
import dataclasses
import io
import json
import struct
import uuid
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import fastavro
import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

from cdc_worker.core.encoding.avro_serializer import AvroEventSerializer
from cdc_worker.core.encoding.json_serializer import JsonEventSerializer
from cdc_worker.core.encoding.serializers import EncodedMessage
from cdc_worker.core.errors import InfrastructureError, RegistryUnavailable
from cdc_worker.core.model import (
    UNCHANGED_TOAST,
    ChangeEvent,
    Column,
    ColumnValue,
    Op,
    SnapshotControl,
    TableSchema,
    TruncateEvent,
)
from cdc_worker.core.pgtypes.mapping import UnrepresentableValue
from cdc_worker.core.pgtypes.oids import VARHDRSZ, PgType
from kafka_contract.control import SNAPSHOT_DONE, SNAPSHOT_FAILED

AMOUNT_TYPMOD = ((12 << 16) | 2) + VARHDRSZ
COLUMNS = (
    Column("id", PgType.INT8, -1),
    Column("customer_id", PgType.INT4, -1),
    Column("name", PgType.TEXT, -1),
    Column("email", PgType.VARCHAR, 200 + VARHDRSZ),
    Column("amount", PgType.NUMERIC, AMOUNT_TYPMOD),
    Column("created_at", PgType.TIMESTAMPTZ, -1),
    Column("payload", PgType.JSONB, -1),
    Column("active", PgType.BOOL, -1),
    Column("photo", PgType.BYTEA, -1),
    Column("note", PgType.TEXT, -1),
)
ORDERS = TableSchema(16384, "public", "orders", COLUMNS, key_columns=("id",))
ROW: tuple[ColumnValue, ...] = (
    "1234567",
    "42",
    "Zoë Example",
    "zoe@example.com",
    "-1234.50",
    "2024-01-02 03:04:05.123456+00",
    '{"items": [1, 2.50], "big": 12345678901234567890}',
    "t",
    "\\x00ff00",
    None,
)
# What each value must read back as, from the stdlib rather than from the code under test.
EXPECTED = {
    "id": 1234567,
    "customer_id": 42,
    "name": "Zoë Example",
    "email": "zoe@example.com",
    "amount": Decimal("-1234.50"),
    "created_at": datetime(2024, 1, 2, 3, 4, 5, 123456, tzinfo=UTC),
    "payload": '{"items": [1, 2.50], "big": 12345678901234567890}',
    "active": True,
    "photo": b"\x00\xff\x00",
    "note": None,
}
COMMIT_TS = datetime(2024, 1, 2, 4, 4, 5, 250000, tzinfo=timezone(timedelta(hours=1)))
COMMIT_LSN = 0x16_B374D848


def event(op: Op = Op.INSERT, table: TableSchema = ORDERS, row: Any = ROW, **changes: Any) -> ChangeEvent:
    key = None if not table.is_keyed else tuple((row or ROW)[i] for i in table.key_indexes)
    fields: dict[str, Any] = {
        "op": op, "table": table, "key": key, "row": row, "unchanged_toast": (),
        "commit_lsn": COMMIT_LSN, "seq": 3, "xid": 771, "commit_ts": COMMIT_TS,
    }  # fmt: skip
    fields.update(changes)
    return ChangeEvent(**fields)


class RecordingRegistry:
    """A real (in-memory) registry client that also records which subjects were registered."""

    def __init__(self) -> None:
        self.client = SchemaRegistryClient.new_client({"url": f"mock://{uuid.uuid4().hex}"})
        self.subjects: list[str] = []

    def register_schema(self, subject_name: str, schema: Schema, normalize_schemas: bool = False) -> int:
        self.subjects.append(subject_name)
        schema_id: int = self.client.register_schema(subject_name, schema, normalize_schemas)
        return schema_id


@pytest.fixture
def registry() -> RecordingRegistry:
    return RecordingRegistry()


def decode(registry: RecordingRegistry, subject: str, framed: bytes) -> Any:
    """Check the Confluent framing against the registry and decode with the registered schema."""
    assert framed[0] == 0
    (schema_id,) = struct.unpack(">I", framed[1:5])
    latest = registry.client.get_latest_version(subject)
    assert latest.schema_id == schema_id
    schema = fastavro.parse_schema(json.loads(latest.schema.schema_str))
    return fastavro.schemaless_reader(io.BytesIO(framed[5:]), schema)


def test_avro_value_key_and_subjects(registry: RecordingRegistry) -> None:
    message = AvroEventSerializer(registry, {})(event())
    assert message is not None
    assert message.topic == "orders"
    assert sorted(registry.subjects) == ["orders-key", "orders-value"]
    assert decode(registry, "orders-value", message.value or b"") == EXPECTED
    assert decode(registry, "orders-key", message.key or b"") == {"id": EXPECTED["id"]}


def test_avro_payload_is_byte_for_byte_fastavros(registry: RecordingRegistry) -> None:
    message = AvroEventSerializer(registry, {})(event())
    assert message is not None and message.value is not None
    schema = json.loads(registry.client.get_latest_version("orders-value").schema.schema_str)
    reference = io.BytesIO()
    fastavro.schemaless_writer(reference, fastavro.parse_schema(schema), EXPECTED)
    assert message.value[5:] == reference.getvalue()


def test_headers(registry: RecordingRegistry) -> None:
    message = AvroEventSerializer(registry, {})(event())
    assert message is not None
    assert dict(message.headers) == {
        "bw.op": b"c",
        "bw.lsn": str(COMMIT_LSN).encode(),
        "bw.seq": b"3",
        "bw.xid": b"771",
        "bw.commit_ts": b"2024-01-02T03:04:05.250000Z",
    }
    assert [name for name, _ in message.headers] == ["bw.op", "bw.lsn", "bw.seq", "bw.xid", "bw.commit_ts"]


@pytest.mark.parametrize("serializer", ["avro", "json"])
def test_every_op_and_transaction_change_updates_the_headers(
    registry: RecordingRegistry, serializer: str
) -> None:
    serialize = AvroEventSerializer(registry, {}) if serializer == "avro" else JsonEventSerializer({})
    for op, lsn, xid in [(Op.READ, 10, 0), (Op.UPDATE, 20, 5), (Op.DELETE, 20, 5), (Op.INSERT, 30, 6)]:
        message = serialize(event(op, row=None if op is Op.DELETE else ROW, commit_lsn=lsn, xid=xid))
        assert message is not None
        headers = dict(message.headers)
        assert (headers["bw.op"], headers["bw.lsn"], headers["bw.xid"]) == (
            op.value.encode(),
            str(lsn).encode(),
            str(xid).encode(),
        )


def test_unchanged_toast_is_null_and_named_in_a_header(registry: RecordingRegistry) -> None:
    row = list(ROW)
    row[6] = UNCHANGED_TOAST
    serialize = AvroEventSerializer(registry, {})
    message = serialize(event(Op.UPDATE, row=tuple(row), unchanged_toast=("payload",)))
    assert message is not None
    assert dict(message.headers)["bw.unchanged"] == b"payload"
    assert decode(registry, "orders-value", message.value or b"")["payload"] is None
    json_message = JsonEventSerializer({})(event(Op.UPDATE, row=tuple(row), unchanged_toast=("payload",)))
    assert json_message is not None and json.loads(json_message.value or b"")["payload"] is None


@pytest.mark.parametrize("serializer", ["avro", "json"])
def test_delete_is_a_tombstone_with_the_key(registry: RecordingRegistry, serializer: str) -> None:
    serialize = AvroEventSerializer(registry, {}) if serializer == "avro" else JsonEventSerializer({})
    message = serialize(event(Op.DELETE, row=None))
    assert message is not None
    assert message.value is None and message.key is not None
    assert dict(message.headers)["bw.op"] == b"d"


@pytest.mark.parametrize("serializer", ["avro", "json"])
def test_unkeyed_tables_have_null_keys_and_unpublished_deletes(
    registry: RecordingRegistry, serializer: str
) -> None:
    unkeyed = TableSchema(16385, "audit", "log", COLUMNS)
    serialize = AvroEventSerializer(registry, {}) if serializer == "avro" else JsonEventSerializer({})
    message = serialize(event(table=unkeyed))
    assert message is not None and message.key is None and message.value is not None
    assert message.topic == "audit.log"
    assert serialize(event(Op.DELETE, table=unkeyed, row=None)) is None
    if serializer == "avro":
        assert registry.subjects == ["audit.log-value"]


def test_schema_ids_are_obtained_once_per_schema_version(registry: RecordingRegistry) -> None:
    serialize = AvroEventSerializer(registry, {})
    for seq in range(5):
        serialize(event(seq=seq))
    assert sorted(registry.subjects) == ["orders-key", "orders-value"]
    same_version = TableSchema(ORDERS.oid, ORDERS.namespace, ORDERS.name, COLUMNS, key_columns=("id",))
    serialize(event(table=same_version))
    assert len(registry.subjects) == 2  # an equal relation version re-sent by pgoutput registers nothing
    added = TableSchema(
        ORDERS.oid, "public", "orders", (*COLUMNS, Column("added", PgType.DATE, -1)), key_columns=("id",)
    )
    message = serialize(event(table=added, row=(*ROW, "2024-02-29")))
    assert sorted(registry.subjects) == ["orders-key", "orders-value", "orders-value"]
    assert message is not None
    assert registry.client.get_latest_version("orders-value").version == 2
    assert decode(registry, "orders-value", message.value or b"")["added"] == datetime(2024, 2, 29).date()


def test_topic_prefix(registry: RecordingRegistry) -> None:
    message = AvroEventSerializer(registry, {}, topic_prefix="prod")(event())
    assert message is not None and message.topic == "prod.orders"
    assert sorted(registry.subjects) == ["prod.orders-key", "prod.orders-value"]


@pytest.mark.parametrize("serializer", ["avro", "json"])
def test_unrepresentable_value_names_table_column_and_fix(
    registry: RecordingRegistry, serializer: str
) -> None:
    serialize = AvroEventSerializer(registry, {}) if serializer == "avro" else JsonEventSerializer({})
    bad = list(ROW)
    bad[8] = "plain text, not hex"
    with pytest.raises(UnrepresentableValue, match="bytea_output=hex") as caught:
        serialize(event(row=tuple(bad)))
    assert (caught.value.table, caught.value.column, caught.value.type_name) == (
        "public.orders",
        "photo",
        "bytea",
    )


def test_numeric_nan_in_a_decimal_column_is_a_data_error(registry: RecordingRegistry) -> None:
    bad = list(ROW)
    bad[4] = "NaN"
    with pytest.raises(UnrepresentableValue, match=r"public\.orders, column amount \(numeric\(12,2\)\)"):
        AvroEventSerializer(registry, {})(event(row=tuple(bad)))
    # JSON has no decimal type: the exact string is publishable.
    message = JsonEventSerializer({})(event(row=tuple(bad)))
    assert message is not None and json.loads(message.value or b"")["amount"] == "NaN"


@pytest.mark.parametrize("serializer", ["avro", "json"])
@pytest.mark.parametrize("key_column", [0, 2, 4, 5], ids=["int8", "text", "numeric", "timestamptz"])
def test_null_key_is_a_data_error(registry: RecordingRegistry, serializer: str, key_column: int) -> None:
    name = COLUMNS[key_column].name
    table = TableSchema(ORDERS.oid, "public", "orders", COLUMNS, key_columns=(name,))
    serialize = AvroEventSerializer(registry, {}) if serializer == "avro" else JsonEventSerializer({})
    keyless = list(ROW)
    keyless[key_column] = None
    with pytest.raises(UnrepresentableValue, match=f"column {name} .*key column is NULL"):
        serialize(event(table=table, row=tuple(keyless), key=(None,)))
    with pytest.raises(UnrepresentableValue, match=f"column {name} .*key column is NULL"):
        serialize(event(Op.DELETE, table=table, row=None, key=(None,)))


def test_json_value_and_key() -> None:
    message = JsonEventSerializer({})(event())
    assert isinstance(message, EncodedMessage)
    assert json.loads(message.key or b"") == {"id": 1234567}
    value = json.loads(message.value or b"")
    assert value == {
        "id": 1234567,
        "customer_id": 42,
        "name": "Zoë Example",
        "email": "zoe@example.com",
        "amount": "-1234.50",
        "created_at": "2024-01-02T03:04:05.123456Z",
        "payload": json.loads(str(ROW[6])),
        "active": True,
        "photo": base64.b64encode(b"\x00\xff\x00").decode(),
        "note": None,
    }
    assert "Zoë".encode() in (message.value or b"")  # UTF-8, not \\u escapes


def test_json_keeps_original_column_names() -> None:
    odd = TableSchema(
        1,
        "public",
        "crêpes",
        (Column("person.name/surname", PgType.TEXT, -1),),
        key_columns=("person.name/surname",),
    )
    message = JsonEventSerializer({})(event(table=odd, row=("x",)))
    assert message is not None
    assert message.topic == "cr_c3__aa_pes"
    assert json.loads(message.value or b"") == {"person.name/surname": "x"}


TRUNCATE = TruncateEvent(
    tables=(ORDERS, TableSchema(16386, "sales", "items", COLUMNS[:1], key_columns=("id",))),
    cascade=True,
    restart_identity=False,
    commit_lsn=COMMIT_LSN,
    seq=0,
    xid=772,
    commit_ts=COMMIT_TS,
)


DDL_FIELDS = (
    "ddl_command",
    "ddl_object_type",
    "ddl_object_identity",
    "ddl_statement",
    "ddl_renamed_to",
    "ddl_columns",
)


def test_truncate_avro_goes_to_the_control_topic_per_table(registry: RecordingRegistry) -> None:
    messages = AvroEventSerializer(registry, {}, topic_prefix="p").truncate(TRUNCATE)
    assert [m.topic for m in messages] == ["p.bottledwater.control"] * 2
    assert [decode(registry, "p.bottledwater.control-key", m.key or b"") for m in messages] == [
        "public.orders",
        "sales.items",
    ]
    first = decode(registry, "p.bottledwater.control-value", messages[0].value or b"")
    assert first == {
        "op": "t",
        "schema": "public",
        "table": "orders",
        "topic": "p.orders",
        "lsn": COMMIT_LSN,
        "seq": 0,
        "xid": 772,
        "commit_ts": COMMIT_TS.astimezone(UTC),
        "cascade": True,
        "restart_identity": False,
        "snapshot_id": None,
        "rows": None,
        "reason": None,
        **{name: None for name in DDL_FIELDS},
        "progress_offsets": None,
    }
    assert dict(messages[1].headers)["bw.op"] == b"t"
    assert dict(messages[1].headers)["bw.lsn"] == str(COMMIT_LSN).encode()


def test_truncate_json() -> None:
    messages = JsonEventSerializer({}).truncate(TRUNCATE)
    assert [json.loads(m.key or b"") for m in messages] == ["public.orders", "sales.items"]
    second = json.loads(messages[1].value or b"")
    assert second["op"] == "t" and second["topic"] == "sales.items" and second["cascade"] is True
    assert second["commit_ts"] == "2024-01-02T03:04:05.250000Z" and second["lsn"] == COMMIT_LSN


SNAPSHOT_DONE_EVENT = SnapshotControl(
    op=SNAPSHOT_DONE,
    namespace="public",
    name="orders",
    topic="p.orders",
    request_id="r1",
    rows=1234,
    reason=None,
    commit_lsn=COMMIT_LSN,
    seq=7,
    xid=773,
    commit_ts=COMMIT_TS,
)


def test_snapshot_control_avro_is_keyed_apart_from_the_tables_truncates(registry: RecordingRegistry) -> None:
    serializer = AvroEventSerializer(registry, {}, topic_prefix="p")
    message = serializer.snapshot_control(SNAPSHOT_DONE_EVENT)
    assert message.topic == "p.bottledwater.control"
    # Not "public.orders": compaction must keep the table's TRUNCATE next to this.
    assert decode(registry, "p.bottledwater.control-key", message.key or b"") == "public.orders#snapshot"
    record = decode(registry, "p.bottledwater.control-value", message.value or b"")
    assert record["op"] == "snapshot_done"
    position = (record["snapshot_id"], record["rows"], record["lsn"], record["seq"])
    assert position == ("r1", 1234, COMMIT_LSN, 7)
    assert dict(message.headers)["bw.op"] == b"snapshot_done"
    # The TRUNCATE written by the same serializer uses the same (extended) schema.
    truncate = serializer.truncate(TRUNCATE)[0]
    assert decode(registry, "p.bottledwater.control-value", truncate.value or b"")["op"] == "t"


def test_snapshot_control_json_carries_the_failure_reason() -> None:
    failed = dataclasses.replace(SNAPSHOT_DONE_EVENT, op=SNAPSHOT_FAILED, rows=0, reason="table gone")
    message = JsonEventSerializer({}).snapshot_control(failed)
    assert json.loads(message.key or b"") == "public.orders#snapshot"
    value = json.loads(message.value or b"")
    assert (value["op"], value["reason"], value["snapshot_id"]) == ("snapshot_failed", "table gone", "r1")
    assert value["commit_ts"].endswith("Z")


def test_a_registry_failure_is_an_infrastructure_error_naming_the_subject() -> None:
    class UnreachableRegistry:
        def register_schema(self, subject_name: str, schema: Schema, normalize_schemas: bool = False) -> int:
            raise OSError("connection refused")

    with pytest.raises(
        RegistryUnavailable, match="subject orders-value failed: connection refused"
    ) as raised:
        AvroEventSerializer(UnreachableRegistry(), {})(event())
    assert isinstance(raised.value, InfrastructureError)
