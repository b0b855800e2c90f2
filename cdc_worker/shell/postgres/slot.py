"""The replication slot and the publications: their lifecycle, and where the snapshot's progress is
recorded so that a worker killed in the middle of its snapshot starts over instead of resuming.

Operations warning: a slot holds WAL on the server until it is acknowledged. A slot left behind by a
worker that never comes back fills the disk; drop it (`bottledwater slot drop`) when retiring one.

Why two publications: Postgres refuses every UPDATE and DELETE of a table that has no replica
identity (REPLICA IDENTITY NOTHING, or DEFAULT without a primary key) as soon as it is in a
publication that publishes updates or deletes. Such tables go into a second publication,
`<name>_inserts`, that publishes inserts and truncates only, so capturing them never breaks the
application writing to them; their updates and deletes are not captured (the worker warns).

Why a comment: an existing slot normally means "resume, no snapshot", but a slot whose snapshot was
interrupted (kill -9, power loss) must not be resumed, or the rows it never published are lost.
The snapshot's state per slot is kept as JSON in the publication's comment, written before the slot
is created and updated when the snapshot is fully acknowledged, in the same database as the slot.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

import psycopg2.extensions
from psycopg2 import sql

from cdc_worker.core.errors import ConfigurationError
from cdc_worker.core.lsn import parse_lsn
from cdc_worker.shell.postgres import subsets
from cdc_worker.shell.postgres.catalog import CatalogTable

log = logging.getLogger(__name__)

OUTPUT_PLUGIN = "pgoutput"
PUBLISH_ALL = "insert, update, delete, truncate"
PUBLISH_INSERTS = "insert, truncate"
INSERTS_SUFFIX = "_inserts"
COMMENT_KEY = "bottledwater"
SNAPSHOT_PENDING = "pending"
SNAPSHOT_DONE = "done"
# A worker killed with -9 (or cut off) leaves its walsender behind for a moment; wait that long.
SLOT_RELEASE_WAIT_S = 15.0
SLOT_RELEASE_POLL_S = 0.25


class SlotError(ConfigurationError, RuntimeError):
    """A slot that cannot be used as asked; the message says why and what to do."""


@dataclass(frozen=True)
class SlotInfo:
    name: str
    database: str
    plugin: str
    active_pid: int | None
    confirmed_flush_lsn: int | None
    restart_lsn: int | None
    retained_bytes: int | None  # WAL the slot keeps on the server
    wal_status: str | None


@dataclass(frozen=True)
class CreatedSlot:
    name: str
    consistent_lsn: int  # where the stream starts, and the LSN of every snapshot row
    snapshot_name: str


# A standby has no current WAL position of its own: what it has replayed stands for it.
_SLOT_SQL = """
SELECT slot_name::text, database::text, plugin::text, active_pid, confirmed_flush_lsn::text,
       restart_lsn::text,
       pg_wal_lsn_diff(CASE WHEN pg_is_in_recovery()
                            THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_lsn() END,
                       restart_lsn)::bigint,
       wal_status
  FROM pg_replication_slots WHERE slot_name = %s
"""


def slot_info(conn: psycopg2.extensions.connection, slot: str) -> SlotInfo | None:
    with conn.cursor() as cur:
        cur.execute(_SLOT_SQL, (slot,))
        row = cur.fetchone()
    if row is None:
        return None
    name, database, plugin, pid, confirmed, restart, retained, wal_status = row
    return SlotInfo(
        name,
        database,
        plugin,
        pid,
        parse_lsn(confirmed) if confirmed else None,
        parse_lsn(restart) if restart else None,
        retained,
        wal_status,
    )


def wait_for_slot_release(conn: psycopg2.extensions.connection, name: str) -> SlotInfo | None:
    """The slot's info once no process holds it (or after SLOT_RELEASE_WAIT_S)."""
    deadline = time.monotonic() + SLOT_RELEASE_WAIT_S
    info = slot_info(conn, name)
    while info is not None and info.active_pid is not None and time.monotonic() < deadline:
        time.sleep(SLOT_RELEASE_POLL_S)
        info = slot_info(conn, name)
    return info


def check_slot_usable(info: SlotInfo, database: str) -> list[str]:
    """Problems with resuming an existing slot."""
    problems = []
    if info.database != database:
        problems.append(
            f"slot {info.name} belongs to database {info.database}, not {database}: pass another -s/--slot "
            "or connect to that database"
        )
    if info.plugin != OUTPUT_PLUGIN:
        problems.append(
            f"slot {info.name} uses output plugin {info.plugin}, not {OUTPUT_PLUGIN}: pass another -s/--slot "
            f"or drop it (bottledwater slot drop -s {info.name}) to start over with a snapshot"
        )
    if info.active_pid is not None:
        problems.append(
            f"slot {info.name} is in use by server process {info.active_pid} (another worker?): stop it first"
        )
    if info.wal_status == "lost":
        problems.append(
            f"slot {info.name} has lost required WAL (max_slot_wal_keep_size) and can never stream "
            f"again: rebuild it (bottledwater rebuild --confirm {info.name}, then reset the Delta tables "
            "and start the worker: docs/orchestration.md, Rebuilding after a lost slot)"
        )
    return problems


def create_slot(
    repl_conn: psycopg2.extensions.connection, slot: str, *, failover: bool = False
) -> CreatedSlot:
    """Create the slot on a replication connection, exporting its snapshot. The snapshot stays
    usable only while `repl_conn` stays open and runs no other command: keep it idle until the
    snapshot's transactions have all run SET TRANSACTION SNAPSHOT. `failover` (Postgres 17+): a
    slot that standbys with sync_replication_slots copy (shell/postgres/failover.py)."""
    # The option list is Postgres 15+ syntax; the older keyword form is kept where it suffices.
    options = sql.SQL("(SNAPSHOT 'export', FAILOVER)") if failover else sql.SQL("EXPORT_SNAPSHOT")
    with repl_conn.cursor() as cur:
        cur.execute(
            sql.SQL("CREATE_REPLICATION_SLOT {} LOGICAL {} {}").format(
                sql.Identifier(slot), sql.Identifier(OUTPUT_PLUGIN), options
            )
        )
        row = cur.fetchone()
    if row is None:
        raise SlotError(f"CREATE_REPLICATION_SLOT {slot} returned nothing")
    name, consistent_point, snapshot_name, _plugin = row
    return CreatedSlot(name, parse_lsn(consistent_point), snapshot_name)


def drop_slot(conn: psycopg2.extensions.connection, slot: str) -> bool:
    """Drop the slot if it exists and is not in use; False when there was none."""
    info = slot_info(conn, slot)
    if info is None:
        return False
    if info.active_pid is not None:
        raise SlotError(f"slot {slot} is in use by server process {info.active_pid}: stop that worker first")
    with conn.cursor() as cur:
        cur.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
    return True


# -- publications ------------------------------------------------------------------------------


@dataclass(frozen=True)
class PublicationState:
    name: str
    exists: bool
    owned: bool
    all_tables: bool
    publish: str  # the current publish setting, as the catalog flags say
    table_oids: frozenset[int]
    comment: str | None
    generated_columns: bool = False  # publish_generated_columns = stored (Postgres 18+)
    # publish_via_partition_root: how partitioned tables are captured (`partitions.PartitionMode`)
    via_root: bool = False


# pubgencols exists from Postgres 18 on: read through to_jsonb so one query fits every version.
_PUBLICATION_SQL = """
SELECT p.oid, pg_has_role(p.pubowner, 'USAGE'), p.puballtables,
       concat_ws(', ', CASE WHEN p.pubinsert THEN 'insert' END, CASE WHEN p.pubupdate THEN 'update' END,
                 CASE WHEN p.pubdelete THEN 'delete' END, CASE WHEN p.pubtruncate THEN 'truncate' END),
       ARRAY(SELECT prrelid::bigint FROM pg_publication_rel WHERE prpubid = p.oid),
       obj_description(p.oid, 'pg_publication'),
       coalesce(to_jsonb(p) ->> 'pubgencols' = 's', false), p.pubviaroot
  FROM pg_publication p WHERE p.pubname = %s
"""


def publication_state(conn: psycopg2.extensions.connection, name: str) -> PublicationState:
    with conn.cursor() as cur:
        cur.execute(_PUBLICATION_SQL, (name,))
        row = cur.fetchone()
    if row is None:
        return PublicationState(name, False, True, False, "", frozenset(), None)
    _oid, owned, all_tables, publish, oids, comment, generated, via_root = row
    return PublicationState(
        name, True, owned, all_tables, publish, frozenset(oids), comment, generated, via_root
    )


def publishes_generated_columns(conn: psycopg2.extensions.connection, names: Sequence[str]) -> bool:
    """Whether the stream's publications publish stored generated columns (so the tables read
    beside the stream, as by a re-snapshot, must have them too)."""
    return any(publication_state(conn, name).generated_columns for name in names)


@dataclass(frozen=True)
class PublicationPlan:
    """What each publication must contain: `main` every table with a replica identity, `inserts`
    the others (empty when there are none)."""

    main: PublicationState
    inserts: PublicationState
    main_tables: tuple[CatalogTable, ...]
    insert_tables: tuple[CatalogTable, ...]
    generated_columns: bool = False  # publish stored generated columns (only asked on Postgres 18+)
    via_root: bool = True  # publish_via_partition_root (`--partitions root`)

    @property
    def names(self) -> list[str]:
        """The publications the stream reads: `inserts` only while it has tables."""
        return [self.main.name] + ([self.inserts.name] if self.insert_tables else [])


def plan_publications(
    conn: psycopg2.extensions.connection,
    name: str,
    tables: Sequence[CatalogTable],
    *,
    generated_columns: bool = False,
    via_root: bool = True,
) -> PublicationPlan:
    return PublicationPlan(
        main=publication_state(conn, name),
        inserts=publication_state(conn, name + INSERTS_SUFFIX),
        main_tables=tuple(t for t in tables if t.has_replica_identity),
        insert_tables=tuple(t for t in tables if not t.has_replica_identity),
        generated_columns=generated_columns,
        via_root=via_root,
    )


def check_publications(plan: PublicationPlan, *, role: str, database: str, can_create: bool) -> list[str]:
    """Problems that would stop `sync_publications`, found before anything is changed."""
    problems = []
    for state, tables, needed in (
        (plan.main, plan.main_tables, True),
        (plan.inserts, plan.insert_tables, bool(plan.insert_tables)),
    ):
        if state.exists and not state.owned:
            problems.append(
                f"publication {state.name} is owned by another role: ALTER PUBLICATION {state.name} "
                f"OWNER TO {role}, or pass another --publication"
            )
            continue
        if state.all_tables:
            problems.append(
                f"publication {state.name} is FOR ALL TABLES and cannot follow --tables: drop it or pass "
                "another --publication"
            )
        if needed and not state.exists and not can_create:
            problems.append(
                f"role {role} cannot create publication {state.name}: GRANT CREATE ON DATABASE {database} "
                f"TO {role}, or create it yourself and make it the role's (ALTER PUBLICATION ... OWNER TO)"
            )
        for table in tables:
            if table.schema.oid not in state.table_oids and not table.owned:
                problems.append(
                    f"role {role} cannot add table {table.qualified_name} to publication {state.name} "
                    f"(Postgres requires ownership): as its owner run ALTER PUBLICATION {state.name} "
                    f"ADD TABLE {table.qualified_name}"
                )
    return problems


def _table_list(tables: Sequence[CatalogTable]) -> sql.Composable:
    """The tables with their column lists and row filters (`subsets.table_spec`)."""
    return sql.SQL(", ").join(subsets.table_spec(t) for t in tables)


def _generated_setting(generated: bool) -> sql.Composable:
    return sql.SQL("publish_generated_columns = {}").format(sql.SQL("stored" if generated else "none"))


def _via_root_setting(via_root: bool) -> sql.Composable:
    return sql.SQL("publish_via_partition_root = {}").format(sql.SQL("true" if via_root else "false"))


def _sync_one(
    cur: psycopg2.extensions.cursor,
    state: PublicationState,
    tables: Sequence[CatalogTable],
    publish: str,
    *,
    generated: bool,
    via_root: bool,
) -> None:
    name = sql.Identifier(state.name)
    if not state.exists:
        statement = sql.SQL("CREATE PUBLICATION {}").format(name)
        if tables:
            statement += sql.SQL(" FOR TABLE {}").format(_table_list(tables))
        settings = [sql.SQL("publish = {}").format(sql.Literal(publish)), _via_root_setting(via_root)]
        if generated:  # asked on Postgres 18+ only: older servers know no such option
            settings.append(_generated_setting(generated))
        cur.execute(statement + sql.SQL(" WITH ({})").format(sql.SQL(", ").join(settings)))
        log.info("created publication %s (%s) for %d table(s)", state.name, publish, len(tables))
        return
    if state.publish != publish:
        cur.execute(sql.SQL("ALTER PUBLICATION {} SET (publish = {})").format(name, sql.Literal(publish)))
    if state.via_root != via_root:  # a resumed slot's mode was checked at start (partitions.py)
        cur.execute(sql.SQL("ALTER PUBLICATION {} SET ({})").format(name, _via_root_setting(via_root)))
    if state.generated_columns != generated:  # differs on Postgres 18+ only
        cur.execute(sql.SQL("ALTER PUBLICATION {} SET ({})").format(name, _generated_setting(generated)))
        log.info(
            "publication %s: stored generated columns %s",
            state.name,
            "published" if generated else "left out",
        )
    wanted = {t.schema.oid for t in tables}
    # A table whose column list or row filter is asked for, or was published with one, is added
    # again with what is asked now (a resumed slot's selection was checked unchanged at start).
    held = subsets.published(cur.connection, [state.name])
    plain = subsets.Published(None, None)
    respecified = [
        t
        for t in tables
        if t.schema.oid in state.table_oids
        and (t.column_list is not None or t.row_filter is not None or held.get(t.schema.oid, plain) != plain)
    ]
    if respecified:
        cur.execute(sql.SQL("ALTER PUBLICATION {} DROP TABLE {}").format(name, sql.SQL(", ").join(
            sql.Identifier(t.schema.namespace, t.schema.name) for t in respecified)))  # fmt: skip
    to_add = [t for t in tables if t.schema.oid not in state.table_oids or t in respecified]
    if to_add:
        cur.execute(sql.SQL("ALTER PUBLICATION {} ADD TABLE {}").format(name, _table_list(to_add)))
    to_drop = sorted(state.table_oids - wanted)
    if to_drop:
        cur.execute(
            "SELECT n.nspname::text, c.relname::text FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = ANY (%s::oid[])",
            (to_drop,),
        )
        dropped = sql.SQL(", ").join(sql.Identifier(nsp, rel) for nsp, rel in cur.fetchall())
        cur.execute(sql.SQL("ALTER PUBLICATION {} DROP TABLE {}").format(name, dropped))
    if to_add or to_drop:
        log.info("publication %s: added %d table(s), dropped %d", state.name, len(to_add), len(to_drop))


def sync_publications(conn: psycopg2.extensions.connection, plan: PublicationPlan) -> None:
    """Make the publications contain exactly the planned tables, in one transaction."""
    with conn.cursor() as cur:
        cur.execute("BEGIN")
        try:
            settings = {"generated": plan.generated_columns, "via_root": plan.via_root}
            _sync_one(cur, plan.main, plan.main_tables, PUBLISH_ALL, **settings)
            if plan.insert_tables or plan.inserts.exists:
                _sync_one(cur, plan.inserts, plan.insert_tables, PUBLISH_INSERTS, **settings)
            cur.execute("COMMIT")
        except BaseException:
            cur.execute("ROLLBACK")
            raise
    for table in plan.insert_tables:
        log.warning(
            "table %s has no replica identity: only its inserts (and truncates) are captured; to capture "
            "updates and deletes, add a primary key or ALTER TABLE %s REPLICA IDENTITY FULL",
            table.qualified_name,
            table.qualified_name,
            extra={"table": table.qualified_name},
        )


def drop_publication(conn: psycopg2.extensions.connection, name: str) -> bool:
    with conn.cursor() as cur:
        cur.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (name,))
        if cur.fetchone() is None:
            return False
        cur.execute(sql.SQL("DROP PUBLICATION {}").format(sql.Identifier(name)))
    return True


# -- snapshot state, in the main publication's comment ------------------------------------------


def _parse_comment(comment: str | None) -> dict[str, dict[str, str]]:
    if not comment:
        return {}
    try:
        parsed = json.loads(comment)
    except ValueError:
        return {}  # someone else's comment: ours replaces it
    slots = parsed.get(COMMENT_KEY, {}).get("snapshots", {}) if isinstance(parsed, dict) else {}
    return slots if isinstance(slots, dict) else {}


def snapshot_state(conn: psycopg2.extensions.connection, publication: str, slot: str) -> str | None:
    """`SNAPSHOT_PENDING`, `SNAPSHOT_DONE`, or None when nothing was recorded for `slot`."""
    entry = _parse_comment(publication_state(conn, publication).comment).get(slot)
    return entry.get("state") if isinstance(entry, dict) else None


def record_snapshot_state(
    conn: psycopg2.extensions.connection, publication: str, slot: str, state: str | None, lsn: str = ""
) -> None:
    """Set (or with None, remove) `slot`'s snapshot state. A transaction-scoped advisory lock keeps
    two workers sharing the publication from losing each other's entries."""
    with conn.cursor() as cur:
        cur.execute("BEGIN")
        try:
            cur.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"{COMMENT_KEY}:{publication}",))
            snapshots = _parse_comment(publication_state(conn, publication).comment)
            if state is None:
                snapshots.pop(slot, None)
            else:
                snapshots[slot] = {"state": state, "lsn": lsn}
            comment = json.dumps({COMMENT_KEY: {"snapshots": snapshots}}, sort_keys=True)
            cur.execute(
                sql.SQL("COMMENT ON PUBLICATION {} IS {}").format(
                    sql.Identifier(publication), sql.Literal(comment)
                )
            )
            cur.execute("COMMIT")
        except BaseException:
            cur.execute("ROLLBACK")
            raise


def slots_recorded(conn: psycopg2.extensions.connection, publication: str) -> set[str]:
    return set(_parse_comment(publication_state(conn, publication).comment))
