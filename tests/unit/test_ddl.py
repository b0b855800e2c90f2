"""DDL capture's pure parts: the trigger's message read back, its place among a transaction's
changes, its control-topic encoding (Avro and JSON), the selection and rename logic of the shell."""

from __future__ import annotations

import io
import json
import struct
from datetime import UTC, datetime
from typing import Any

import fastavro
import pytest

from cdc_worker.core.changes.assembler import ChangeAssembler
from cdc_worker.core.ddl import (
    DDL_FORMAT_VERSION,
    DDL_PREFIX,
    DdlColumn,
    DdlCommand,
    DdlEvent,
    DdlMessageError,
    parse_ddl,
    renamed_from,
)
from cdc_worker.core.encoding import avro_schema
from cdc_worker.core.encoding.avro_serializer import AvroEventSerializer
from cdc_worker.core.encoding.json_serializer import JsonEventSerializer
from cdc_worker.core.encoding.serializers import EncodedMessage
from cdc_worker.core.model import ChangeEvent, TableSchema, TransactionCommitted
from cdc_worker.core.pgoutput.decoder import (
    Insert,
    LogicalMessage,
    PgOutputMessage,
    StreamAbort,
    StreamCommit,
    StreamStart,
    StreamStop,
)
from cdc_worker.shell.postgres import ddl_trigger
from cdc_worker.shell.stream.ddl_events import DdlPublisher, DdlSelection
from kafka_contract.control import DDL, ControlDecoder
from tests.unit.test_changes import USERS, begin, commit, feed_all, relation
from tests.unit.test_encoding import RecordingRegistry, decode

TS = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
ORDERS_OID = 16400


def payload(**overrides: Any) -> dict[str, Any]:
    record: dict[str, Any] = {
        "version": DDL_FORMAT_VERSION,
        "event": "ddl_command_end",
        "command_tag": "ALTER TABLE",
        "object_type": "table",
        "object_identity": "public.orders",
        "schema": "public",
        "table": "orders",
        "table_oid": ORDERS_OID,
        "statement": "ALTER TABLE orders ADD COLUMN note text",
        "columns": [
            {"name": "id", "type": "integer", "base_type": "int4", "typmod": -1, "array": False,
             "not_null": True},
            {"name": "note", "type": "text", "base_type": "text", "typmod": -1, "array": False,
             "not_null": False},
        ],
    }  # fmt: skip
    record.update(overrides)
    return record


def content(**overrides: Any) -> bytes:
    return json.dumps(payload(**overrides)).encode()


def ddl_message(xid: int | None = None, **overrides: Any) -> LogicalMessage:
    return LogicalMessage(True, 0x1010, DDL_PREFIX, content(**overrides), xid)


def test_parse_reads_what_the_trigger_writes() -> None:
    command = parse_ddl(content())
    assert command.command_tag == "ALTER TABLE"
    assert command.qualified_name == "public.orders"
    assert command.table_oid == ORDERS_OID
    assert command.columns == (
        DdlColumn("id", "integer", "int4", -1, False, True),
        DdlColumn("note", "text", "text", -1, False, False),
    )
    assert not command.dropped_table
    dropped = parse_ddl(content(event="sql_drop", command_tag="DROP TABLE", columns=[]))
    assert dropped.dropped_table and dropped.columns == ()


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        (b"not json", "not JSON"),
        (b"[1]", "not a JSON object"),
        (json.dumps(payload(version=DDL_FORMAT_VERSION + 1)).encode(), "upgrade the worker"),
        (json.dumps({k: v for k, v in payload().items() if k != "table"}).encode(), "'table'"),
        (json.dumps(payload(columns={"id": 1})).encode(), "not a list"),
    ],
)
def test_parse_refuses_what_the_trigger_does_not_write(raw: bytes, match: str) -> None:
    with pytest.raises(DdlMessageError, match=match):
        parse_ddl(raw)


def test_ddl_and_dml_of_one_transaction_keep_their_order() -> None:
    assembler = ChangeAssembler(capture_ddl=True)
    events = feed_all(
        assembler,
        [
            begin(),
            relation(),
            Insert(USERS, ("1", "a", None)),
            ddl_message(),
            Insert(USERS, ("2", "b", None)),
            commit(),
        ],
    )
    kinds = [(type(e).__name__, getattr(e, "seq", None)) for e in events]
    assert kinds == [
        ("ChangeEvent", 0),
        ("DdlEvent", 1),
        ("ChangeEvent", 2),
        ("TransactionCommitted", None),
    ]
    ddl = events[1]
    assert isinstance(ddl, DdlEvent)
    assert (ddl.commit_lsn, ddl.xid, ddl.commit_ts) == (0x1000, 700, TS)
    assert parse_ddl(ddl.content).statement.startswith("ALTER TABLE")


def test_without_capture_ddl_or_for_other_messages_nothing_is_emitted() -> None:
    def non_commit(assembler: ChangeAssembler, message: LogicalMessage) -> list[object]:
        events = feed_all(assembler, [begin(), message, commit()])
        return [e for e in events if not isinstance(e, TransactionCommitted)]

    assert non_commit(ChangeAssembler(), ddl_message()) == []
    capturing = ChangeAssembler(capture_ddl=True)
    assert non_commit(capturing, LogicalMessage(True, 0x1010, "bottledwater", b"{}")) == []
    # Not transactional: it would be published even when the DDL rolled back.
    assert non_commit(capturing, LogicalMessage(False, 0x1010, DDL_PREFIX, content())) == []


def test_ddl_inside_a_streamed_transaction_is_emitted_at_its_commit_and_dropped_with_its_abort() -> None:
    assembler = ChangeAssembler(capture_ddl=True)
    streamed: list[PgOutputMessage] = [
        StreamStart(900, True),
        relation(xid=900),
        Insert(USERS, ("1", "a", None), xid=900),
        ddl_message(xid=901),  # in a subtransaction
        Insert(USERS, ("2", "b", None), xid=900),
        StreamStop(),
    ]
    assert feed_all(assembler, streamed) == []
    events = feed_all(assembler, [StreamCommit(900, 0, 0x2000, 0x2040, TS, 0)])
    assert [type(e).__name__ for e in events] == [
        "ChangeEvent",
        "DdlEvent",
        "ChangeEvent",
        "TransactionCommitted",
    ]
    assert [e.seq for e in events if isinstance(e, ChangeEvent | DdlEvent)] == [0, 1, 2]

    aborted = ChangeAssembler(capture_ddl=True)
    feed_all(aborted, [*streamed[:3], ddl_message(xid=901), StreamStop(), StreamAbort(900, 901)])
    events = feed_all(aborted, [StreamCommit(900, 0, 0x2000, 0x2040, TS, 0)])
    assert [type(e).__name__ for e in events] == ["ChangeEvent", "TransactionCommitted"]


def ddl_event(**overrides: Any) -> DdlEvent:
    return DdlEvent(content(**overrides), 0x2000, 3, 777, TS)


def test_ddl_avro_on_the_control_topic_keyed_by_table() -> None:
    registry = RecordingRegistry()
    serializer = AvroEventSerializer(registry, {}, topic_prefix="p")
    event = ddl_event()
    message = serializer.ddl(event, parse_ddl(event.content))
    assert message.topic == "p.bottledwater.control"
    assert decode(registry, "p.bottledwater.control-key", message.key or b"") == "public.orders#ddl"
    value = decode(registry, "p.bottledwater.control-value", message.value or b"")
    assert value["op"] == DDL and value["topic"] == "p.orders"
    assert (value["schema"], value["table"], value["lsn"], value["seq"], value["xid"]) == (
        "public",
        "orders",
        0x2000,
        3,
        777,
    )
    assert value["ddl_command"] == "ALTER TABLE" and value["ddl_object_type"] == "table"
    assert value["ddl_statement"] == "ALTER TABLE orders ADD COLUMN note text"
    assert value["ddl_renamed_to"] is None
    assert value["ddl_columns"] == payload()["columns"]
    headers = dict(message.headers)
    assert headers["bw.op"] == b"ddl" and headers["bw.lsn"] == str(0x2000).encode()
    assert headers["bw.seq"] == b"3" and headers["bw.xid"] == b"777"
    assert headers["bw.commit_ts"] == b"2024-05-01T12:00:00.000000Z"
    # The merge's decoder reads it back through the registry's schema by id.
    (schema_id,) = struct.unpack(">I", (message.value or b"")[1:5])
    schema = registry.client.get_schema(schema_id).schema_str
    assert ControlDecoder("avro", lambda _id: schema)(message.value or b"")["ddl_command"] == "ALTER TABLE"


def test_a_rename_is_published_under_the_previous_name() -> None:
    message = JsonEventSerializer({}).ddl(
        ddl_event(table="invoices", object_identity="public.invoices"),
        parse_ddl(content(table="invoices", object_identity="public.invoices")),
        renamed_from=("public", "orders"),
    )
    assert json.loads(message.key or b"") == "public.orders#ddl"
    value = json.loads(message.value or b"")
    assert (value["table"], value["topic"], value["ddl_renamed_to"]) == (
        "orders",
        "orders",
        "public.invoices",
    )
    assert value["commit_ts"] == "2024-05-01T12:00:00.000000Z"


def test_the_control_schema_still_reads_what_older_workers_wrote() -> None:
    """BACKWARD compatibility: the new schema, as reader, reads records of the schema before DDL."""
    new = avro_schema.control_value_schema()
    old = {**new, "fields": [f for f in new["fields"] if not f["name"].startswith("ddl_")]}
    record = {"op": "t", "schema": "public", "table": "t", "topic": "t", "lsn": 1, "seq": 0, "xid": 2,
              "commit_ts": TS, "cascade": False, "restart_identity": False, "snapshot_id": None,
              "rows": None, "reason": None}  # fmt: skip
    buffer = io.BytesIO()
    fastavro.schemaless_writer(buffer, fastavro.parse_schema(old), record)
    buffer.seek(0)
    read = fastavro.schemaless_reader(buffer, fastavro.parse_schema(old), fastavro.parse_schema(new))
    assert isinstance(read, dict) and read["ddl_command"] is None and read["ddl_columns"] is None
    added = [f for f in new["fields"] if f["name"].startswith("ddl_")]
    assert added and all(f["type"][0] == "null" and f["default"] is None for f in added)


def command(
    schema: str = "public", table: str = "orders", tag: str = "ALTER TABLE", event: str = "ddl_command_end"
) -> DdlCommand:
    return DdlCommand(event, tag, "table", f"{schema}.{table}", schema, table, ORDERS_OID, "", ())


def test_renamed_from_compares_the_known_name() -> None:
    assert renamed_from(command(table="invoices"), ("public", "orders")) == ("public", "orders")
    assert renamed_from(command(schema="sales"), ("public", "orders")) == ("public", "orders")
    assert renamed_from(command(), ("public", "orders")) is None
    assert renamed_from(command(), None) is None
    assert renamed_from(command(tag="DROP TABLE", event="sql_drop"), ("public", "x")) is None


class Recorder:
    def __init__(self) -> None:
        self.produced: list[tuple[EncodedMessage, str, str]] = []
        self.errors: list[tuple[str, Exception]] = []

    def produce(self, message: EncodedMessage, table: str, op: str) -> None:
        self.produced.append((message, table, op))

    def data_error(self, table: str, exc: Exception) -> None:
        self.errors.append((table, exc))


def publisher(selection: DdlSelection) -> tuple[DdlPublisher, Recorder]:
    recorder = Recorder()
    return DdlPublisher(selection, JsonEventSerializer({}), recorder.produce, recorder.data_error), recorder


def test_the_publisher_follows_the_selection_renames_and_drops() -> None:
    orders = TableSchema(ORDERS_OID, "public", "orders", ())
    selection = DdlSelection.of(["public.*"], ["public.secret*"], [orders])
    ddl, recorder = publisher(selection)
    ddl.publish(ddl_event(table="invoices", object_identity="public.invoices"))
    ddl.publish(ddl_event(table="secret_stuff", table_oid=1))
    ddl.publish(ddl_event(schema="sales", table="items", table_oid=2))
    ddl.publish(ddl_event(table="invoices", event="sql_drop", command_tag="DROP TABLE", columns=[]))
    values = [json.loads(m.value or b"") for m, _, _ in recorder.produced]
    assert [(v["table"], v["ddl_renamed_to"], v["ddl_command"]) for v in values] == [
        ("orders", "public.invoices", "ALTER TABLE"),
        ("invoices", None, "DROP TABLE"),
    ]
    assert [(table, op) for _, table, op in recorder.produced] == [
        ("public.orders", DDL),
        ("public.invoices", DDL),
    ]
    assert ORDERS_OID not in selection.names and selection.names[2] == ("sales", "items")
    assert recorder.errors == []


def test_a_bad_message_is_a_data_error_under_the_policy() -> None:
    ddl, recorder = publisher(DdlSelection())
    ddl.publish(DdlEvent(b"garbage", 0x2000, 0, 1, TS))
    assert recorder.produced == [] and isinstance(recorder.errors[0][1], DdlMessageError)


def test_the_trigger_writes_the_prefix_and_format_the_worker_reads() -> None:
    body = ddl_trigger.FUNCTION_BODY
    assert body.count(f"pg_logical_emit_message(true, '{DDL_PREFIX}'") == 2
    assert body.count(f"'version', {DDL_FORMAT_VERSION},") == 2
    for field in ("event", "command_tag", "object_type", "object_identity", "schema", "table", "table_oid",
                  "statement", "columns"):  # fmt: skip
        assert body.count(f"'{field}', ") >= 2, field
