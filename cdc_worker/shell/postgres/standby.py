"""Capture from a hot standby (Postgres 16+): logical decoding runs on the standby, so the worker's
reads (the snapshot, the stream) stay off the primary. What differs from a primary:

- nothing can be written there. The publications must already exist (made on the primary, they reach
  the standby through the WAL): a missing one or a missing table is one line naming the SQL to run
  on the primary. The snapshot's state cannot go into the publication's comment either, so the slot
  is made *temporary* for the snapshot (it vanishes with the worker's connection if the snapshot is
  interrupted) and copied to its permanent name once the snapshot is complete: on a standby, a slot
  that exists is a slot whose snapshot completed.
- creating a slot waits for the primary's next running-xacts record (the bgwriter logs one every
  15 s while the primary is busy, none while it is idle). The worker says so in one line while it
  waits; `SELECT pg_log_standby_snapshot()` on the primary ends the wait at once.
- `hot_standby_feedback = on` is required: without it the primary's vacuum removes catalog rows the
  slot still needs, and the standby invalidates the slot (a new snapshot).
- failover slots cannot be created on a standby (Postgres creates them on a primary only).

Exported snapshots, their import (SET TRANSACTION SNAPSHOT) and the copy of a temporary slot work on
a standby of 16, 17 and 18 (tried on each; the version tier tests 16, whose standby the stack runs
for it, and the failover drill uses 17 and 18's).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import psycopg2.extensions
from psycopg2 import sql

from cdc_worker.core.errors import ConfigurationError
from cdc_worker.core.lsn import parse_lsn
from cdc_worker.shell.postgres import slot as slot_admin
from cdc_worker.shell.postgres.catalog import CatalogTable, ServerFacts

log = logging.getLogger(__name__)

STANDBY_DECODING_VERSION = 160000
STANDBY_DOCS = "docs/worker.md, Capture from a standby"
# Said only when the wait is noticeable: on a busy primary the record comes within a second.
WAIT_LINE_AFTER_S = 2.0
MAX_SLOT_NAME = 63  # NAMEDATALEN - 1


class StandbyError(ConfigurationError, RuntimeError):
    """Something only the primary can do was asked of a standby; the message names it."""


def is_capturing_standby(facts: ServerFacts) -> bool:
    return facts.in_recovery and facts.server_version_num >= STANDBY_DECODING_VERSION


def check_standby(facts: ServerFacts) -> list[str]:
    """What a standby needs for the worker to capture from it, one line each."""
    if not facts.in_recovery:
        return []
    version = facts.server_version_num // 10000
    if facts.server_version_num < STANDBY_DECODING_VERSION:
        return [
            f"this server is a standby (in recovery) and Postgres {version} cannot decode on a standby "
            "(16+ can): point -d/--postgres at the primary, or with several hosts add "
            "target_session_attrs=read-write"
        ]
    if not facts.hot_standby_feedback:
        return [
            "this standby runs with hot_standby_feedback = off: the primary's vacuum would remove catalog "
            "rows the slot needs and the standby would invalidate it; set hot_standby_feedback = on on "
            f"the standby (and a physical slot, primary_slot_name) and reload ({STANDBY_DOCS})"
        ]
    return []


def _names(conn: psycopg2.extensions.connection, tables: Sequence[CatalogTable]) -> str:
    listed = sql.SQL(", ").join(sql.Identifier(t.schema.namespace, t.schema.name) for t in tables)
    return str(listed.as_string(conn))


def publication_problems(conn: psycopg2.extensions.connection, plan: slot_admin.PublicationPlan) -> list[str]:
    """The publications as the standby sees them must already hold the planned tables: one line per
    difference, with the statement to run on the primary (a standby cannot create or alter one)."""
    problems = []
    for state, tables, publish in (
        (plan.main, plan.main_tables, slot_admin.PUBLISH_ALL),
        (plan.inserts, plan.insert_tables, slot_admin.PUBLISH_INSERTS),
    ):
        if not tables and not state.exists:
            continue
        name = str(sql.Identifier(state.name).as_string(conn))
        where = f"publication {state.name} on this standby"
        if not state.exists:
            options = f"publish = '{publish}'" + (
                ", publish_generated_columns = stored" if plan.generated_columns else ""
            )
            options += ", publish_via_partition_root = true" if plan.via_root else ""
            problems.append(
                f"{where} does not exist, and a standby cannot create one: on the primary run "
                f"CREATE PUBLICATION {name} FOR TABLE {_names(conn, tables)} WITH ({options})"
            )
            continue
        missing = [t for t in tables if t.schema.oid not in state.table_oids]
        if missing:
            problems.append(
                f"{where} lacks table(s) {', '.join(t.qualified_name for t in missing)}: on the primary run "
                f"ALTER PUBLICATION {name} ADD TABLE {_names(conn, missing)} (or leave them out with "
                "--exclude-tables)"
            )
        if state.publish != publish:
            problems.append(
                f"{where} publishes {state.publish or 'nothing'}, not {publish}: on the primary run "
                f"ALTER PUBLICATION {name} SET (publish = '{publish}')"
            )
        if state.via_root != plan.via_root and any(t.partitioned or t.is_partition for t in tables):
            wanted = "true" if plan.via_root else "false"
            problems.append(
                f"{where} has publish_via_partition_root = {'true' if state.via_root else 'false'}: on the "
                f"primary run ALTER PUBLICATION {name} SET (publish_via_partition_root = {wanted}), or "
                f"match it with --partitions {'leaf' if state.via_root is False else 'root'}"
            )
        if state.generated_columns != plan.generated_columns:
            setting = "stored" if plan.generated_columns else "none"
            problems.append(
                f"{where} has publish_generated_columns = {'stored' if state.generated_columns else 'none'}: "
                f"on the primary run ALTER PUBLICATION {name} SET (publish_generated_columns = {setting}), "
                "or match it with --no-generated-columns"
            )
    return problems


def temporary_name(slot: str) -> str:
    """The snapshot's temporary slot: the worker's pid keeps two workers' apart."""
    return f"bw_snapshot_{os.getpid()}_{slot}"[:MAX_SLOT_NAME]


@contextmanager
def announce_wait(slot: str, *, on_standby: bool = True) -> Iterator[None]:
    """One line if creating `slot` is still waiting after WAIT_LINE_AFTER_S: on a standby for the
    primary's next running-xacts record, on a primary for the transactions running there to end."""
    if on_standby:
        line: tuple[object, ...] = (
            "creating slot %s on a standby waits for a running-xacts record from the primary (logged "
            "every 15 s while the primary is busy, not while it is idle): run SELECT "
            "pg_log_standby_snapshot() on the primary to end the wait (%s)",
            slot,
            STANDBY_DOCS,
        )
    else:
        line = (
            "creating slot %s waits for the transactions running on the server to end (a slot's "
            "snapshot starts after them): find them with SELECT pid, xact_start, state FROM "
            "pg_stat_activity WHERE backend_xid IS NOT NULL OR backend_xmin IS NOT NULL",
            slot,
        )
    timer = threading.Timer(WAIT_LINE_AFTER_S, log.info, line)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def create_snapshot_slot(
    repl_conn: psycopg2.extensions.connection, slot: str, *, on_standby: bool = True
) -> slot_admin.CreatedSlot:
    """A temporary slot exporting the snapshot; `make_permanent` gives it `slot`'s name once the
    snapshot is complete. Interrupted, it disappears with `repl_conn`: nothing to clean up.
    `on_standby`: what its wait line says (the primary's finishing snapshots use one too)."""
    temporary = temporary_name(slot)
    with announce_wait(slot, on_standby=on_standby), repl_conn.cursor() as cur:
        cur.execute(
            sql.SQL("CREATE_REPLICATION_SLOT {} TEMPORARY LOGICAL {} EXPORT_SNAPSHOT").format(
                sql.Identifier(temporary), sql.Identifier(slot_admin.OUTPUT_PLUGIN)
            )
        )
        row = cur.fetchone()
    if row is None:
        raise StandbyError(f"CREATE_REPLICATION_SLOT {temporary} returned nothing")
    return slot_admin.CreatedSlot(row[0], parse_lsn(row[1]), row[2])


def make_permanent(
    conn: psycopg2.extensions.connection, repl_conn: psycopg2.extensions.connection, temporary: str, slot: str
) -> None:
    """Copy the temporary slot (its position and catalog xmin) to `slot`, permanent, then drop it.
    A crash between the two leaves `slot` complete and the temporary one gone with its connection."""
    with conn.cursor() as cur:
        cur.execute("SELECT pg_copy_logical_replication_slot(%s, %s, false)", (temporary, slot))
    with repl_conn.cursor() as cur:
        cur.execute(sql.SQL("DROP_REPLICATION_SLOT {}").format(sql.Identifier(temporary)))
