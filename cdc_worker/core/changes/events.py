"""What the assembler builds events from: each relation version with what the hot path needs
precomputed (`RelationEntry`), the transaction being assembled (`OpenTransaction`, which numbers
`seq`), and `next_event`, which makes a transaction's next `ChangeEvent` and numbers it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from datetime import datetime
from operator import itemgetter

from cdc_worker.core.model import ChangeEvent, ColumnValue, Op, TableSchema
from cdc_worker.core.pgoutput.decoder import Row

Key = tuple[ColumnValue, ...]


def _unkeyed(_row: Row) -> None:
    return None


def key_getter(indexes: tuple[int, ...]) -> Callable[[Row], Key | None]:
    """A fast `row -> key` for one schema; itemgetter returns a bare value for one index."""
    if not indexes:
        return _unkeyed
    if len(indexes) == 1:
        (index,) = indexes

        def single(row: Row) -> Key:
            return (row[index],)

        return single
    getter = itemgetter(*indexes)

    def multiple(row: Row) -> Key:
        key: Key = getter(row)
        return key

    return multiple


@dataclass(frozen=True, slots=True)
class RelationEntry:
    """One schema version, with what the hot path needs precomputed."""

    schema: TableSchema
    width: int
    key_of: Callable[[Row], Key | None]
    # Columns whose values a 'K' old tuple carries (the rest are sent as NULL).
    identity_indexes: frozenset[int]
    # Whether a 'K' old tuple carries every key column, so that the old key can be read from it.
    key_in_identity: bool

    @classmethod
    def of(cls, schema: TableSchema) -> RelationEntry:
        identity = frozenset(i for i, column in enumerate(schema.columns) if column.in_replica_identity)
        return cls(
            schema=schema,
            width=len(schema.columns),
            key_of=key_getter(schema.key_indexes),
            identity_indexes=identity,
            key_in_identity=identity.issuperset(schema.key_indexes),
        )


@dataclass(slots=True)
class OpenTransaction:
    """The transaction being assembled. Whoever emits one of its events takes `next_seq` and
    increments it (`next_event` here, the fused Insert path in `fast_insert`)."""

    xid: int
    commit_lsn: int
    commit_ts: datetime
    next_seq: int = 0


# ChangeEvent's generated __init__ sets each frozen field through object.__setattr__, about 1 us per
# event here: a sixth of the whole pipeline's per-row budget. Setting its slots through their
# descriptors costs half that. This relies on ChangeEvent's exact fields, so it is used only while
# they are the ones below (test_changes fails when they are not, and checks equality with __init__).
_EVENT_FIELDS = ("op", "table", "key", "row", "unchanged_toast", "commit_lsn", "seq", "xid", "commit_ts")
FAST_EVENT_CONSTRUCTION = tuple(f.name for f in fields(ChangeEvent)) == _EVENT_FIELDS
_object_new = object.__new__


def _no_setter(event: ChangeEvent, value: object) -> None:
    raise AssertionError("fast ChangeEvent construction used while its fields do not match")


# Resolved only when the fields match, so that a renamed field cannot break the import.
_set_op, _set_table, _set_key, _set_row, _set_toast, _set_lsn, _set_seq, _set_xid, _set_ts = (
    getattr(ChangeEvent, name).__set__ if FAST_EVENT_CONSTRUCTION else _no_setter for name in _EVENT_FIELDS
)


def next_event(
    txn: OpenTransaction,
    op: Op,
    entry: RelationEntry,
    key: Key | None,
    row: Row | None,
    *,
    toast: tuple[str, ...] = (),
) -> ChangeEvent:
    """The next event of `txn`: numbering here keeps `seq` gapless across every kind of event."""
    seq = txn.next_seq
    txn.next_seq = seq + 1
    if not FAST_EVENT_CONSTRUCTION:
        return ChangeEvent(op, entry.schema, key, row, toast, txn.commit_lsn, seq, txn.xid, txn.commit_ts)
    event: ChangeEvent = _object_new(ChangeEvent)
    _set_op(event, op)
    _set_table(event, entry.schema)
    _set_key(event, key)
    _set_row(event, row)
    _set_toast(event, toast)
    _set_lsn(event, txn.commit_lsn)
    _set_seq(event, seq)
    _set_xid(event, txn.xid)
    _set_ts(event, txn.commit_ts)
    return event
