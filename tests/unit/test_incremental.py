"""The watermark algorithm of re-snapshots while streaming, fed signals and changes as the stream
would see them; the last test runs it against a simulated database with concurrent writers."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdc_worker.core.incremental import (
    WINDOW_CLOSE,
    WINDOW_OPEN,
    IncrementalSnapshot,
    KeyText,
    Progress,
    SignalError,
    SnapshotXids,
    TableRequest,
    parse_signal,
    request_content,
    watermark_content,
)

SLOT = "bw"
OID = 16400
XID = 900


def request(*tables: str, slot: str = SLOT, request_id: str = "r1") -> bytes:
    return request_content(slot, request_id, [tuple(t.split(".")) for t in tables])  # type: ignore[misc]


def rows(*keys: int) -> dict[KeyText, Any]:
    return {(str(k),): (str(k), f"v{k}") for k in keys}


def test_a_request_starts_a_chunk_and_holds_acknowledgement_at_its_commit() -> None:
    state = IncrementalSnapshot(SLOT, chunk_rows=3)
    assert not state.active and state.hold_lsn is None
    assert state.signal(request("public.t"), commit_lsn=100) is None
    assert state.active and state.wants_chunk and state.hold_lsn == 100
    plan = state.next_chunk()
    assert (plan.table.qualified_name, plan.after, plan.limit) == ("public.t", None, 3)
    assert not state.wants_chunk


def test_changes_inside_the_window_strike_their_keys_and_the_rest_is_released() -> None:
    state = IncrementalSnapshot(SLOT, chunk_rows=3)
    state.signal(request("public.t"), 100)
    plan = state.next_chunk()
    state.chunk_read(plan, OID, rows(1, 2, 3))
    state.observe(OID, ("1",), XID)  # before the low watermark: older than the chunk's read, kept
    state.signal(watermark_content(WINDOW_OPEN, SLOT, plan.window, plan.progress), 110)
    assert state.window_open and state.hold_lsn == 110
    state.observe(OID, ("2",), XID)
    state.observe(OID + 1, ("3",), XID)  # another table's key 3
    release = state.signal(watermark_content(WINDOW_CLOSE, SLOT, plan.window, plan.progress), 120)
    assert release is not None
    assert [r[0] for r in release.rows] == ["1", "3"]
    assert (release.rows_so_far, release.struck, release.table_done) == (2, 1, False)
    # A full chunk: there may be more rows after key 3.
    assert state.wants_chunk and state.progress == Progress(plan.progress.queue, ("3",), 2)
    assert state.next_chunk().after == ("3",)


def test_a_short_chunk_ends_the_table_and_the_last_one_releases_the_hold() -> None:
    state = IncrementalSnapshot(SLOT, chunk_rows=3)
    state.signal(request("public.t", "public.u"), 100)
    plan = state.next_chunk()
    state.chunk_read(plan, OID, rows(1))
    state.signal(watermark_content(WINDOW_OPEN, SLOT, plan.window, plan.progress), 110)
    release = state.signal(watermark_content(WINDOW_CLOSE, SLOT, plan.window, plan.progress), 120)
    assert release is not None and release.table_done
    assert state.next_chunk().table.qualified_name == "public.u"
    assert state.hold_lsn == 120
    plan = state._waiting
    assert plan is not None
    state.chunk_read(plan, OID + 1, {})
    state.signal(watermark_content(WINDOW_OPEN, SLOT, plan.window, plan.progress), 130)
    release = state.signal(watermark_content(WINDOW_CLOSE, SLOT, plan.window, plan.progress), 140)
    assert release is not None and release.rows == [] and release.table_done
    assert not state.active and state.hold_lsn is None


def test_before_the_window_only_commits_the_chunk_did_not_see_strike_keys() -> None:
    state = IncrementalSnapshot(SLOT)
    state.signal(request("public.t"), 100)
    plan = state.next_chunk()
    # The chunk's snapshot: xids below 1000 finished, 1003 was in progress (its commit record may
    # already be in the WAL, before the low watermark).
    seen = SnapshotXids(xmin=1000, xmax=1005, xip=frozenset({1003}))
    state.chunk_read(plan, OID, rows(1, 2, 3), seen)
    state.observe(OID, ("1",), 999)  # committed before: the chunk holds its change
    state.observe(OID, ("2",), 1003)  # not seen by the chunk: its row there is older
    state.observe(OID, ("3",), 1006)  # begun after the snapshot: not seen either
    state.signal(watermark_content(WINDOW_OPEN, SLOT, plan.window, plan.progress), 110)
    release = state.signal(watermark_content(WINDOW_CLOSE, SLOT, plan.window, plan.progress), 120)
    assert release is not None and [r[0] for r in release.rows] == ["1"]


def test_snapshot_xids_are_compared_across_the_32_bit_wraparound() -> None:
    epoch = 7 << 32
    near_wrap = SnapshotXids(xmin=epoch + 0xFFFFFFF0, xmax=(8 << 32) + 5, xip=frozenset({(8 << 32) + 2}))
    assert near_wrap.widen(0xFFFFFFF8) == epoch + 0xFFFFFFF8
    assert near_wrap.widen(3) == (8 << 32) + 3
    # Below xmin, or between xmin and xmax and not in progress: seen, on either side of the wrap.
    assert near_wrap.sees(0xFFFFFFE0) and near_wrap.sees(0xFFFFFFF8) and near_wrap.sees(3)
    assert not near_wrap.sees(2) and not near_wrap.sees(5)


def test_a_truncate_inside_the_window_empties_the_chunk() -> None:
    state = IncrementalSnapshot(SLOT)
    state.signal(request("public.t"), 100)
    plan = state.next_chunk()
    state.chunk_read(plan, OID, rows(1, 2))
    state.signal(watermark_content(WINDOW_OPEN, SLOT, plan.window, plan.progress), 110)
    state.truncated(OID, XID)
    release = state.signal(watermark_content(WINDOW_CLOSE, SLOT, plan.window, plan.progress), 120)
    assert release is not None and release.rows == []


def test_other_slots_signals_are_ignored_and_a_table_asked_twice_is_read_once() -> None:
    state = IncrementalSnapshot(SLOT)
    state.signal(request("public.t", slot="other"), 100)
    assert not state.active and state.hold_lsn is None
    state.signal(request("public.t"), 110)
    state.signal(request("public.t", "public.u", request_id="r2"), 120)
    assert state.progress is not None
    # A table asked for again while queued is read once, and reported to both requests.
    assert [(t.request_ids, t.qualified_name) for t in state.progress.queue] == [
        (("r1", "r2"), "public.t"),
        (("r2",), "public.u"),
    ]


def test_after_a_restart_a_watermark_is_where_the_re_snapshot_goes_on_from() -> None:
    before = IncrementalSnapshot(SLOT, chunk_rows=2)
    before.signal(request("public.t"), 100)
    first = before.next_chunk()
    before.chunk_read(first, OID, rows(1, 2))
    before.signal(watermark_content(WINDOW_OPEN, SLOT, first.window, first.progress), 110)
    before.signal(watermark_content(WINDOW_CLOSE, SLOT, first.window, first.progress), 120)
    second = before.next_chunk()
    # The worker dies here; the slot was acknowledged up to the second low watermark's commit,
    # so the new worker reads it again first.
    after = IncrementalSnapshot(SLOT, chunk_rows=2)
    after.signal(watermark_content(WINDOW_OPEN, SLOT, second.window, second.progress), 130)
    assert after.active and after.hold_lsn == 130 and after.wants_chunk
    redo = after.next_chunk()
    assert (redo.table.qualified_name, redo.after) == ("public.t", ("2",))
    # The dead worker's high watermark does not close the new window.
    assert after.signal(watermark_content(WINDOW_CLOSE, SLOT, second.window, second.progress), 140) is None


def test_a_failed_table_is_skipped() -> None:
    state = IncrementalSnapshot(SLOT)
    state.signal(request("public.gone"), 100)
    failure = state.table_failed(state.next_chunk(), "table public.gone does not exist")
    assert failure.table == TableRequest(("r1",), "public", "gone")
    assert not state.active and state.hold_lsn is None


def test_the_windows_of_a_failed_table_do_not_start_it_again() -> None:
    state = IncrementalSnapshot(SLOT)
    state.signal(request("public.t"), 100)
    plan = state.next_chunk()
    state.table_failed(plan, "cannot read public.t: canceling statement due to statement timeout")
    assert not state.active
    # The watermarks the failed read wrote come back through the stream.
    state.signal(watermark_content(WINDOW_OPEN, SLOT, plan.window, plan.progress), 110)
    state.signal(watermark_content(WINDOW_CLOSE, SLOT, plan.window, plan.progress), 120)
    assert not state.active and state.hold_lsn is None


def test_a_request_while_one_runs_leaves_the_hold_where_a_restart_learns_everything() -> None:
    state = IncrementalSnapshot(SLOT, chunk_rows=2)
    state.signal(request("public.t"), 100)
    plan = state.next_chunk()
    state.chunk_read(plan, OID, rows(1, 2))
    state.signal(request("public.u", request_id="r2"), 105)  # after the chunk was planned
    assert state.hold_lsn == 100
    state.signal(watermark_content(WINDOW_OPEN, SLOT, plan.window, plan.progress), 110)
    state.signal(watermark_content(WINDOW_CLOSE, SLOT, plan.window, plan.progress), 120)
    # Those watermarks do not name public.u: a restart must read the request at 105 again.
    assert state.hold_lsn == 100
    following = state.next_chunk()
    assert [t.qualified_name for t in following.progress.queue] == ["public.t", "public.u"]
    state.chunk_read(following, OID, rows(3))
    state.signal(watermark_content(WINDOW_OPEN, SLOT, following.window, following.progress), 130)
    assert state.hold_lsn == 130


def test_a_dead_workers_later_watermarks_do_not_move_the_hold() -> None:
    dead = IncrementalSnapshot(SLOT, chunk_rows=2)
    dead.signal(request("public.t"), 100)
    first = dead.next_chunk()
    dead.chunk_read(first, OID, rows(1, 2))
    dead.signal(watermark_content(WINDOW_OPEN, SLOT, first.window, first.progress), 110)
    dead.signal(watermark_content(WINDOW_CLOSE, SLOT, first.window, first.progress), 120)
    second = dead.next_chunk()
    # Restarted at 110 (the dead worker had acknowledged no further): it adopts that watermark.
    restarted = IncrementalSnapshot(SLOT, chunk_rows=2)
    restarted.signal(watermark_content(WINDOW_OPEN, SLOT, first.window, first.progress), 110)
    assert restarted.hold_lsn == 110
    restarted.next_chunk()
    restarted.signal(watermark_content(WINDOW_CLOSE, SLOT, first.window, first.progress), 120)
    restarted.signal(watermark_content(WINDOW_OPEN, SLOT, second.window, second.progress), 130)
    # Its own chunk's rows are not delivered yet: the hold must stay at what it adopted.
    assert restarted.hold_lsn == 110


@pytest.mark.parametrize(
    "content",
    [b"not json", b'{"v": 1, "kind": "snapshot"}', b'{"v": 9, "kind": "snapshot", "slot": "bw", "id": "x"}',
     b'{"v": 1, "kind": "dance", "slot": "bw", "id": "x"}',
     b'{"v": 1, "kind": "window-open", "slot": "bw", "id": "x", "progress": {"queue": 3}}'],
)  # fmt: skip
def test_malformed_signals_are_refused(content: bytes) -> None:
    with pytest.raises(SignalError):
        parse_signal(content)


# -- the algorithm against a simulated database -------------------------------------------------


@dataclass
class Database:
    """A keyed table, its WAL (commit order) and a topic compacted by key, starting empty: what
    the re-snapshot must fill in, concurrently with writers."""

    table: dict[int, str]
    wal: list[tuple[str, Any]] = field(default_factory=list)
    lsn: int = 0

    def commit(self, entry: tuple[str, Any]) -> None:
        self.wal.append(entry)

    def write(self, key: int, value: str | None) -> None:
        if value is None:
            self.table.pop(key, None)
        else:
            self.table[key] = value
        self.commit(("change", (key, value)))

    def select(self, after: KeyText | None, limit: int) -> dict[KeyText, Any]:
        lower = -1 if after is None else int(after[0] or 0)
        keys = sorted(k for k in self.table if k > lower)[:limit]
        return {(str(k),): (str(k), self.table[k]) for k in keys}


writes = st.lists(
    st.tuples(st.integers(0, 30), st.one_of(st.none(), st.text("abc", max_size=3))), max_size=60
)


@settings(max_examples=200, deadline=None)
@given(
    initial=st.dictionaries(st.integers(0, 30), st.text("xyz", max_size=3), max_size=25),
    writes=writes,
    split=st.lists(st.integers(0, 3), min_size=200, max_size=200),
    chunk_rows=st.integers(1, 7),
    crashes=st.sets(st.integers(1, 120), max_size=3),
)
def test_the_topic_ends_equal_to_the_table_whatever_the_interleaving_and_crashes(
    initial: dict[int, str],
    writes: list[tuple[int, str | None]],
    split: list[int],
    chunk_rows: int,
    crashes: set[int],
) -> None:
    """A writer changes the table while the re-snapshot reads it; the worker may crash at any step,
    losing every message past what it acknowledged (the worst Kafka can do), and restarts from its
    acknowledged position (at most the hold)."""
    db = Database(dict(initial))
    published: list[tuple[int, int, str | None]] = []  # (WAL index that produced it, key, value)
    state = IncrementalSnapshot(SLOT, chunk_rows=chunk_rows)
    pending = list(writes)
    choices = itertools.cycle(split)

    def some_writes() -> None:
        for _ in range(next(choices)):
            if pending:
                db.write(*pending.pop(0))

    db.commit(("signal", request("public.t")))
    position = step = 0
    while position < len(db.wal) or pending:
        step += 1
        if step in crashes:
            acknowledged = position if state.hold_lsn is None else state.hold_lsn - 1
            published = [p for p in published if p[0] < acknowledged]
            position, state = acknowledged, IncrementalSnapshot(SLOT, chunk_rows=chunk_rows)
        if position == len(db.wal):
            db.write(*pending.pop(0))
            continue
        kind, payload = db.wal[position]
        position += 1
        if kind == "change":
            published.append((position - 1, *payload))
            state.observe(OID, (str(payload[0]),), XID)
        else:
            release = state.signal(payload, commit_lsn=position)
            for row in release.rows if release is not None else []:
                published.append((position - 1, int(row[0]), row[1]))
        if state.wants_chunk:
            plan = state.next_chunk()
            db.commit(("signal", watermark_content(WINDOW_OPEN, SLOT, plan.window, plan.progress)))
            some_writes()
            read = db.select(plan.after, plan.limit)
            some_writes()
            db.commit(("signal", watermark_content(WINDOW_CLOSE, SLOT, plan.window, plan.progress)))
            state.chunk_read(plan, OID, read)
        some_writes()
    assert not state.active
    topic: dict[int, str] = {}
    for _, key, value in published:  # compaction: the last message of each key
        if value is None:
            topic.pop(key, None)
        else:
            topic[key] = value
    assert topic == db.table
