"""ChangeAssembler fed decoded messages: the event sequences Kafka and Delta rely on."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime

import pytest

from cdc_worker.core.changes import events as change_events
from cdc_worker.core.changes.assembler import (
    AssembledEvent,
    ChangeAssembler,
    ChangeAssemblyError,
    replica_identity_key_columns,
)
from cdc_worker.core.model import (
    UNCHANGED_TOAST,
    ChangeEvent,
    Column,
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
    StreamAbort,
    StreamCommit,
    StreamStart,
    StreamStop,
    Truncate,
    TupleKind,
    Type,
    Update,
)

TS = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
USERS = 16384
ORDERS = 16390
TEXT, INT4 = 25, 23


def relation(
    oid: int = USERS,
    identity: ReplicaIdentity = ReplicaIdentity.DEFAULT,
    columns: tuple[str, ...] = ("id", "name", "bio"),
    flagged: tuple[str, ...] = ("id",),
    xid: int | None = None,
) -> Relation:
    cols = tuple(Column(c, INT4 if c == "id" else TEXT, -1, c in flagged) for c in columns)
    schema = TableSchema(oid, "public", f"t{oid}", cols, identity)
    return Relation(schema, tuple(int(c.in_replica_identity) for c in cols), xid)


def begin(xid: int = 700, lsn: int = 0x1000) -> Begin:
    return Begin(lsn, TS, 0, xid)


def commit(lsn: int = 0x1000, end: int = 0x1030) -> Commit:
    return Commit(0, lsn, end, TS, 0)


def feed_all(assembler: ChangeAssembler, messages: Iterable[PgOutputMessage]) -> list[AssembledEvent]:
    return [event for message in messages for event in assembler.feed(message)]


def changes_of(events: list[AssembledEvent]) -> list[tuple[object, ...]]:
    """(op, key, row, unchanged, seq) of each ChangeEvent: what a test usually asserts on."""
    return [(e.op, e.key, e.row, e.unchanged_toast, e.seq) for e in events if isinstance(e, ChangeEvent)]


def test_transaction_events_carry_commit_lsn_seq_and_end() -> None:
    assembler = ChangeAssembler()
    events = feed_all(
        assembler,
        [
            relation(),
            begin(),
            Insert(USERS, ("1", "ann", None)),
            Update(USERS, None, None, ("1", "anne", None)),
            Delete(USERS, TupleKind.KEY, ("1", None, None)),
            commit(),
        ],
    )
    assert changes_of(events) == [
        (Op.INSERT, ("1",), ("1", "ann", None), (), 0),
        (Op.UPDATE, ("1",), ("1", "anne", None), (), 1),
        (Op.DELETE, ("1",), None, (), 2),
    ]
    assert all(e.commit_lsn == 0x1000 and e.xid == 700 and e.commit_ts == TS for e in events)
    assert events[-1] == TransactionCommitted(700, 0x1000, 0x1030, TS, 3)
    first = events[0]
    assert isinstance(first, ChangeEvent) and first.table.key_columns == ("id",)


def test_events_are_emitted_before_the_commit_arrives() -> None:
    assembler = ChangeAssembler()
    feed_all(assembler, [relation(), begin()])
    (event,) = assembler.feed(Insert(USERS, ("1", "a", None)))
    assert isinstance(event, ChangeEvent) and event.commit_lsn == 0x1000
    assert assembler.in_transaction


def test_fast_event_construction_matches_the_constructor() -> None:
    assert change_events.FAST_EVENT_CONSTRUCTION, "ChangeEvent's fields changed: update events._EVENT_FIELDS"
    assembler = ChangeAssembler()
    (event,) = feed_all(assembler, [relation(), begin(), Insert(USERS, ("1", "a", None))])
    schema = assembler.schema(USERS)
    expected = ChangeEvent(Op.INSERT, schema, ("1",), ("1", "a", None), (), 0x1000, 0, 700, TS)
    assert event == expected and hash(event) == hash(expected) and repr(event) == repr(expected)


def test_constructor_fallback_gives_the_same_events(monkeypatch: pytest.MonkeyPatch) -> None:
    messages: list[PgOutputMessage] = [relation(), begin(), Insert(USERS, ("1", "a", None)), commit()]
    fast = feed_all(ChangeAssembler(), messages)
    monkeypatch.setattr(change_events, "FAST_EVENT_CONSTRUCTION", False)
    assert feed_all(ChangeAssembler(), messages) == fast


def test_key_change_is_delete_of_old_key_then_insert() -> None:
    events = feed_all(
        ChangeAssembler(),
        [
            relation(),
            begin(),
            Update(USERS, TupleKind.KEY, ("1", None, None), ("2", "ann", "bio")),
            Insert(USERS, ("3", "bob", None)),
            commit(),
        ],
    )
    assert changes_of(events) == [
        (Op.DELETE, ("1",), None, (), 0),
        (Op.INSERT, ("2",), ("2", "ann", "bio"), (), 1),
        (Op.INSERT, ("3",), ("3", "bob", None), (), 2),
    ]
    assert events[-1] == TransactionCommitted(700, 0x1000, 0x1030, TS, 3)


def test_full_identity_with_primary_key_from_the_shell() -> None:
    assembler = ChangeAssembler(key_columns_for=lambda table: ("id",))
    all_flagged = ("id", "name", "bio")
    events = feed_all(
        assembler,
        [
            relation(identity=ReplicaIdentity.FULL, flagged=all_flagged),
            begin(),
            # Same key, other columns changed: one update, not delete+insert.
            Update(USERS, TupleKind.OLD, ("1", "a", "x"), ("1", "b", "x")),
            Update(USERS, TupleKind.OLD, ("1", "b", "x"), ("5", "b", "x")),
            Delete(USERS, TupleKind.OLD, ("5", "b", "x")),
        ],
    )
    assert changes_of(events) == [
        (Op.UPDATE, ("1",), ("1", "b", "x"), (), 0),
        (Op.DELETE, ("1",), None, (), 1),
        (Op.INSERT, ("5",), ("5", "b", "x"), (), 2),
        (Op.DELETE, ("5",), None, (), 3),
    ]


def test_default_key_of_full_identity_is_unkeyed_and_deletes_are_still_emitted() -> None:
    table = relation(identity=ReplicaIdentity.FULL, flagged=("id", "name", "bio"))
    assert replica_identity_key_columns(table.schema) == ()
    events = feed_all(
        ChangeAssembler(),
        [
            table,
            begin(),
            Insert(USERS, ("1", "a", None)),
            Update(USERS, TupleKind.OLD, ("1", "a", None), ("2", "a", None)),
            Delete(USERS, TupleKind.OLD, ("2", "a", None)),
        ],
    )
    assert changes_of(events) == [
        (Op.INSERT, None, ("1", "a", None), (), 0),
        (Op.UPDATE, None, ("2", "a", None), (), 1),
        (Op.DELETE, None, None, (), 2),
    ]


def test_unchanged_toast_with_default_identity_is_named() -> None:
    events = feed_all(
        ChangeAssembler(),
        [relation(), begin(), Update(USERS, None, None, ("1", "new name", UNCHANGED_TOAST))],
    )
    assert changes_of(events) == [(Op.UPDATE, ("1",), ("1", "new name", UNCHANGED_TOAST), ("bio",), 0)]


def test_unchanged_toast_with_full_identity_is_filled_from_the_old_tuple() -> None:
    long_bio = "x" * 10_000
    events = feed_all(
        ChangeAssembler(key_columns_for=lambda table: ("id",)),
        [
            relation(identity=ReplicaIdentity.FULL, flagged=("id", "name", "bio")),
            begin(),
            Update(USERS, TupleKind.OLD, ("1", "old", long_bio), ("1", "new", UNCHANGED_TOAST)),
            # A key change keeps the filled value on the new key's row.
            Update(USERS, TupleKind.OLD, ("1", "new", long_bio), ("2", "new", UNCHANGED_TOAST)),
        ],
    )
    assert changes_of(events) == [
        (Op.UPDATE, ("1",), ("1", "new", long_bio), (), 0),
        (Op.DELETE, ("1",), None, (), 1),
        (Op.INSERT, ("2",), ("2", "new", long_bio), (), 2),
    ]


def test_unchanged_toast_key_column_is_taken_from_the_key_tuple() -> None:
    # Postgres logs the old key when a key column is stored out of line, even if it did not change.
    events = feed_all(
        ChangeAssembler(),
        [
            relation(columns=("id", "name"), flagged=("id",)),
            begin(),
            Update(USERS, TupleKind.KEY, ("1", None), (UNCHANGED_TOAST, "n")),
        ],
    )
    assert changes_of(events) == [(Op.UPDATE, ("1",), ("1", "n"), (), 0)]


def test_unchanged_toast_key_without_old_tuple_is_an_error() -> None:
    assembler = ChangeAssembler()
    feed_all(assembler, [relation(columns=("id", "name")), begin()])
    with pytest.raises(ChangeAssemblyError, match="unchanged TOAST"):
        assembler.feed(Update(USERS, None, None, (UNCHANGED_TOAST, "n")))


def test_delete_whose_old_tuple_lacks_the_key_is_an_error() -> None:
    # Key chosen by the shell (id) is not the replica identity index (name).
    assembler = ChangeAssembler(key_columns_for=lambda table: ("id",))
    feed_all(assembler, [relation(identity=ReplicaIdentity.INDEX, flagged=("name",)), begin()])
    with pytest.raises(ChangeAssemblyError, match="REPLICA IDENTITY"):
        assembler.feed(Delete(USERS, TupleKind.KEY, (None, "ann", None)))


def test_truncate() -> None:
    events = feed_all(
        ChangeAssembler(),
        [
            relation(),
            relation(oid=ORDERS),
            begin(),
            Insert(USERS, ("1", "a", None)),
            Truncate((USERS, ORDERS), cascade=True, restart_identity=False),
            commit(),
        ],
    )
    truncate = events[1]
    assert isinstance(truncate, TruncateEvent)
    assert [t.oid for t in truncate.tables] == [USERS, ORDERS]
    assert (truncate.cascade, truncate.restart_identity, truncate.seq, truncate.commit_lsn) == (
        True,
        False,
        1,
        0x1000,
    )
    assert events[-1] == TransactionCommitted(700, 0x1000, 0x1030, TS, 2)


def test_relation_change_mid_transaction_is_a_new_schema_version() -> None:
    events = feed_all(
        ChangeAssembler(),
        [
            relation(),
            begin(),
            Insert(USERS, ("1", "a", None)),
            relation(columns=("id", "name", "bio", "age")),  # ALTER TABLE ADD COLUMN in the same txn
            Insert(USERS, ("2", "b", None, "30")),
            commit(),
        ],
    )
    first, second = events[0], events[1]
    assert isinstance(first, ChangeEvent) and isinstance(second, ChangeEvent)
    assert [c.name for c in first.table.columns] == ["id", "name", "bio"]
    assert [c.name for c in second.table.columns] == ["id", "name", "bio", "age"]
    assert (first.seq, second.seq) == (0, 1)


def test_row_width_must_match_the_relation() -> None:
    assembler = ChangeAssembler()
    feed_all(assembler, [relation(), begin()])
    with pytest.raises(ChangeAssemblyError, match="has 2 columns, its Relation message 3"):
        assembler.feed(Insert(USERS, ("1", "a")))


def test_unknown_relation_is_a_clear_error() -> None:
    assembler = ChangeAssembler()
    assembler.feed(begin())
    with pytest.raises(ChangeAssemblyError, match=r"Insert for relation OID 16384 .* commit LSN 0/1000"):
        assembler.feed(Insert(USERS, ("1",)))
    with pytest.raises(ChangeAssemblyError, match="Truncate for relation OID 99"):
        assembler.feed(Truncate((99,), False, False))


def test_messages_origin_and_type_are_skipped() -> None:
    events = feed_all(
        ChangeAssembler(),
        [
            LogicalMessage(False, 5, "p", b"non-transactional"),
            begin(),
            Origin(1, "upstream"),
            Type(9000, "public", "mood"),
            LogicalMessage(True, 6, "p", b"x"),
            commit(),
        ],
    )
    assert events == [TransactionCommitted(700, 0x1000, 0x1030, TS, 0)]


@pytest.mark.parametrize(
    ("messages", "match"),
    [
        ([Insert(USERS, ("1",))], "outside a transaction"),
        ([commit()], "without a Begin"),
        ([begin(), begin()], "inside open xid"),
        ([begin(lsn=0x1000), commit(lsn=0x2000)], "does not match"),
        ([StreamStop()], "without a Stream Start"),
        ([StreamStart(5, first_segment=False)], "never started"),
        ([StreamCommit(5, 0, 1, 2, TS, 0)], "no Stream Start began"),
        ([StreamAbort(5, 5)], "no Stream Start began"),
        ([StreamStart(5, True), StreamStop(), StreamStart(5, True)], "already buffered"),
        ([StreamStart(5, True), begin()], "inside the stream"),
    ],
)
def test_out_of_order_messages_are_errors(messages: list[PgOutputMessage], match: str) -> None:
    assembler = ChangeAssembler()
    with pytest.raises(ChangeAssemblyError, match=match):
        feed_all(assembler, messages)


# -- streamed transactions (protocol 2) --------------------------------------------------------


def test_streamed_transaction_is_emitted_at_stream_commit_interleaved_with_others() -> None:
    assembler = ChangeAssembler()
    assert (
        feed_all(
            assembler,
            [
                StreamStart(900, first_segment=True),
                relation(xid=900),
                Insert(USERS, ("1", "a", None), xid=900),
                Insert(USERS, ("2", "b", None), xid=900),
                StreamStop(),
            ],
        )
        == []
    )
    assert assembler.in_transaction
    # A small transaction commits in between and is emitted at once. The stream's Relation has not
    # been applied yet (it could still abort), so Postgres sends the table's Relation again.
    interleaved = feed_all(
        assembler,
        [begin(xid=901, lsn=0x500), relation(), Insert(USERS, ("9", "z", None)), commit(0x500, 0x530)],
    )
    assert changes_of(interleaved) == [(Op.INSERT, ("9",), ("9", "z", None), (), 0)]
    more: list[PgOutputMessage] = [
        StreamStart(900, False),
        Update(USERS, None, None, ("1", "A", None), xid=900),
        StreamStop(),
    ]
    assert feed_all(assembler, more) == []
    events = feed_all(assembler, [StreamCommit(900, 0, 0x2000, 0x2040, TS, 0)])
    assert changes_of(events) == [
        (Op.INSERT, ("1",), ("1", "a", None), (), 0),
        (Op.INSERT, ("2",), ("2", "b", None), (), 1),
        (Op.UPDATE, ("1",), ("1", "A", None), (), 2),
    ]
    assert all(e.commit_lsn == 0x2000 and e.xid == 900 for e in events)
    assert events[-1] == TransactionCommitted(900, 0x2000, 0x2040, TS, 3)
    assert not assembler.in_transaction


def test_streamed_transaction_abort_drops_it() -> None:
    assembler = ChangeAssembler()
    messages: list[PgOutputMessage] = [
        relation(),
        StreamStart(900, True),
        Insert(USERS, ("1", "a", None), xid=900),
        StreamStop(),
        StreamAbort(900, 900),
        begin(),
        Insert(USERS, ("2", "b", None)),
        commit(),
    ]
    events = feed_all(assembler, messages)
    assert changes_of(events) == [(Op.INSERT, ("2",), ("2", "b", None), (), 0)]
    assert not assembler.in_transaction


def test_subtransaction_abort_drops_only_its_changes_and_keeps_its_schema() -> None:
    assembler = ChangeAssembler()
    feed_all(
        assembler,
        [
            StreamStart(900, True),
            relation(oid=ORDERS, xid=900),
            Insert(ORDERS, ("1", "kept", None), xid=900),
            # SAVEPOINT s1; first change of subxact 901 sends the users table's Relation.
            relation(xid=901),
            Insert(USERS, ("1", "dropped", None), xid=901),
            Insert(USERS, ("2", "dropped child", None), xid=902),  # nested SAVEPOINT s2
            StreamStop(),
            StreamAbort(900, 901),  # ROLLBACK TO s1: drops 901 and its child 902
            StreamStart(900, False),
            Insert(USERS, ("3", "kept after rollback", None), xid=900),  # no new Relation is sent
            Insert(USERS, ("4", "new subxact", None), xid=903),
            StreamStop(),
            StreamAbort(900, 999),  # a subxact that made no change: nothing to drop
        ],
    )
    events = feed_all(assembler, [StreamCommit(900, 0, 0x3000, 0x3010, TS, 0)])
    assert [(e.table.oid, e.row, e.seq) for e in events if isinstance(e, ChangeEvent)] == [
        (ORDERS, ("1", "kept", None), 0),
        (USERS, ("3", "kept after rollback", None), 1),
        (USERS, ("4", "new subxact", None), 2),
    ]
    assert events[-1] == TransactionCommitted(900, 0x3000, 0x3010, TS, 3)


def test_stream_replay_must_be_consumed_before_the_next_message() -> None:
    assembler = ChangeAssembler()
    feed_all(
        assembler,
        [relation(), StreamStart(900, True), Insert(USERS, ("1", "a", None), xid=900), StreamStop()],
    )
    replay = iter(assembler.feed(StreamCommit(900, 0, 0x2000, 0x2040, TS, 0)))
    next(replay)  # the Insert; its TransactionCommitted is never taken
    with pytest.raises(ChangeAssemblyError, match="not all consumed"):
        assembler.feed(begin())


def test_data_message_without_xid_inside_a_stream_is_an_error() -> None:
    assembler = ChangeAssembler()
    assembler.feed(StreamStart(900, True))
    with pytest.raises(ChangeAssemblyError, match="inside the stream of xid 900"):
        assembler.feed(Insert(USERS, ("1",)))
