"""Reconnecting in-process after the connection to Postgres is lost while streaming: a restart, a
network cut, or a promotion (a multi-host DSN, `host=a,b target_session_attrs=read-write`, reaches
the new primary). The worker streams on from the slot where the server has it (a failover slot
synced to the promoted standby: shell/postgres/failover.py), without a new snapshot.

Three outcomes, each said in one line:
- a server is reached and holds the slot, usable: streaming goes on from its confirmed position
  (changes after it are published again: at-least-once, as after any restart);
- a server is reached but the slot is missing, not sync-ready (temporary: a promotion dropped or is
  about to drop it) or lost: nothing can stream without a rebuild; the line points to the runbook
  and the worker exits 2 ("needs a person": the Dagster supervisor pages with this line, and the
  slot-lag sensor pages on the slot it saw disappear);
- no server within `--reconnect-timeout`: the worker exits 1, as it did before it reconnected.

One more check after a promotion: the new primary's timeline history says where it left the old
one (the switch point). A transaction published from the old primary whose commit lies at or past
it was never received by the new primary (`synchronized_standby_slots` unset): the topics hold rows
the database does not, which needs a person (exit 2), not a silent resume.

The decisions are pure (`backoff_delays`, `slot_problem`, `switch_point`); the I/O beside them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import psycopg2
import psycopg2.extensions
from psycopg2 import sql

from cdc_worker.core.errors import ConfigurationError
from cdc_worker.core.lsn import format_lsn, parse_lsn
from cdc_worker.shell.postgres import catalog as postgres
from cdc_worker.shell.postgres import slot as slot_admin
from cdc_worker.shell.postgres.failover import RUNBOOK

log = logging.getLogger(__name__)

FIRST_BACKOFF_S = 0.5
MAX_BACKOFF_S = 5.0


class SlotUnusableAfterReconnect(ConfigurationError, RuntimeError):
    """The server reached after a lost connection cannot stream the slot on; needs a person."""


@dataclass(frozen=True)
class ServerIdentity:
    """IDENTIFY_SYSTEM: which cluster, and on which timeline (a promotion starts a new one)."""

    system_id: str
    timeline: int


def identify(repl: psycopg2.extensions.connection) -> ServerIdentity:
    """On an idle replication connection (never during an exported snapshot: it would end it)."""
    with repl.cursor() as cur:
        cur.execute("IDENTIFY_SYSTEM")
        row = cur.fetchone()
    assert row is not None
    return ServerIdentity(str(row[0]), int(row[1]))


def backoff_delays(first_s: float = FIRST_BACKOFF_S, max_s: float = MAX_BACKOFF_S) -> Iterator[float]:
    """The waits between attempts: doubling from `first_s`, capped at `max_s`."""
    delay = first_s
    while True:
        yield delay
        delay = min(delay * 2, max_s)


def slot_problem(slot: str, info: slot_admin.SlotInfo | None, temporary: bool, where: str) -> str | None:
    """Why the slot cannot be streamed on after a reconnect to `where`, in one line; None if it can."""
    rebuild = f"rebuild the pipeline with `bottledwater rebuild --confirm {slot}` ({RUNBOOK})"
    if info is None:
        return (
            f"reconnected to {where}, but slot {slot} does not exist there (a promotion to a standby it "
            f"was not synced to, or it was dropped): nothing can stream on without a new snapshot; {rebuild}"
        )
    if temporary:
        return (
            f"reconnected to {where}, but slot {slot} is not sync-ready there (synced but temporary: the "
            f"worker had not acknowledged past the standby's catalog xmin before the promotion); {rebuild}"
        )
    if info.wal_status == "lost":
        return f"reconnected to {where}, but slot {slot} has lost required WAL there; {rebuild}"
    return None


def switch_point(history: str, old_timeline: int) -> int | None:
    """Where the timeline history file leaves `old_timeline` (`tli<TAB>switchpoint<TAB>reason`
    lines); None when the history does not name it."""
    for line in history.splitlines():
        fields = line.split("\t")
        if len(fields) >= 2 and fields[0].strip().isdigit() and int(fields[0]) == old_timeline:
            return parse_lsn(fields[1].strip())
    return None


def unheld_problem(
    before: ServerIdentity, after: ServerIdentity, history: str | None, published_commit_lsn: int
) -> str | None:
    """Whether the server reached now can hold everything published from the one before."""
    if after.system_id != before.system_id:
        return (
            f"reconnected to another database cluster (system {after.system_id}, not {before.system_id}): "
            "the DSN now reaches a server that is not a copy of the one streamed from; fix -d/--postgres"
        )
    if after.timeline == before.timeline or history is None:
        return None
    point = switch_point(history, before.timeline)
    if point is None or published_commit_lsn < point:
        return None
    return (
        f"the new primary left timeline {before.timeline} at {format_lsn(point)}, but a transaction "
        f"committed at {format_lsn(published_commit_lsn)} was already published from the old primary: the "
        "topics hold changes the new primary never had (set synchronized_standby_slots on the primary: "
        f"docs/worker.md, Failover slots); {RUNBOOK}"
    )


def _timeline_history(repl: psycopg2.extensions.connection, timeline: int) -> str:
    with repl.cursor() as cur:
        cur.execute(sql.SQL("TIMELINE_HISTORY {}").format(sql.Literal(timeline)))
        row = cur.fetchone()
    content = row[1] if row else ""
    return bytes(content).decode() if isinstance(content, bytes | memoryview) else str(content)


@dataclass
class Reconnected:
    conn: psycopg2.extensions.connection
    repl: psycopg2.extensions.connection
    identity: ServerIdentity
    start_lsn: int


def _where(conn: psycopg2.extensions.connection) -> str:
    return f"{conn.info.host}:{conn.info.port}"


# `synced` exists from Postgres 17 on: read through to_jsonb so that one query fits every version.
_SLOT_STATE_SQL = """
SELECT s.temporary, pg_is_in_recovery() AND coalesce((to_jsonb(s) ->> 'synced')::boolean, false)
  FROM pg_replication_slots s WHERE s.slot_name = %s
"""


def _slot_state(
    conn: psycopg2.extensions.connection, slot: str
) -> tuple[slot_admin.SlotInfo | None, bool, bool]:
    """The slot once no process holds it (a walsender of the lost connection may linger a moment),
    whether it is temporary (not sync-ready on a promoted standby), and whether the server is a
    standby still syncing it from a primary (not promoted yet: the slot cannot stream there)."""
    info = slot_admin.wait_for_slot_release(conn, slot)
    with conn.cursor() as cur:
        cur.execute(_SLOT_STATE_SQL, (slot,))
        row = cur.fetchone()
    return info, bool(row and row[0]), bool(row and row[1])


def reconnect(
    dsn: str,
    slot: str,
    *,
    timeout_s: float,
    before: ServerIdentity,
    published_commit_lsn: int,
    stop: threading.Event,
    clock: Callable[[], float] = time.monotonic,
) -> Reconnected | None:
    """Connect again (bounded backoff, one line per attempt) and check that the slot can stream on
    there. None when `stop` was set meanwhile; `PostgresConnectionLost` after `timeout_s`;
    `SlotUnusableAfterReconnect` when the server reached cannot stream the slot on."""
    deadline = clock() + timeout_s
    last_error = ""
    for attempt, delay in enumerate(backoff_delays(), start=1):
        if attempt > 1:
            left = deadline - clock()
            if left <= 0:
                break
            log.warning(
                "reconnecting to Postgres: attempt %d %s; next in %.1f s, %.0f s left (--reconnect-timeout)",
                attempt - 1,
                last_error,
                min(delay, left),
                left,
            )
            if stop.wait(min(delay, left)):
                return None
        conn = repl = None
        try:
            conn = postgres.connect(dsn)
            repl = postgres.connect(dsn, replication=True)
            after = identify(repl)
            where = _where(conn)
            history = _timeline_history(repl, after.timeline) if after.timeline != before.timeline else None
            info, temporary, still_syncing = _slot_state(conn, slot)
        except psycopg2.Error as exc:
            for opened in (conn, repl):
                if opened is not None:
                    opened.close()
            last_error = f"failed ({' '.join(str(exc).split())})"
            continue
        if still_syncing:  # a standby not promoted yet, which the DSN lets the worker reach
            conn.close()
            repl.close()
            last_error = (
                f"reached {where}, a standby still syncing slot {slot}: waiting for its promotion (add "
                "target_session_attrs=read-write to the DSN to skip standbys)"
            )
            continue
        log.info(
            "reconnecting to Postgres: attempt %d reached %s (timeline %d)", attempt, where, after.timeline
        )
        problem = unheld_problem(before, after, history, published_commit_lsn) or slot_problem(
            slot, info, temporary, where
        )
        if problem is not None or info is None:
            conn.close()
            repl.close()
            raise SlotUnusableAfterReconnect(problem)
        return Reconnected(conn, repl, after, info.confirmed_flush_lsn or 0)
    raise postgres.PostgresConnectionLost(
        f"lost the connection to Postgres and could not reconnect within {timeout_s:.0f} s "
        f"(--reconnect-timeout); the last attempt {last_error}"
    )
