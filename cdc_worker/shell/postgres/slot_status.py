"""`bottledwater slot status`: everything an engineer needs first about the slot, in one read.

Lag (bytes behind the current WAL position, and Postgres's own flush lag while a worker streams),
the WAL the slot retains, how much more it may retain before `max_slot_wal_keep_size` invalidates
it (`safe_wal_size`), `wal_status`, the server process streaming it, when the worker last
acknowledged, the snapshot state and the publications with their tables. `render` is pure, so what
it says is tested by feeding it a `SlotStatus`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import psycopg2.extensions

from cdc_worker.core.lsn import format_lsn, parse_lsn
from cdc_worker.core.units import human_bytes, human_seconds
from cdc_worker.shell.postgres import slot as slot_admin
from cdc_worker.shell.postgres.failover import FAILOVER_DOCS, StandbySlot

WAL_STATUS_LOST = "lost"
WAL_STATUS_UNRESERVED = "unreserved"

# The slot, the server's WAL position, and the walsender streaming it (pg_stat_replication's pid is
# the slot's active_pid): its flush lag and the time of the worker's last reply. `failover` exists
# from Postgres 17 on, read through to_jsonb so that one query fits every version (NULL before).
# On a standby the position it has replayed stands for the current WAL position.
_STATUS_SQL = """
WITH w AS (SELECT CASE WHEN pg_is_in_recovery()
                            THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_lsn() END AS lsn)
SELECT s.slot_name::text, s.database::text, current_database()::text, s.plugin::text, s.active_pid,
       s.wal_status, s.safe_wal_size, w.lsn::text, s.confirmed_flush_lsn::text,
       s.restart_lsn::text, pg_wal_lsn_diff(w.lsn, s.restart_lsn)::bigint,
       EXTRACT(EPOCH FROM r.flush_lag)::float8, r.reply_time,
       (to_jsonb(s) ->> 'failover')::boolean
  FROM pg_replication_slots s CROSS JOIN w LEFT JOIN pg_stat_replication r ON r.pid = s.active_pid
 WHERE s.slot_name = %s
"""
_PUBLICATION_TABLES_SQL = """
SELECT schemaname::text || '.' || tablename::text FROM pg_publication_tables WHERE pubname = %s ORDER BY 1
"""


@dataclass(frozen=True)
class PublicationSummary:
    name: str
    publish: str
    tables: tuple[str, ...]


@dataclass(frozen=True)
class SlotStatus:
    name: str
    database: str
    connected_database: str
    plugin: str
    active_pid: int | None
    wal_status: str | None
    safe_wal_bytes: int | None  # None: max_slot_wal_keep_size = -1 (no limit), or the slot is lost
    current_wal_lsn: int
    confirmed_flush_lsn: int | None
    restart_lsn: int | None
    retained_bytes: int | None  # None once the slot is lost: Postgres no longer knows its restart_lsn
    flush_lag_s: float | None
    last_reply_at: datetime | None
    snapshot: str | None
    publications: tuple[PublicationSummary, ...]
    failover: bool | None = None  # a failover slot (Postgres 17+; None before 17)
    on_standby: StandbySlot | None = None  # the slot as the standby given with --standby holds it

    @property
    def behind_bytes(self) -> int | None:
        position = self.confirmed_flush_lsn if self.confirmed_flush_lsn is not None else self.restart_lsn
        return None if position is None else max(0, self.current_wal_lsn - position)


def read_status(conn: psycopg2.extensions.connection, slot: str, publication: str) -> SlotStatus | None:
    with conn.cursor() as cur:
        cur.execute(_STATUS_SQL, (slot,))
        row = cur.fetchone()
    if row is None:
        return None
    (name, database, connected, plugin, pid, wal_status, safe, current, confirmed, restart, retained,
     flush_lag, reply_time, failover) = row  # fmt: skip
    publications: list[PublicationSummary] = []
    snapshot = None
    if database == connected:  # the snapshot record and the publications live in the slot's database
        snapshot = slot_admin.snapshot_state(conn, publication, slot)
        for pub_name in (publication, publication + slot_admin.INSERTS_SUFFIX):
            state = slot_admin.publication_state(conn, pub_name)
            if state.exists:
                with conn.cursor() as cur:
                    cur.execute(_PUBLICATION_TABLES_SQL, (pub_name,))
                    tables = tuple(r[0] for r in cur.fetchall())
                publications.append(PublicationSummary(pub_name, state.publish, tables))
    return SlotStatus(
        name=name,
        database=database,
        connected_database=connected,
        plugin=plugin,
        active_pid=pid,
        wal_status=wal_status,
        safe_wal_bytes=None if safe is None else int(safe),
        current_wal_lsn=parse_lsn(current),
        confirmed_flush_lsn=parse_lsn(confirmed) if confirmed else None,
        restart_lsn=parse_lsn(restart) if restart else None,
        retained_bytes=None if retained is None else max(0, int(retained)),
        flush_lag_s=flush_lag,
        last_reply_at=reply_time,
        snapshot=snapshot,
        publications=tuple(publications),
        failover=failover,
    )


def _lsn(value: int | None) -> str:
    return "-" if value is None else format_lsn(value)


def _bytes(value: int | None, unknown: str) -> str:
    return unknown if value is None else human_bytes(value)


def render(status: SlotStatus, now: datetime, dsn_hint: str = "-d/--postgres") -> list[str]:
    """The lines `bottledwater slot status` prints; the first says whether the slot can stream."""
    lost = status.wal_status == WAL_STATUS_LOST
    who = (
        f"active (server process {status.active_pid})"
        if status.active_pid
        else "inactive (no worker connected)"
    )
    lines = [f"slot {status.name}: database {status.database}, plugin {status.plugin}, {who}"]
    safe = (
        "unlimited (max_slot_wal_keep_size = -1)" if status.safe_wal_bytes is None and not lost
        else _bytes(status.safe_wal_bytes, "none")
    )  # fmt: skip
    lines.append(f"  wal_status {status.wal_status or 'unknown'}; safe WAL size {safe}")
    lines.append(
        f"  current WAL LSN {_lsn(status.current_wal_lsn)}, confirmed flush LSN "
        f"{_lsn(status.confirmed_flush_lsn)}, restart LSN {_lsn(status.restart_lsn)}"
    )
    lines.append(
        f"  behind the current WAL position {_bytes(status.behind_bytes, 'unknown')}; WAL retained "
        f"{_bytes(status.retained_bytes, 'unknown (the slot lost its WAL)' if lost else 'unknown')}"
    )
    if status.active_pid is None:
        lines.append("  lag in seconds: unknown (no worker connected); last acknowledgement: unknown")
    else:
        lag = "-" if status.flush_lag_s is None else f"{status.flush_lag_s:.1f} s"
        if status.last_reply_at is None:
            ack = "none yet"
        else:
            ago = human_seconds((now - status.last_reply_at).total_seconds())
            ack = f"{status.last_reply_at.isoformat()} ({ago} ago)"
        lines.append(f"  flush lag {lag}; last acknowledgement {ack}")
    if lost:
        lines.append(
            f"  LOST: Postgres removed WAL this slot still needed; it can never stream again. Rebuild: "
            f"stop the worker, then bottledwater rebuild --confirm {status.name} (docs/orchestration.md)"
        )
    elif status.wal_status == WAL_STATUS_UNRESERVED:
        lines.append(
            "  UNRESERVED: past max_slot_wal_keep_size, invalidated at the next checkpoint unless a worker "
            "catches up now"
        )
    lines += _failover_lines(status)
    if status.database != status.connected_database:
        lines.append(
            f"  connected to database {status.connected_database}, but the slot belongs to database "
            f"{status.database}: its snapshot state and publications live there; run again with "
            f"{dsn_hint} pointing at database {status.database}"
        )
        return lines
    lines.append(f"  snapshot {status.snapshot or 'not recorded'}")
    if not status.publications:
        lines.append("  no publication: the worker creates it on its first start")
    for publication in status.publications:
        lines.append(
            f"  publication {publication.name} ({publication.publish}): {len(publication.tables)} table(s)"
            + (f": {', '.join(publication.tables)}" if publication.tables else "")
        )
    return lines


def _failover_lines(status: SlotStatus) -> list[str]:
    """Whether the slot survives a promotion: a failover slot, and sync-ready on the standby."""
    if status.failover is None:
        return []  # before Postgres 17: no failover slots
    if not status.failover:
        return [f"  failover slot: no (a promoted standby will not have it: {FAILOVER_DOCS})"]
    standby = status.on_standby
    if standby is None:
        return ["  failover slot: yes; sync-ready on a standby: unknown (pass --standby DSN to check one)"]
    if standby.sync_ready:
        return ["  failover slot: yes; sync-ready on the standby (a promotion keeps it)"]
    if standby.exists:
        return [
            "  failover slot: yes; NOT sync-ready on the standby (synced but temporary): a promotion now "
            "would drop it; it becomes sync-ready once the worker has acknowledged past the standby's "
            "catalog xmin"
        ]
    return [
        "  failover slot: yes; MISSING on the standby: check sync_replication_slots, primary_slot_name, "
        "hot_standby_feedback and a dbname in primary_conninfo there"
    ]
