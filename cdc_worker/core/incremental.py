"""Re-snapshotting chosen tables while the stream goes on: the watermark algorithm, without I/O.

The first snapshot of a slot reads every table under the slot's exported snapshot, before the
stream starts. A re-snapshot happens while the stream is running, so a row read now and a change
streamed now must be put in the right order, or a compacted topic could end on a stale row. This is
the DBLog algorithm (Netflix, 2020; Debezium's incremental snapshots use it too):

1. The shell writes a *low watermark* into the WAL, reads one chunk of the table in key order
   (`WHERE key > last key ORDER BY key LIMIT n`), then writes a *high watermark*.
2. The stream reads the WAL in commit order. Between the two watermarks (the *window*), every
   streamed change of a key the chunk holds strikes that key out of the chunk: the stream's event is
   at least as new as what the chunk read. So does a change before the low watermark whose commit
   the chunk's snapshot did not see yet (a commit is in the WAL a moment before it is visible).
3. At the high watermark the chunk's remaining rows are published as snapshot reads (op `r`) at the
   high watermark's position (its commit LSN, seq 0, 1, ...): nothing changed them inside the window,
   so they are the rows as of that position, and `(lsn, seq)` orders them among the changes.

Watermarks and requests are `pg_logical_emit_message()` records with the prefix `bottledwater`
(transactional, so they are decoded in commit order), so no table is written in the user's
database. Every watermark carries the whole progress of the re-snapshot; while one runs, the shell
acknowledges no further than the newest watermark's commit (`hold_lsn`), so a restarted worker reads
that watermark again and goes on from the chunk it names (rows published twice, none missed).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

SIGNAL_PREFIX = "bottledwater"
SIGNAL_VERSION = 1
REQUEST = "snapshot"
WINDOW_OPEN = "window-open"
WINDOW_CLOSE = "window-close"
DEFAULT_CHUNK_ROWS = 4096
# The slot of a request for every worker that publishes the tables it names (a partition attached
# with rows, asked for by whichever worker guarded it first; see `truncate_guard`). A slot name
# never holds it. The shell narrows such a request to its own tables before `signal` takes it.
ANY_SLOT = "*"

KeyText = tuple[str | None, ...]


class SignalError(ValueError):
    """A `bottledwater` logical message that is not a valid signal."""


@dataclass(frozen=True, slots=True)
class TableRequest:
    """One table to re-snapshot, for the requests `request_ids` (a table asked for again while it
    is queued or being read is read once, for all of them: the pass ends after every request)."""

    request_ids: tuple[str, ...]
    schema: str
    table: str

    @property
    def qualified_name(self) -> str:
        return f"{self.schema}.{self.table}"


@dataclass(frozen=True, slots=True)
class Progress:
    """Where a re-snapshot is: the tables still to read (the first one is being read), the last key
    published of that table (None: from its start) and how many of its rows were published."""

    queue: tuple[TableRequest, ...]
    after: KeyText | None = None
    rows: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "queue": [[list(t.request_ids), t.schema, t.table] for t in self.queue],
            "after": None if self.after is None else list(self.after),
            "rows": self.rows,
        }

    @classmethod
    def from_json(cls, data: Any) -> Progress:
        try:
            queue = tuple(TableRequest(tuple(map(str, r)), str(s), str(t)) for r, s, t in data["queue"])
            after = data["after"]
            return cls(queue, None if after is None else tuple(after), int(data["rows"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise SignalError(f"malformed re-snapshot progress {data!r}: {exc}") from exc


@dataclass(frozen=True, slots=True)
class Signal:
    kind: str
    slot: str
    # REQUEST: the request id and its tables; watermarks: the window id and the progress.
    ident: str
    tables: tuple[TableRequest, ...] = ()
    progress: Progress | None = None


def request_content(slot: str, request_id: str, tables: list[tuple[str, str]]) -> bytes:
    """The logical message that asks the worker streaming `slot` to re-snapshot `tables`."""
    body = {
        "v": SIGNAL_VERSION,
        "kind": REQUEST,
        "slot": slot,
        "id": request_id,
        "tables": [[schema, table] for schema, table in tables],
    }
    return json.dumps(body, ensure_ascii=False).encode()


def watermark_content(kind: str, slot: str, window: str, progress: Progress) -> bytes:
    body = {"v": SIGNAL_VERSION, "kind": kind, "slot": slot, "id": window, "progress": progress.to_json()}
    return json.dumps(body, ensure_ascii=False).encode()


def parse_signal(content: bytes) -> Signal:
    try:
        body = json.loads(content)
        kind, slot, ident = body["kind"], body["slot"], body["id"]
    except (ValueError, TypeError, KeyError) as exc:
        raise SignalError(f"not a bottledwater signal: {content[:200]!r}") from exc
    if body.get("v") != SIGNAL_VERSION:
        raise SignalError(f"signal version {body.get('v')!r} is not {SIGNAL_VERSION}: upgrade the worker")
    if kind == REQUEST:
        try:
            tables = tuple(TableRequest((str(ident),), str(s), str(t)) for s, t in body["tables"])
        except (KeyError, TypeError, ValueError) as exc:
            raise SignalError(f"malformed re-snapshot request {content[:200]!r}") from exc
        return Signal(kind, str(slot), str(ident), tables=tables)
    if kind in (WINDOW_OPEN, WINDOW_CLOSE):
        return Signal(kind, str(slot), str(ident), progress=Progress.from_json(body.get("progress")))
    raise SignalError(f"unknown signal kind {kind!r}")


XID_SPACE = 1 << 32
HALF_XID_SPACE = 1 << 31


@dataclass(frozen=True, slots=True)
class SnapshotXids:
    """Which transactions a chunk's snapshot sees (`pg_current_snapshot()`, 64-bit xids)."""

    xmin: int
    xmax: int
    xip: frozenset[int]

    def widen(self, xid: int) -> int:
        """pgoutput's 32-bit xid as the 64-bit one nearest this snapshot's xmax."""
        candidate = (self.xmax & ~(XID_SPACE - 1)) | (xid & (XID_SPACE - 1))
        if candidate > self.xmax + HALF_XID_SPACE:
            candidate -= XID_SPACE
        elif candidate < self.xmax - HALF_XID_SPACE:
            candidate += XID_SPACE
        return candidate

    def sees(self, xid: int) -> bool:
        """Whether the snapshot sees the committed transaction `xid` (32-bit)."""
        full = self.widen(xid)
        return full < self.xmin or (full < self.xmax and full not in self.xip)


@dataclass(frozen=True, slots=True)
class ChunkPlan:
    """What the shell reads next: rows of `table` after `after` (None: from the start), in key order,
    at most `limit`, bracketed by watermarks named `window` that carry `progress`."""

    window: str
    table: TableRequest
    after: KeyText | None
    limit: int
    progress: Progress


@dataclass(slots=True)
class _Chunk:
    plan: ChunkPlan
    table_oid: int
    rows: dict[KeyText, Any]  # key -> row, in key order
    last_key: KeyText | None
    exhausted: bool
    read: int  # rows the chunk read, before the stream struck any out
    snapshot: SnapshotXids | None = None
    opened: bool = False


@dataclass(frozen=True, slots=True)
class ChunkRelease:
    """The rows to publish at a high watermark, and what they complete."""

    table: TableRequest
    table_oid: int
    rows: list[Any]
    rows_so_far: int  # published for this table, these included
    struck: int  # rows of the chunk the stream made stale (published by the stream instead)
    table_done: bool


@dataclass(frozen=True, slots=True)
class TableFailure:
    table: TableRequest
    reason: str


@dataclass
class IncrementalSnapshot:
    """The watermark state machine of one slot. The shell calls, in stream order:

    - `signal(content, commit_lsn)` for every `bottledwater` logical message;
    - `observe(table_oid, key, xid)` for every streamed change, `truncated(table_oid, xid)` for a
      TRUNCATE;
    - `next_chunk()` when nothing is being read (`wants_chunk`), then `chunk_read(...)` with the rows
      it read between its two watermarks, or `table_failed(...)` when it could not read them.
    """

    slot: str
    chunk_rows: int = DEFAULT_CHUNK_ROWS
    progress: Progress | None = None
    hold_lsn: int | None = None
    _chunk: _Chunk | None = None
    _waiting: ChunkPlan | None = None
    _own_windows: set[str] = field(default_factory=set)

    @property
    def active(self) -> bool:
        return self.progress is not None and bool(self.progress.queue)

    @property
    def wants_chunk(self) -> bool:
        """A re-snapshot runs and no chunk is out: the shell should read the next one."""
        return self.active and self._chunk is None and self._waiting is None

    @property
    def window_open(self) -> bool:
        return self._chunk is not None and self._chunk.opened

    @property
    def chunk_table(self) -> int | None:
        """The table of the chunk that is out (read, its rows not published yet), whose changes the
        shell must pass to `observe`."""
        return self._chunk.table_oid if self._chunk is not None else None

    def signal(self, content: bytes, commit_lsn: int) -> ChunkRelease | None:
        """A signal decoded from the stream; returns the chunk to publish at a high watermark.

        `hold_lsn` moves to a signal only when a restart that reads that signal first (and what
        follows it) learns the whole state: a request that starts a re-snapshot, an adopted
        watermark, or one of this worker's watermarks whose queue is the current one (a request
        merged since the chunk was planned is in the WAL after the watermark the hold stays at)."""
        signal = parse_signal(content)
        if signal.slot != self.slot:
            return None  # another worker's (several slots may stream one database)
        release = None
        if signal.kind == REQUEST:
            was_active = self.active
            self._enqueue(signal.tables)
            if not was_active:
                self.hold_lsn = commit_lsn
        elif signal.ident in self._own_windows:
            assert signal.progress is not None
            complete = self.progress is not None and signal.progress.queue == self.progress.queue
            release = self._own_watermark(signal)
            if complete:
                self.hold_lsn = commit_lsn
        elif not self.active and signal.progress is not None and signal.progress.queue:
            # A watermark written before a restart: its progress is where to go on from.
            self.progress = signal.progress
            self.hold_lsn = commit_lsn
        # Any other watermark is a dead worker's, read again after a restart: nothing to learn.
        if not self.active:
            self.hold_lsn = None
        return release

    def _enqueue(self, tables: tuple[TableRequest, ...]) -> None:
        current = self.progress or Progress(())
        queue = list(current.queue)
        for table in tables:
            at = next(
                (i for i, q in enumerate(queue) if (q.schema, q.table) == (table.schema, table.table)), None
            )
            if at is None:
                queue.append(table)
            else:
                ids = queue[at].request_ids + tuple(
                    r for r in table.request_ids if r not in queue[at].request_ids
                )
                queue[at] = TableRequest(ids, table.schema, table.table)
        self.progress = Progress(tuple(queue), current.after, current.rows)

    def _own_watermark(self, signal: Signal) -> ChunkRelease | None:
        chunk = self._chunk
        if chunk is None or chunk.plan.window != signal.ident:
            if signal.kind == WINDOW_CLOSE:  # a window abandoned by table_failed ends here
                self._own_windows.discard(signal.ident)
            return None
        if signal.kind == WINDOW_OPEN:
            chunk.opened = True
            return None
        self._chunk = None
        self._own_windows.discard(signal.ident)
        assert self.progress is not None
        table = self.progress.queue[0]  # the chunk's table, with any request merged since
        rows = list(chunk.rows.values())
        done = self.progress.rows + len(rows)
        struck = chunk.read - len(rows)
        if chunk.exhausted:
            self.progress = Progress(self.progress.queue[1:])
        else:
            self.progress = Progress(self.progress.queue, chunk.last_key, done)
        return ChunkRelease(table, chunk.table_oid, rows, done, struck, chunk.exhausted)

    def observe(self, table_oid: int, key: KeyText | None, xid: int) -> None:
        """A streamed change. Inside the window it strikes its key; before it, only when the chunk's
        snapshot did not see its transaction: that commit precedes the low watermark in the WAL but
        was not visible yet when the chunk was read (Postgres makes a commit visible a moment after
        writing it, and only after a synchronous standby's answer), so the chunk holds the row as it
        was before it."""
        chunk = self._chunk
        if chunk is None or chunk.table_oid != table_oid or key is None:
            return
        if chunk.opened or (chunk.snapshot is not None and not chunk.snapshot.sees(xid)):
            chunk.rows.pop(key, None)

    def truncated(self, table_oid: int, xid: int) -> None:
        chunk = self._chunk
        if chunk is None or chunk.table_oid != table_oid:
            return
        if chunk.opened or (chunk.snapshot is not None and not chunk.snapshot.sees(xid)):
            chunk.rows.clear()

    def next_chunk(self) -> ChunkPlan:
        if not self.wants_chunk:
            raise RuntimeError("next_chunk() while no re-snapshot runs or a chunk is still out")
        assert self.progress is not None
        window = uuid.uuid4().hex
        plan = ChunkPlan(window, self.progress.queue[0], self.progress.after, self.chunk_rows, self.progress)
        self._waiting = plan
        self._own_windows.add(window)
        return plan

    def chunk_read(
        self,
        plan: ChunkPlan,
        table_oid: int,
        rows: dict[KeyText, Any],
        snapshot: SnapshotXids | None = None,
    ) -> None:
        """The rows read between the watermarks of `plan` (both written by now), key -> row, and
        the transactions the read saw."""
        if self._waiting is not plan:
            raise RuntimeError("chunk_read() for a chunk that was not asked for")
        self._waiting = None
        last_key = next(reversed(rows)) if rows else plan.after
        self._chunk = _Chunk(plan, table_oid, rows, last_key, len(rows) < plan.limit, len(rows), snapshot)

    def table_failed(self, plan: ChunkPlan, reason: str) -> TableFailure:
        """The chunk could not be read (table dropped, no key, no privilege): skip the table. Its
        window, if written, stays this worker's, so that reading it back changes nothing."""
        self._waiting = None
        assert self.progress is not None
        table = self.progress.queue[0]
        self.progress = Progress(self.progress.queue[1:])
        if not self.active:
            self.hold_lsn = None
        return TableFailure(table, reason)
