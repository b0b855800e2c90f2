"""Turns decoded pgoutput messages into the worker's events, in commit order.

`ChangeAssembler` is a state machine: feed it every message of the replication session in order and
it returns the `ChangeEvent`s, `TruncateEvent`s and `TransactionCommitted`s they produce.

Why events can be emitted before the Commit arrives: Postgres decodes a transaction only once its
commit record is read, so a Begin already carries the commit LSN (`Begin.final_lsn`). Every event
therefore gets its final `(commit_lsn, seq)` the moment its row arrives, and a 2M-row transaction
flows through without being held in memory.

The exception is a streamed transaction (protocol 2, `streaming = on`), sent while still in
progress: `cdc_worker.core.changes.streamed` buffers it, and it is replayed here at Stream Commit, when its
commit LSN is known.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from cdc_worker.core.changes.events import Key, OpenTransaction, RelationEntry, next_event
from cdc_worker.core.changes.streamed import ChangeAssemblyError, StreamedTransactions
from cdc_worker.core.ddl import DDL_PREFIX, DdlEvent
from cdc_worker.core.lsn import format_lsn
from cdc_worker.core.model import (
    UNCHANGED_TOAST,
    ChangeEvent,
    Op,
    ReplicaIdentity,
    TableSchema,
    TransactionCommitted,
    TruncateEvent,
)
from cdc_worker.core.pgoutput.decoder import (
    Begin,
    Commit,
    Delete,
    Insert,
    LogicalMessage,
    Origin,
    PgOutputMessage,
    Relation,
    Row,
    StreamAbort,
    StreamCommit,
    StreamStart,
    StreamStop,
    Truncate,
    TupleKind,
    Type,
    Update,
)

__all__ = [
    "AssembledEvent",
    "ChangeAssembler",
    "ChangeAssemblyError",
    "KeyColumnsFor",
    "OpenTransaction",
    "replica_identity_key_columns",
]

AssembledEvent = ChangeEvent | TruncateEvent | TransactionCommitted | DdlEvent
KeyColumnsFor = Callable[[TableSchema], tuple[str, ...]]


def replica_identity_key_columns(table: TableSchema) -> tuple[str, ...]:
    """Default Kafka key: the columns pgoutput flags as the replica identity.

    Under REPLICA IDENTITY FULL every column is flagged, which is no key at all, and under NOTHING
    none is; both give an unkeyed table here. The shell passes the primary key from the catalog.
    """
    if table.replica_identity in (ReplicaIdentity.FULL, ReplicaIdentity.NOTHING):
        return ()
    return tuple(column.name for column in table.columns if column.in_replica_identity)


class ChangeAssembler:
    """Feed every decoded message in order; each `feed` returns the events it completes.

    `key_columns_for(table)` picks the Kafka key of each new schema version (the shell passes the
    primary key or replica identity index from the catalog); the default reads pgoutput's flags.
    With `capture_ddl`, a transactional `bottledwater.ddl` message becomes a `DdlEvent` numbered
    among its transaction's changes (`core.ddl`); otherwise it is skipped like any logical message.
    """

    def __init__(
        self, key_columns_for: KeyColumnsFor = replica_identity_key_columns, *, capture_ddl: bool = False
    ) -> None:
        self._key_columns_for = key_columns_for
        self._capture_ddl = capture_ddl
        self._relations: dict[int, RelationEntry] = {}
        self._txn: OpenTransaction | None = None
        self._streams = StreamedTransactions()
        self._replaying_xid: int | None = None

    @property
    def in_transaction(self) -> bool:
        """True while any transaction is open or buffered: a keepalive's position must not be
        acknowledged then (see `AckTracker.idle_position`)."""
        return (
            self._txn is not None
            or self._streams.in_chunk
            or self._streams.pending
            or self._replaying_xid is not None
        )

    def schema(self, relation_oid: int) -> TableSchema:
        """The current schema version of a relation (KeyError if no Relation message named it)."""
        return self._relations[relation_oid].schema

    def insert_target(self, relation_oid: int) -> tuple[TableSchema, OpenTransaction] | None:
        """For the fused Insert path: the schema version and open transaction an Insert of
        `relation_oid` would be assembled under now, or None when only `feed` may take it (no open
        transaction, a replay, a relation no Relation message described)."""
        txn = self._txn  # None inside a stream chunk or a replay: those are never opened as _txn
        entry = self._relations.get(relation_oid)
        if txn is None or entry is None or self._replaying_xid is not None:
            return None
        return entry.schema, txn

    def feed(self, message: PgOutputMessage) -> Iterable[AssembledEvent]:
        """The events `message` completes. The iterable of a Stream Commit is lazy (it replays the
        buffered transaction) and must be exhausted before the next `feed`."""
        if self._replaying_xid is not None:
            raise ChangeAssemblyError(
                f"the events of streamed transaction {self._replaying_xid} were not all consumed "
                "before the next message was fed; exhaust the iterable a Stream Commit returns"
            )
        if self._streams.in_chunk:
            self._streams.add(message)
            return ()
        kind = type(message)
        if kind is Insert and self._txn is not None:  # the hot path, one call deep
            return (self._insert(message, self._txn),)  # type: ignore[arg-type]
        if kind is Insert or kind is Update or kind is Delete or kind is Truncate:
            txn = self._txn
            if txn is None:
                raise ChangeAssemblyError(f"{kind.__name__} outside a transaction: {message!r}")
            return self._change(message, txn)
        if kind is Begin:
            return self._begin(message)  # type: ignore[arg-type]
        if kind is Commit:
            return self._commit(message)  # type: ignore[arg-type]
        if kind is Relation:
            self._relation(message)  # type: ignore[arg-type]
            return ()
        if kind is StreamStart:
            return self._stream_start(message)  # type: ignore[arg-type]
        if kind is StreamCommit:
            return self._stream_commit(message)  # type: ignore[arg-type]
        if kind is StreamAbort:
            return self._stream_abort(message)  # type: ignore[arg-type]
        if kind is StreamStop:
            raise ChangeAssemblyError("Stream Stop without a Stream Start")
        # Origin names the upstream of a cascaded replica; Type names a type whose details the
        # shell reads from pg_type; logical decoding messages are not row changes.
        if kind is LogicalMessage and self._txn is not None:
            return self._logical_message(message, self._txn)  # type: ignore[arg-type]
        if kind is Origin or kind is Type or kind is LogicalMessage:
            return ()
        raise ChangeAssemblyError(f"unexpected message {message!r}")

    # -- transactions ------------------------------------------------------------------------

    def _begin(self, message: Begin) -> tuple[AssembledEvent, ...]:
        if self._txn is not None:
            raise ChangeAssemblyError(f"Begin of xid {message.xid} inside open xid {self._txn.xid}")
        self._txn = OpenTransaction(message.xid, message.final_lsn, message.commit_ts)
        return ()

    def _commit(self, message: Commit) -> tuple[AssembledEvent, ...]:
        txn = self._txn
        if txn is None:
            raise ChangeAssemblyError(f"Commit at {format_lsn(message.commit_lsn)} without a Begin")
        if message.commit_lsn != txn.commit_lsn:
            raise ChangeAssemblyError(
                f"Commit of xid {txn.xid} at {format_lsn(message.commit_lsn)} does not match its "
                f"Begin's final LSN {format_lsn(txn.commit_lsn)}"
            )
        self._txn = None
        return (TransactionCommitted(txn.xid, txn.commit_lsn, message.end_lsn, txn.commit_ts, txn.next_seq),)

    # -- relations ---------------------------------------------------------------------------

    def _relation(self, message: Relation) -> None:
        """A Relation message starts a new schema version; later changes use it."""
        raw = message.schema
        key_columns = tuple(self._key_columns_for(raw))
        schema = TableSchema(raw.oid, raw.namespace, raw.name, raw.columns, raw.replica_identity, key_columns)
        self._relations[raw.oid] = RelationEntry.of(schema)

    def _entry(self, relation_oid: int, message: PgOutputMessage, txn: OpenTransaction) -> RelationEntry:
        entry = self._relations.get(relation_oid)
        if entry is None:
            raise ChangeAssemblyError(
                f"{type(message).__name__} for relation OID {relation_oid} that no Relation message "
                f"described (xid {txn.xid}, commit LSN {format_lsn(txn.commit_lsn)}); Postgres sends the "
                "Relation first, so messages were lost or fed out of order: restart the worker"
            )
        return entry

    def _check_width(self, entry: RelationEntry, row: Row, txn: OpenTransaction) -> None:
        if len(row) != entry.width:
            raise ChangeAssemblyError(
                f"a row of {entry.schema.qualified_name} has {len(row)} columns, its Relation message "
                f"{entry.width} (xid {txn.xid}, commit LSN {format_lsn(txn.commit_lsn)})"
            )

    # -- row changes -------------------------------------------------------------------------

    def _change(self, message: PgOutputMessage, txn: OpenTransaction) -> tuple[AssembledEvent, ...]:
        kind = type(message)
        if kind is Insert:
            return (self._insert(message, txn),)  # type: ignore[arg-type]
        if kind is Update:
            return self._update(message, txn)  # type: ignore[arg-type]
        if kind is Delete:
            return (self._delete(message, txn),)  # type: ignore[arg-type]
        if kind is Truncate:
            return (self._truncate(message, txn),)  # type: ignore[arg-type]
        if kind is Relation:
            self._relation(message)  # type: ignore[arg-type]
        elif kind is LogicalMessage:
            return self._logical_message(message, txn)  # type: ignore[arg-type]
        return ()  # Type inside a streamed transaction

    def _logical_message(self, message: LogicalMessage, txn: OpenTransaction) -> tuple[AssembledEvent, ...]:
        """A DDL the event trigger reported, at its place among the transaction's changes; every
        other logical message is no row change (the shell reads re-snapshot signals itself)."""
        if not (self._capture_ddl and message.transactional and message.prefix == DDL_PREFIX):
            return ()
        seq = txn.next_seq
        txn.next_seq = seq + 1
        return (DdlEvent(message.content, txn.commit_lsn, seq, txn.xid, txn.commit_ts),)

    def _insert(self, message: Insert, txn: OpenTransaction) -> ChangeEvent:
        entry = self._relations.get(message.relation_oid) or self._entry(message.relation_oid, message, txn)
        row = message.new
        if len(row) != entry.width:
            self._check_width(entry, row, txn)
        # An inserted row is complete: only updates can leave TOASTed values out.
        return next_event(txn, Op.INSERT, entry, entry.key_of(row), row)

    def _old_key(self, entry: RelationEntry, kind: TupleKind, old: Row, txn: OpenTransaction) -> Key | None:
        """The key as the old tuple has it, or an error when that tuple does not carry it."""
        if kind is TupleKind.OLD or entry.key_in_identity:
            return entry.key_of(old)
        raise ChangeAssemblyError(
            f"the old row of {entry.schema.qualified_name} does not carry its key columns "
            f"{entry.schema.key_columns} (xid {txn.xid}, commit LSN {format_lsn(txn.commit_lsn)}): "
            "set REPLICA IDENTITY to the key's index (or DEFAULT with it as primary key) or FULL"
        )

    def _update(self, message: Update, txn: OpenTransaction) -> tuple[AssembledEvent, ...]:
        entry = self._entry(message.relation_oid, message, txn)
        row = message.new
        self._check_width(entry, row, txn)
        old, old_kind = message.old, message.old_kind
        if old is not None:
            self._check_width(entry, old, txn)
        toast: tuple[str, ...] = ()
        if UNCHANGED_TOAST in row:
            row, toast = self._fill_unchanged_toast(entry, row, old_kind, old)
        key = entry.key_of(row)
        if key is None:
            return (next_event(txn, Op.UPDATE, entry, None, row, toast=toast),)
        if UNCHANGED_TOAST in key:
            raise ChangeAssemblyError(
                f"an update of {entry.schema.qualified_name} left key columns {entry.schema.key_columns} "
                f"out as unchanged TOAST and the old row does not carry them (xid {txn.xid}): make the key "
                "part of the replica identity"
            )
        # Without an old tuple Postgres saw no change of the replica identity; with one, the old
        # key decides. A changed key is a delete of the old key then an insert under the new one,
        # so that a compacted topic keeps no row under the old key.
        old_key = key if old is None or old_kind is None else self._old_key(entry, old_kind, old, txn)
        if old_key == key:
            return (next_event(txn, Op.UPDATE, entry, key, row, toast=toast),)
        return (
            next_event(txn, Op.DELETE, entry, old_key, None),
            next_event(txn, Op.INSERT, entry, key, row, toast=toast),
        )

    @staticmethod
    def _fill_unchanged_toast(
        entry: RelationEntry, new: Row, old_kind: TupleKind | None, old: Row | None
    ) -> tuple[Row, tuple[str, ...]]:
        """Take unchanged TOASTed values from the old tuple where it carries them (FULL identity,
        or an identity column); name the rest in `unchanged_toast`."""
        values = list(new)
        missing: list[str] = []
        for index, value in enumerate(new):
            if value is not UNCHANGED_TOAST:
                continue
            if old is not None and (old_kind is TupleKind.OLD or index in entry.identity_indexes):
                old_value = old[index]
                if old_value is not UNCHANGED_TOAST:
                    values[index] = old_value
                    continue
            missing.append(entry.schema.columns[index].name)
        return tuple(values), tuple(missing)

    def _delete(self, message: Delete, txn: OpenTransaction) -> ChangeEvent:
        entry = self._entry(message.relation_oid, message, txn)
        self._check_width(entry, message.old, txn)
        # Deletes of unkeyed tables are emitted too: the publisher decides whether to drop them.
        key = None if not entry.schema.is_keyed else self._old_key(entry, message.old_kind, message.old, txn)
        return next_event(txn, Op.DELETE, entry, key, None)

    def _truncate(self, message: Truncate, txn: OpenTransaction) -> TruncateEvent:
        tables = tuple(self._entry(oid, message, txn).schema for oid in message.relation_oids)
        seq = txn.next_seq
        txn.next_seq = seq + 1
        return TruncateEvent(
            tables, message.cascade, message.restart_identity, txn.commit_lsn, seq, txn.xid, txn.commit_ts
        )

    # -- streamed transactions (protocol 2) --------------------------------------------------

    def _stream_start(self, message: StreamStart) -> tuple[AssembledEvent, ...]:
        if self._txn is not None:
            raise ChangeAssemblyError(f"Stream Start of xid {message.xid} inside open xid {self._txn.xid}")
        self._streams.start(message)
        return ()

    def _stream_abort(self, message: StreamAbort) -> tuple[AssembledEvent, ...]:
        self._streams.abort(message)
        return ()

    def _stream_commit(self, message: StreamCommit) -> Iterator[AssembledEvent]:
        messages = self._streams.commit(message.xid)
        self._replaying_xid = message.xid
        return self._replay(messages, message)

    def begin_spooled(self, commit: StreamCommit) -> OpenTransaction:
        """A streamed transaction the shell spooled itself (`spooled_streams`), replayed at its
        Stream Commit: `replay_spooled` each kept message in order (its events take the returned
        transaction's next `seq`, as the shell's already encoded changes do), then `end_spooled`."""
        if self._txn is not None or self._replaying_xid is not None or self._streams.in_chunk:
            raise ChangeAssemblyError(f"Stream Commit of xid {commit.xid} inside another transaction")
        self._replaying_xid = commit.xid
        return OpenTransaction(commit.xid, commit.commit_lsn, commit.commit_ts)

    def replay_spooled(self, message: PgOutputMessage, txn: OpenTransaction) -> tuple[AssembledEvent, ...]:
        """One kept message (Relation, Truncate, logical message) of the transaction replayed."""
        return self._change(message, txn)

    def end_spooled(self, txn: OpenTransaction, commit: StreamCommit) -> TransactionCommitted:
        self._replaying_xid = None
        return TransactionCommitted(txn.xid, txn.commit_lsn, commit.end_lsn, txn.commit_ts, txn.next_seq)

    def _replay(self, messages: list[PgOutputMessage], commit: StreamCommit) -> Iterator[AssembledEvent]:
        txn = OpenTransaction(commit.xid, commit.commit_lsn, commit.commit_ts)
        messages.reverse()  # pop from the end, so each message is freed as soon as it is replayed
        while messages:
            yield from self._change(messages.pop(), txn)
        yield TransactionCommitted(txn.xid, txn.commit_lsn, commit.end_lsn, txn.commit_ts, txn.next_seq)
        # Only a fully consumed replay clears the guard: an abandoned one must not pass silently.
        self._replaying_xid = None
