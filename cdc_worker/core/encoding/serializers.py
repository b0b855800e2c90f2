"""Serializers: `ChangeEvent` / `TruncateEvent` -> Kafka-ready `EncodedMessage`s.

They are plain callables apart from the producer (as confluent-kafka's `AvroSerializer` is), so the
encoding is tested without a broker. Per relation version (one `TableSchema` object) they compile
once: the column types, the topic, the key and value writers, and for Avro the schema ids, which
are registered through the schema registry client the first time a version is seen (subjects
`<topic>-key` and `<topic>-value`, TopicNameStrategy). After that a row is one call per part.

A value that cannot be published raises `pgtypes.UnrepresentableValue` naming table, column and fix.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Literal, NamedTuple, Protocol

from confluent_kafka.schema_registry import Schema

from cdc_worker.core.ddl import DdlCommand, DdlEvent
from cdc_worker.core.encoding.avro_writer import (
    FusedWriter,
)
from cdc_worker.core.model import (
    UNCHANGED_TOAST,
    ChangeEvent,
    Op,
    SnapshotControl,
    TableSchema,
    TruncateEvent,
    TypeInfo,
)
from cdc_worker.core.pgtypes.mapping import (
    DEFAULT_OPTIONS,
    ColumnType,
    TypeMappingOptions,
    find_unrepresentable,
    null_key_error,
    table_column_types,
)
from cdc_worker.core.pgtypes.temporal import MICROS_PER_SECOND, SECONDS_PER_DAY
from kafka_contract.control import (
    DDL,
    PROGRESS,
    PROGRESS_KEY,
    STREAMED_COMMIT,
    commit_key,
    commit_record,
    ddl_key,
    progress_record,
    snapshot_key,
)
from kafka_contract.headers import (
    HEADER_COMMIT_TS,
    HEADER_LSN,
    HEADER_OP,
    HEADER_SEQ,
    HEADER_UNCHANGED,
    HEADER_XID,
    OP_TRUNCATE,
    iso_utc,
)
from kafka_contract.topics import control_topic_name, topic_name

Header = tuple[str, bytes]
Headers = list[Header]
RowWriter = Callable[[Sequence[Any]], bytes]
KeyedRowWriter = Callable[[Sequence[Any]], tuple[bytes, bytes]]
# The fused Insert path's encoder: Insert message -> key (None: unkeyed) and value, or None.
InsertEncoder = FusedWriter

# Bound on the identity cache of compiled plans; old relation versions are simply recompiled.
MAX_CACHED_PLANS = 4096

# NamedTuple's generated __new__ is a Python call; building the tuple directly skips it.
_new_message = tuple.__new__
_OP_HEADERS = {op: (HEADER_OP, op.value.encode()) for op in Op}
_TRUNCATE_HEADER = (HEADER_OP, OP_TRUNCATE.encode())
INSERT_OP_HEADER = _OP_HEADERS[Op.INSERT]
# `bw.seq` headers of the first changes of every transaction, formatted once (header tuples are
# never mutated, so messages can share them); most transactions are shorter than this.
SEQ_HEADERS_CACHED = 4096


def seq_header(seq: int) -> Header:
    """The `bw.seq` header (`SEQ_HEADERS[seq]` is the same, preformatted, below SEQ_HEADERS_CACHED)."""
    return (HEADER_SEQ, str(seq).encode())


SEQ_HEADERS = tuple(seq_header(seq) for seq in range(SEQ_HEADERS_CACHED))
# The `bw.lsn`, `bw.xid` and `bw.commit_ts` headers every event of a transaction shares
# (`EventSerializer.transaction_headers`).
TransactionHeaders = tuple[Header, Header, Header]


def change_headers(op: Op, seq: int, transaction: TransactionHeaders, unchanged: tuple[str, ...]) -> Headers:
    """The `bw.*` headers of one change: `bw.op`, `bw.lsn`, `bw.seq`, `bw.xid`, `bw.commit_ts`, and
    `bw.unchanged` when TOASTed columns are left out."""
    lsn_header, xid_header, ts_header = transaction
    headers = [
        _OP_HEADERS[op],
        lsn_header,
        SEQ_HEADERS[seq] if seq < SEQ_HEADERS_CACHED else seq_header(seq),
        xid_header,
        ts_header,
    ]
    if unchanged:
        headers.append((HEADER_UNCHANGED, ",".join(unchanged).encode()))
    return headers


class EncodedMessage(NamedTuple):
    """One Kafka message: value None is a tombstone, key None an unkeyed table's message."""

    topic: str
    key: bytes | None
    value: bytes | None
    headers: Headers


class SchemaRegistrar(Protocol):
    """The part of confluent-kafka's `SchemaRegistryClient` the Avro serializer uses."""

    def register_schema(self, subject_name: str, schema: Schema, normalize_schemas: bool = False) -> int: ...


def epoch_micros(timestamp: datetime) -> int:
    """Microseconds since the epoch of a datetime (naive: UTC)."""
    aware = timestamp if timestamp.tzinfo else timestamp.replace(tzinfo=UTC)
    delta = aware - datetime(1970, 1, 1, tzinfo=UTC)
    return (delta.days * SECONDS_PER_DAY + delta.seconds) * MICROS_PER_SECOND + delta.microseconds


class Plan(NamedTuple):
    """Everything compiled for one relation version, unpacked in the hot path."""

    table: TableSchema
    topic: str
    key_writer: RowWriter | None
    value_writer: RowWriter
    # Key and value from the row in one call (keyed tables); None for unkeyed ones.
    row_writer: KeyedRowWriter | None
    column_types: tuple[ColumnType, ...]
    # Builds the fused Insert path's encoder (`fast_insert`) around a tuple reader it is handed.
    fuse: Callable[[TupleReading], InsertEncoder]


class TupleReading(Protocol):
    """How the fused Insert path reads a pgoutput tuple (`core.pgoutput.insert_reader` is one),
    handed to `insert_encoder` so that the encoders depend on no decoder."""

    def source(self, column_count: int, raw_strings: Collection[int]) -> tuple[list[str], dict[str, object]]:
        """Function-body lines binding `v0`, `v1`, ... from `buf` (or returning None), and their names."""

    def reader(self, column_count: int) -> Callable[[bytes], tuple[Any, ...] | None]:
        """A function from the message to its row, or None when it declines."""


def reading_into(
    read: Callable[[bytes], tuple[Any, ...] | None],
    write: Callable[[Sequence[Any]], tuple[bytes | None, bytes]],
) -> InsertEncoder:
    def encode(message: bytes) -> tuple[bytes | None, bytes] | None:
        row = read(message)
        return None if row is None else write(row)

    return encode


def is_string(schema: object) -> bool:
    """An Avro string, possibly with a logical type (uuid)."""
    return schema == "string" or (isinstance(schema, dict) and schema.get("type") == "string")


class EventSerializer:
    """What both formats share: plan caching, `bw.*` headers, tombstones, TRUNCATE fan-out."""

    _target: Literal["avro", "json"]

    def __init__(
        self,
        type_infos: Mapping[int, TypeInfo],
        *,
        topic_prefix: str | None = None,
        options: TypeMappingOptions = DEFAULT_OPTIONS,
    ) -> None:
        self.type_infos = type_infos
        self.topic_prefix = topic_prefix
        self.options = options
        self.control_topic = control_topic_name(topic_prefix)
        # Keyed by id(): hashing a TableSchema walks all its columns, too slow for every row. The
        # plan holds the table, so the id cannot be reused while the entry lives.
        self._plans: dict[int, Plan] = {}
        self._fused: dict[int, tuple[TableSchema, InsertEncoder]] = {}
        # Bumped by clear_cache, so that holders of compiled encoders (`fast_insert`) drop theirs.
        self.cache_generation = 0
        self._lsn = self._xid = -1
        self._commit_ts: datetime | None = None
        self._transaction_headers: TransactionHeaders = (("", b""), ("", b""), ("", b""))

    def __call__(self, event: ChangeEvent) -> EncodedMessage | None:
        """The message for `event`, or None for the delete of an unkeyed table (not published)."""
        # The hot path: locals and tuple unpacking only, no property lookups.
        table = event.table
        plan = self._plans.get(id(table))
        if plan is None or plan[0] is not table:
            plan = self._compile(table)
        _, topic, key_writer, value_writer, row_writer, _, _ = plan
        # The assembler hands every event of a transaction the same commit_ts object.
        if event.commit_ts is not self._commit_ts or event.commit_lsn != self._lsn or event.xid != self._xid:
            self._start_transaction(event.commit_lsn, event.xid, event.commit_ts)
        unchanged = event.unchanged_toast
        headers = change_headers(event.op, event.seq, self._transaction_headers, unchanged)
        row = event.row
        try:
            if row is None:
                if key_writer is None:
                    return None
                return _new_message(EncodedMessage, (topic, key_writer(event.key), None, headers))  # type: ignore[arg-type]
            if unchanged:
                row = tuple(None if value is UNCHANGED_TOAST else value for value in row)
            if row_writer is not None:  # keyed: the key's values are the row's, by the model's contract
                row_key, row_value = row_writer(row)
                return _new_message(EncodedMessage, (topic, row_key, row_value, headers))
            key = None if key_writer is None else key_writer(event.key)  # type: ignore[arg-type]
            return _new_message(EncodedMessage, (topic, key, value_writer(row), headers))
        except Exception as exc:
            raise self._explain(plan, event, exc) from exc

    def insert_encoder(self, table: TableSchema, reading: TupleReading) -> tuple[str, InsertEncoder]:
        """For the fused Insert path (`fast_insert`): `table`'s topic, and the function from a whole
        Insert message of it (header checked by the caller) to the key (None when unkeyed) and value
        `self` writes for its row, or None when it declines (see `insert_reader`). It may raise on
        bad data; its caller then leaves the message to the general path. Compiles the plan (and
        registers its schemas) if needed."""
        plan = self._plans.get(id(table))
        if plan is None or plan[0] is not table:
            plan = self._compile(table)
        fused = self._fused.get(id(table))
        if fused is None or fused[0] is not table:
            fused = self._fused[id(table)] = (table, plan.fuse(reading))
        return plan.topic, fused[1]

    def transaction_headers(self, commit_lsn: int, xid: int, commit_ts: datetime) -> TransactionHeaders:
        """The `bw.lsn`, `bw.xid` and `bw.commit_ts` headers of every event of a transaction."""
        if commit_ts is not self._commit_ts or commit_lsn != self._lsn or xid != self._xid:
            self._start_transaction(commit_lsn, xid, commit_ts)
        return self._transaction_headers

    def truncate(self, event: TruncateEvent) -> list[EncodedMessage]:
        """One control-topic message per truncated table, keyed by its qualified name."""
        self._start_transaction(event.commit_lsn, event.xid, event.commit_ts)
        lsn_header, xid_header, ts_header = self._transaction_headers
        headers = [_TRUNCATE_HEADER, lsn_header, (HEADER_SEQ, str(event.seq).encode()), xid_header, ts_header]
        return [
            EncodedMessage(
                self.control_topic,
                self._control_key(table.qualified_name),
                self._control_value(
                    {
                        "op": OP_TRUNCATE,
                        "schema": table.namespace,
                        "table": table.name,
                        "topic": topic_name(table, self.topic_prefix),
                        "lsn": event.commit_lsn,
                        "seq": event.seq,
                        "xid": event.xid,
                        "commit_ts": event.commit_ts,
                        "cascade": event.cascade,
                        "restart_identity": event.restart_identity,
                    }  # fmt: skip
                ),
                list(headers),
            )
            for table in event.tables
        ]

    def snapshot_control(self, event: SnapshotControl) -> EncodedMessage:
        """A re-snapshot event, keyed `<schema.table>#snapshot` so that compaction keeps the newest
        one of each table next to (not instead of) its newest TRUNCATE."""
        record = {
            "op": event.op, "schema": event.namespace, "table": event.name, "topic": event.topic,
            "lsn": event.commit_lsn, "seq": event.seq, "xid": event.xid, "commit_ts": event.commit_ts,
            "cascade": False, "restart_identity": False, "snapshot_id": event.request_id,
            "rows": event.rows, "reason": event.reason,
        }  # fmt: skip
        headers = [
            (HEADER_OP, event.op.encode()),
            (HEADER_LSN, str(event.commit_lsn).encode()),
            seq_header(event.seq),
            (HEADER_XID, str(event.xid).encode()),
            (HEADER_COMMIT_TS, iso_utc(event.commit_ts).encode()),
        ]
        key = self._control_key(snapshot_key(f"{event.namespace}.{event.name}"))
        return EncodedMessage(self.control_topic, key, self._control_value(record), headers)

    def ddl(
        self, event: DdlEvent, command: DdlCommand, *, renamed_from: tuple[str, str] | None = None
    ) -> EncodedMessage:
        """A DDL event, keyed `<schema.table>#ddl` (compaction keeps it beside the table's TRUNCATE).
        A rename is published under the table's previous name (`renamed_from`), whose topic and
        Delta table it concerns, with the new name in `ddl_renamed_to`."""
        namespace, name = renamed_from or (command.schema, command.table)
        record = {
            "op": DDL, "schema": namespace, "table": name,
            "topic": topic_name(TableSchema(0, namespace, name, ()), self.topic_prefix),
            "lsn": event.commit_lsn, "seq": event.seq, "xid": event.xid, "commit_ts": event.commit_ts,
            "cascade": False, "restart_identity": False,
            "ddl_command": command.command_tag, "ddl_object_type": command.object_type,
            "ddl_object_identity": command.object_identity, "ddl_statement": command.statement,
            "ddl_renamed_to": command.qualified_name if renamed_from else None,
            "ddl_columns": [
                {"name": c.name, "type": c.type, "base_type": c.base_type, "typmod": c.typmod,
                 "array": c.array, "not_null": c.not_null}
                for c in command.columns
            ],
        }  # fmt: skip
        headers = [
            (HEADER_OP, DDL.encode()),
            (HEADER_LSN, str(event.commit_lsn).encode()),
            seq_header(event.seq),
            (HEADER_XID, str(event.xid).encode()),
            (HEADER_COMMIT_TS, iso_utc(event.commit_ts).encode()),
        ]
        key = self._control_key(ddl_key(f"{namespace}.{name}"))
        return EncodedMessage(self.control_topic, key, self._control_value(record), headers)

    def streamed_commit(self, xid: int, commit_lsn: int, commit_ts: datetime) -> EncodedMessage:
        """The commit event of a transaction produced before its commit (`kafka_contract.control`),
        keyed `#commit#<xid>`, with its commit's headers."""
        headers = [
            (HEADER_OP, STREAMED_COMMIT.encode()),
            (HEADER_LSN, str(commit_lsn).encode()),
            seq_header(0),
            (HEADER_XID, str(xid).encode()),
            (HEADER_COMMIT_TS, iso_utc(commit_ts).encode()),
        ]
        record = commit_record(xid, commit_lsn, commit_ts)
        return EncodedMessage(
            self.control_topic, self._control_key(commit_key(xid)), self._control_value(record), headers
        )

    def progress(self, lsn: int, at: datetime, offsets: Mapping[tuple[str, int], int]) -> EncodedMessage:
        """The worker's progress (`kafka_contract.control`), keyed `#progress`: every transaction
        committed at or before `lsn` lies in Kafka below `offsets`."""
        headers = [(HEADER_OP, PROGRESS.encode()), (HEADER_LSN, str(lsn).encode())]
        record = progress_record(lsn, at, offsets)
        return EncodedMessage(
            self.control_topic, self._control_key(PROGRESS_KEY), self._control_value(record), headers
        )

    def topic_for(self, table: TableSchema) -> str:
        """The topic `table`'s events go to (compiling its plan if needed)."""
        plan = self._plans.get(id(table))
        return (plan if plan is not None and plan.table is table else self._compile(table)).topic

    def clear_cache(self) -> None:
        """Forget compiled relation versions (e.g. after the shell reloaded `type_infos`)."""
        self._plans.clear()
        self._fused.clear()
        self.cache_generation += 1

    def _start_transaction(self, commit_lsn: int, xid: int, commit_ts: datetime) -> None:
        # Every event of a transaction (and of a snapshot) shares these, so they are formatted once.
        self._lsn, self._xid, self._commit_ts = commit_lsn, xid, commit_ts
        self._transaction_headers = (
            (HEADER_LSN, str(commit_lsn).encode()),
            (HEADER_XID, str(xid).encode()),
            (HEADER_COMMIT_TS, iso_utc(commit_ts).encode()),
        )

    def _compile(self, table: TableSchema) -> Plan:
        column_types = table_column_types(table, self.type_infos, self.options)
        plan = self._build_plan(table, topic_name(table, self.topic_prefix), column_types)
        if len(self._plans) >= MAX_CACHED_PLANS:
            self._plans.clear()
        self._plans[id(table)] = plan
        return plan

    def _explain(self, plan: Plan, event: ChangeEvent, exc: Exception) -> Exception:
        """Turn a failure of the compiled writers into the data error that names its cause."""
        table = event.table
        if table.is_keyed:
            if event.key is None or len(event.key) != len(table.key_columns):
                return ValueError(
                    f"{event.op} event of {table.qualified_name} lacks its key {table.key_columns}"
                )
            key_types = [plan.column_types[i] for i in table.key_indexes]
            for name, key_type, value in zip(table.key_columns, key_types, event.key, strict=True):
                if value is None:
                    return null_key_error(table, name, key_type.pg_name)
            found = find_unrepresentable(table, table.key_columns, key_types, event.key, self._target)
            if found is not None:
                return found
        if event.row is not None:
            if len(event.row) != len(table.columns):
                return ValueError(
                    f"{event.op} event of {table.qualified_name} carries {len(event.row)} values "
                    f"for {len(table.columns)} columns"
                )
            names = [c.name for c in table.columns]
            found = find_unrepresentable(table, names, plan.column_types, event.row, self._target)
            if found is not None:
                return found
        return exc

    def _build_plan(self, table: TableSchema, topic: str, column_types: tuple[ColumnType, ...]) -> Plan:
        raise NotImplementedError

    def _control_key(self, qualified_name: str) -> bytes:
        raise NotImplementedError

    def _control_value(self, record: dict[str, Any]) -> bytes:
        raise NotImplementedError
