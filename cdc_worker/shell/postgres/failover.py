"""Failover slots (Postgres 17+): a logical slot created with `failover => true` is copied to every
standby that runs `sync_replication_slots = on`, so that after a promotion the worker reconnects to
the new primary (a multi-host DSN, `host=a,b target_session_attrs=read-write`) and streams on from
the same slot: no re-snapshot, nothing lost.

Two risks this module names, each in one line:
- without `synchronized_standby_slots` on the primary, a walsender may send the worker changes that
  no standby has received yet; after a promotion the topics then hold changes the new primary never
  had (and never will);
- a slot just created is copied to a standby as *temporary* until its consumer has advanced it past
  the standby's catalog xmin (the standby logs `newly created replication slot "…" is sync-ready
  now`); a promotion before that loses it. `bottledwater slot status --standby DSN` says which.

The decisions are pure (`choose_failover`, `missing_slot_problem`); the queries beside them.
"""

from __future__ import annotations

from dataclasses import dataclass

import psycopg2.extensions

FAILOVER_SLOT_VERSION = 170000
FAILOVER_SETTINGS = ("auto", "on", "off")
RUNBOOK = "docs/orchestration.md, Rebuilding after a lost slot"
FAILOVER_DOCS = "docs/worker.md, Failover slots"


@dataclass(frozen=True)
class FailoverFacts:
    server_version_num: int
    synchronized_standby_slots: str  # '' when unset, and before 17
    # Standbys streaming through a physical slot with hot_standby_feedback (the slot holds their
    # xmin): what slot sync needs of a standby, and what the primary can see of it. (The slot sync
    # worker's own connection carries the application_name of primary_conninfo, so it cannot be
    # told apart from other clients.)
    syncing_standbys: int

    @property
    def supports_failover_slots(self) -> bool:
        return self.server_version_num >= FAILOVER_SLOT_VERSION


_FACTS_SQL = """
SELECT current_setting('server_version_num')::int,
       coalesce(current_setting('synchronized_standby_slots', true), ''),
       (SELECT count(*) FROM pg_replication_slots
         WHERE slot_type = 'physical' AND active AND xmin IS NOT NULL)::int
"""


def failover_facts(conn: psycopg2.extensions.connection) -> FailoverFacts:
    with conn.cursor() as cur:
        cur.execute(_FACTS_SQL)
        row = cur.fetchone()
    assert row is not None
    return FailoverFacts(int(row[0]), str(row[1]), int(row[2]))


@dataclass(frozen=True)
class FailoverChoice:
    enabled: bool
    line: str  # said once at start-up: whether the slot is (or would be) a failover slot, and why
    warning: str | None = None
    problem: str | None = None  # a start-up check failure


def choose_failover(setting: str, facts: FailoverFacts) -> FailoverChoice:
    """`--failover-slot auto|on|off` on this server. Auto: on when the server is 17+ and a standby
    can sync slots from it (it streams through a physical slot with hot_standby_feedback), off
    otherwise."""
    version = facts.server_version_num // 10000
    if setting == "off":
        return FailoverChoice(False, "failover slot: off (--failover-slot off)")
    if not facts.supports_failover_slots:
        if setting == "on":
            return FailoverChoice(
                False,
                "failover slot: not possible",
                problem=f"--failover-slot on needs Postgres 17 or later (this server is {version}): "
                "drop the option, or upgrade the server",
            )
        return FailoverChoice(False, f"failover slot: off (Postgres {version}; failover slots need 17+)")
    if setting == "auto" and facts.syncing_standbys == 0:
        return FailoverChoice(
            False,
            "failover slot: off (no standby streams from this server through a physical slot with "
            "hot_standby_feedback; --failover-slot on to create one anyway)",
        )
    why = "--failover-slot on" if setting == "on" else f"{facts.syncing_standbys} standby(s) can sync slots"
    warning = None
    if not facts.synchronized_standby_slots:
        warning = (
            "synchronized_standby_slots is not set on the primary: the worker may receive and publish "
            "changes no standby has yet, which a promoted standby never had, so the topics would hold "
            "rows the new primary does not; set it to the standbys' physical slots "
            f"({FAILOVER_DOCS})"
        )
    return FailoverChoice(True, f"failover slot: on ({why})", warning)


def standby_choice(setting: str) -> FailoverChoice:
    """On a standby (capture from a standby) no slot can be a failover slot: Postgres creates those
    on a primary only."""
    if setting == "on":
        return FailoverChoice(
            False,
            "failover slot: not possible",
            problem="--failover-slot on, but this server is a standby and Postgres creates failover slots "
            "on a primary only: drop the option, or point -d/--postgres at the primary",
        )
    return FailoverChoice(
        False, "failover slot: off (a standby: Postgres creates failover slots on a primary only)"
    )


def missing_slot_problem(slot: str, snapshot_state: str | None, done_state: str) -> str | None:
    """A slot whose snapshot is recorded as done but which does not exist was lost, not dropped
    (`slot drop` and `rebuild` clear the record): typically a promotion to a standby the slot had
    not been synced to. Starting over silently would hide it; one line points to the runbook."""
    if snapshot_state != done_state:
        return None
    return (
        f"slot {slot} does not exist on this server, yet its snapshot was completed here: it was lost "
        "(a promotion to a standby it was not synced to, or dropped by hand); rebuild the pipeline "
        f"with `bottledwater rebuild --confirm {slot}` ({RUNBOOK})"
    )


@dataclass(frozen=True)
class StandbySlot:
    """The slot as a standby holds it: `synced` (copied by slot sync) and `temporary` (not yet
    sync-ready: a promotion now would drop it)."""

    exists: bool
    synced: bool
    temporary: bool

    @property
    def sync_ready(self) -> bool:
        return self.exists and self.synced and not self.temporary


def standby_slot(standby: psycopg2.extensions.connection, slot: str) -> StandbySlot:
    with standby.cursor() as cur:
        cur.execute("SELECT synced, temporary FROM pg_replication_slots WHERE slot_name = %s", (slot,))
        row = cur.fetchone()
    if row is None:
        return StandbySlot(False, False, False)
    return StandbySlot(True, bool(row[0]), bool(row[1]))
