"""Decode and assemble bytes a real Postgres 15 sent (`tests/fixtures/pgoutput/captured.json`, made
by `capture.py` next to it), and check each event against what the SQL that produced it did.

Both captures (protocol 1, and protocol 2 with streaming) must tell the same story.
"""

from __future__ import annotations

import json
from collections import defaultdict
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from cdc_worker.core.changes.assembler import AssembledEvent, ChangeAssembler
from cdc_worker.core.model import (
    UNCHANGED_TOAST,
    ChangeEvent,
    ColumnValue,
    Op,
    ReplicaIdentity,
    TableSchema,
    TransactionCommitted,
    TruncateEvent,
)
from cdc_worker.core.pgoutput.decoder import (
    LogicalMessage,
    PgOutputDecoder,
    PgOutputMessage,
    Relation,
    StreamAbort,
    StreamCommit,
    StreamStart,
    TupleKind,
    Update,
)
from cdc_worker.core.pgtypes.copy_text import CopyRow, iter_copy_text_rows

FIXTURE_PATH = Path(__file__).parents[1] / "fixtures" / "pgoutput" / "captured.json"
PROTOCOLS = [1, 2]
TOAST_CHARS = 10_000
STREAMED_ROWS = 1000


@cache
def fixture() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(FIXTURE_PATH.read_text())
    return loaded


def table_name(key: str) -> str:
    name: str = fixture()["tables"][key]
    return name


def primary_key(table: TableSchema) -> tuple[str, ...]:
    """What the shell reads from the catalog: every capture table has `id` as primary key except
    the one with REPLICA IDENTITY NOTHING, which has none."""
    return () if table.name == table_name("nothing") else ("id",)


@cache
def decoded(protocol: int) -> tuple[PgOutputMessage, ...]:
    (capture,) = [c for c in fixture()["captures"] if c["protocol_version"] == protocol]
    decoder = PgOutputDecoder(protocol)
    return tuple(decoder.decode(bytes.fromhex(raw)) for raw in capture["messages"])


@cache
def assembled(protocol: int) -> tuple[AssembledEvent, ...]:
    assembler = ChangeAssembler(key_columns_for=primary_key)
    events = tuple(event for message in decoded(protocol) for event in assembler.feed(message))
    assert not assembler.in_transaction
    return events


def step_xid(name: str) -> int:
    (xid,) = [s["xid"] for s in fixture()["steps"] if s["name"] == name]
    return int(xid)


def events_of(protocol: int, step: str) -> list[ChangeEvent | TruncateEvent]:
    """The step's events without its TransactionCommitted, checked to be numbered 0..n-1."""
    xid = step_xid(step)
    events = [e for e in assembled(protocol) if e.xid == xid]
    *changes, committed = events
    assert isinstance(committed, TransactionCommitted) and committed.event_count == len(changes)
    assert [e.seq for e in changes if not isinstance(e, TransactionCommitted)] == list(range(len(changes)))
    assert all(
        e.commit_lsn == committed.commit_lsn for e in changes if not isinstance(e, TransactionCommitted)
    )
    return [e for e in changes if not isinstance(e, TransactionCommitted)]


def rows(events: list[ChangeEvent | TruncateEvent]) -> list[tuple[Op, tuple[ColumnValue, ...] | None, Any]]:
    return [(e.op, e.key, e.row) for e in events if isinstance(e, ChangeEvent)]


def test_fixture_covers_streaming() -> None:
    kinds = [type(m) for m in decoded(2)]
    assert kinds.count(StreamStart) >= 3 and StreamCommit in kinds
    aborts = [m for m in decoded(2) if isinstance(m, StreamAbort)]
    assert any(a.subxid != a.xid for a in aborts), "no subtransaction abort inside a stream"
    assert any(a.subxid == a.xid for a in aborts), "no whole streamed transaction aborted"
    assert StreamStart not in [type(m) for m in decoded(1)]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_transactions_in_commit_order_and_rollbacks_absent(protocol: int) -> None:
    commits = [e for e in assembled(protocol) if isinstance(e, TransactionCommitted)]
    committed_steps = [s["xid"] for s in fixture()["steps"] if s["committed"]]
    assert [c.xid for c in commits] == committed_steps
    assert [c.end_lsn for c in commits] == sorted(c.end_lsn for c in commits)
    assert all(c.commit_lsn < c.end_lsn for c in commits)
    rolled_back = {s["xid"] for s in fixture()["steps"] if not s["committed"]}
    assert not [e for e in assembled(protocol) if e.xid in rolled_back]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_insert_update_key_change_delete(protocol: int) -> None:
    assert rows(events_of(protocol, "insert")) == [
        (Op.INSERT, ("1",), ("1", "ann", None)),
        (Op.INSERT, ("2",), ("2", "bob", "short bio")),
    ]
    assert rows(events_of(protocol, "update")) == [(Op.UPDATE, ("1",), ("1", "anne", None))]
    assert rows(events_of(protocol, "key_change")) == [
        (Op.DELETE, ("2",), None),
        (Op.INSERT, ("10",), ("10", "bob", "short bio")),
    ]
    assert rows(events_of(protocol, "delete")) == [(Op.DELETE, ("1",), None)]
    (event,) = events_of(protocol, "insert")[:1]
    assert isinstance(event, ChangeEvent)
    assert event.table.name == table_name("users") and event.table.key_columns == ("id",)
    assert [c.type_oid for c in event.table.columns] == [23, 25, 25]  # int4, text, text


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_toast_with_default_identity(protocol: int) -> None:
    assert rows(events_of(protocol, "toast_insert")) == [
        (Op.INSERT, ("3",), ("3", "carl", "x" * TOAST_CHARS))
    ]
    (update,) = events_of(protocol, "toast_update")
    assert isinstance(update, ChangeEvent)
    assert update.row == ("3", "carla", UNCHANGED_TOAST) and update.unchanged_toast == ("bio",)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_toast_with_full_identity_is_filled_from_the_old_row(protocol: int) -> None:
    payload = "p" * TOAST_CHARS
    full_updates = [m for m in decoded(protocol) if isinstance(m, Update) and m.old_kind is TupleKind.OLD]
    assert full_updates and all(
        m.new[2] is UNCHANGED_TOAST and m.old is not None and m.old[2] == payload for m in full_updates
    )
    (update,) = events_of(protocol, "full_toast_update")
    assert isinstance(update, ChangeEvent)
    assert (update.op, update.row, update.unchanged_toast) == (Op.UPDATE, ("1", "m", payload), ())
    assert update.table.replica_identity is ReplicaIdentity.FULL
    assert rows(events_of(protocol, "full_key_change")) == [
        (Op.DELETE, ("1",), None),
        (Op.INSERT, ("2",), ("2", "m", payload)),
    ]
    assert rows(events_of(protocol, "full_delete")) == [(Op.DELETE, ("2",), None)]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_replica_identity_nothing_publishes_the_insert_only(protocol: int) -> None:
    # Its publication has publish = 'insert, truncate'; the table is unkeyed.
    assert rows(events_of(protocol, "identity_nothing")) == [(Op.INSERT, None, ("1", "a"))]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_logical_message_is_decoded_and_skipped(protocol: int) -> None:
    messages = [m for m in decoded(protocol) if isinstance(m, LogicalMessage)]
    assert [(m.prefix, m.content, m.transactional) for m in messages] == [
        ("bw.capture", b"hi", True),
        ("bw.capture.end", b"end", False),
    ]
    assert rows(events_of(protocol, "logical_message")) == [(Op.INSERT, ("4",), ("4", "dan", None))]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_alter_table_mid_transaction_gives_a_new_schema(protocol: int) -> None:
    before, after = events_of(protocol, "alter_mid_transaction")
    assert isinstance(before, ChangeEvent) and isinstance(after, ChangeEvent)
    assert before.row == ("6", "fay", None) and [c.name for c in before.table.columns] == [
        "id",
        "name",
        "bio",
    ]
    assert after.row == ("7", "gus", None, "42") and [c.name for c in after.table.columns][-1] == "age"


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_truncate(protocol: int) -> None:
    insert, truncate = events_of(protocol, "truncate")
    assert isinstance(insert, ChangeEvent) and insert.row == ("2", "c")
    assert isinstance(truncate, TruncateEvent)
    assert sorted(t.name for t in truncate.tables) == sorted([table_name("full"), table_name("nothing")])
    assert (truncate.cascade, truncate.restart_identity) == (False, True)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_large_transaction_with_rolled_back_savepoint(protocol: int) -> None:
    events = rows(events_of(protocol, "streamed"))
    expected_rows = [(Op.INSERT, (str(i),), (str(i), f"row {i}")) for i in range(1, STREAMED_ROWS + 1)]
    assert events == [*expected_rows, (Op.UPDATE, ("1",), ("1", "updated")), (Op.DELETE, ("2",), None)]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_quoted_names_and_type_text_match_copy(protocol: int) -> None:
    events = [e for e in events_of(protocol, "insert_types") if isinstance(e, ChangeEvent)]
    table = events[0].table
    assert table.name == table_name("types") and table.columns[1].name == 'Weird "col"'
    assert events[0].row == (
        "1",
        "tab\there\nnew line \\ back 'quote' Zoë 🚀",
        "12345.60",
        "2024-05-01 10:34:56.789+00",
        "t",
        "\\x00ff10",
        '{"k": [1, "v"]}',
        "{1,NULL,3}",
        None,
    )
    # The snapshot path (COPY TEXT) yields exactly the text pgoutput sends.
    assert copy_rows("types") == [e.row for e in events]


def copy_rows(key: str) -> list[CopyRow]:
    data = bytes.fromhex(fixture()["copy"][key])
    return list(iter_copy_text_rows([data[i : i + 100] for i in range(0, len(data), 100)]))


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_replaying_the_users_changelog_gives_the_table_copy_reads(protocol: int) -> None:
    """A tiny merge: apply every users event by key, as the Delta merge will, and compare with
    the table's final COPY. Unchanged TOAST keeps the previous value; added columns read NULL."""
    width = len(copy_rows("users")[0])
    state: dict[tuple[ColumnValue, ...] | None, list[ColumnValue]] = {}
    for event in assembled(protocol):
        if not isinstance(event, ChangeEvent) or event.table.name != table_name("users"):
            continue
        if event.op is Op.DELETE:
            del state[event.key]
            continue
        assert event.row is not None
        previous = state.get(event.key, [None] * width)
        new = list(event.row) + [None] * (width - len(event.row))
        state[event.key] = [p if v is UNCHANGED_TOAST else v for p, v in zip(previous, new, strict=True)]
    assert sorted(tuple(row) for row in state.values()) == sorted(copy_rows("users"))


def test_relations_are_sent_again_after_a_schema_change() -> None:
    relations = [m for m in decoded(1) if isinstance(m, Relation) and m.schema.name == table_name("users")]
    assert [len(r.schema.columns) for r in relations] == [3, 4]
    groups: dict[int, int] = defaultdict(int)
    for r in relations:
        groups[r.schema.oid] += 1
    assert len(groups) == 1  # the same relation OID, a new schema version
