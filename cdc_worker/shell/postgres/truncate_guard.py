"""The guard that keeps a leaf partition's TRUNCATE from being lost when partitioned tables are
captured as their root (`--partitions root`).

pgoutput does not send the TRUNCATE of a partition whose changes it publishes as its root's (only a
TRUNCATE of the root itself is sent, as the root's): without a guard the leaf's rows would stay in
the root's topic and mirror, silently. So the worker puts a statement-level BEFORE TRUNCATE trigger
on every leaf of each captured root, calling `bottledwater_truncate_guard()` (in the root's schema),
which first deletes the leaf's rows: ordinary deletes, decoded under the root, published as
tombstones of exactly that leaf's keys and applied by the merge as any delete. The TRUNCATE then
finds the leaf empty. The cost is that of a DELETE of the leaf's rows (WAL, time), paid in the
truncating transaction; capture leaf by leaf (`--partitions leaf`) where that matters.

A TRUNCATE of the root is published as it always was, and fires every leaf's trigger too: the
root's own BEFORE trigger marks it as being truncated (a transaction-local setting,
`bottledwater.truncating`, holding the root OIDs), which its AFTER trigger clears at the end of the
statement, so the leaves' guards delete nothing then.

The guards are installed at start, on the primary, for the leaves the worker's role may put a
trigger on (their owner, or TRIGGER privilege), and while streaming for a leaf created or attached
since (`guard_leaf`), when the first change of it is decoded: an empty partition has nothing to
lose. A root that cannot be guarded is named in a warning, with what to do.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import psycopg2
import psycopg2.extensions
from psycopg2 import sql

from cdc_worker.shell.postgres.catalog import CatalogTable, load_tables

log = logging.getLogger(__name__)

FUNCTION_NAME = "bottledwater_truncate_guard"
LEAF_TRIGGER = "bottledwater_truncate_guard"
ROOT_BEFORE_TRIGGER = "bottledwater_truncate_root_begins"
ROOT_AFTER_TRIGGER = "bottledwater_truncate_root_ends"
SETTING = "bottledwater.truncating"

# TG_ARGV[0]: 'root' on the root's two triggers, 'leaf' on each leaf's. SECURITY DEFINER: the rows
# are deleted with the rights of the role that owns the guard (the tables' owner), whoever truncates.
FUNCTION_BODY = """
DECLARE
  roots text[] := string_to_array(coalesce(current_setting('bottledwater.truncating', true), ''), ',');
BEGIN
  IF TG_ARGV[0] = 'root' THEN
    roots := array_remove(roots, TG_RELID::text);
    IF TG_WHEN = 'BEFORE' THEN
      roots := roots || TG_RELID::text;
    END IF;
    PERFORM set_config('bottledwater.truncating', array_to_string(roots, ','), true);
  ELSIF NOT (pg_partition_root(TG_RELID)::oid::text = ANY (roots)) THEN
    EXECUTE format('DELETE FROM ONLY %I.%I', TG_TABLE_SCHEMA, TG_TABLE_NAME);
  END IF;
  RETURN NULL;
END
"""

_EXISTING = """
SELECT tgrelid::bigint, tgname::text FROM pg_trigger WHERE tgrelid = ANY (%s::oid[]) AND tgname = ANY (%s)
"""


def _create_trigger(
    name: str, when: str, table: sql.Composable, function: sql.Composable, kind: str
) -> sql.Composed:
    return sql.SQL("CREATE TRIGGER {} {} TRUNCATE ON {} FOR EACH STATEMENT EXECUTE FUNCTION {}({})").format(
        sql.Identifier(name), sql.SQL(when), table, function, sql.Literal(kind)
    )


def _guard_root(cur: psycopg2.extensions.cursor, root: CatalogTable, lock_timeout_ms: int | None) -> int:
    """Install the function and the missing triggers of one root, in the caller's transaction;
    returns how many leaf guards were added. Two workers starting together take turns (a lock)."""
    if lock_timeout_ms is not None:
        cur.execute("SET LOCAL lock_timeout = %s", (f"{lock_timeout_ms}ms",))
    cur.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (SETTING,))
    schema = root.schema
    oids = [schema.oid] + [leaf.oid for leaf in root.leaves]
    cur.execute(_EXISTING, (oids, [LEAF_TRIGGER, ROOT_BEFORE_TRIGGER, ROOT_AFTER_TRIGGER]))
    existing = {(int(oid), str(name)) for oid, name in cur.fetchall()}
    function = sql.Identifier(schema.namespace, FUNCTION_NAME)
    cur.execute(
        sql.SQL(
            "CREATE OR REPLACE FUNCTION {}() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER "
            "SET search_path = pg_catalog AS {}"
        ).format(function, sql.Literal(FUNCTION_BODY))
    )
    relation = sql.Identifier(schema.namespace, schema.name)
    for name, when in ((ROOT_BEFORE_TRIGGER, "BEFORE"), (ROOT_AFTER_TRIGGER, "AFTER")):
        if (schema.oid, name) not in existing:
            cur.execute(_create_trigger(name, when, relation, function, "root"))
    added = 0
    for leaf in root.leaves:
        if (leaf.oid, LEAF_TRIGGER) not in existing:
            leaf_relation = sql.Identifier(leaf.namespace, leaf.name)
            cur.execute(_create_trigger(LEAF_TRIGGER, "BEFORE", leaf_relation, function, "leaf"))
            added += 1
    return added


def install(
    conn: psycopg2.extensions.connection,
    tables: Sequence[CatalogTable],
    *,
    lock_timeout_ms: int | None = None,
) -> list[str]:
    """Guard the leaves of every partitioned table in `tables` (each root in its own transaction);
    returns one warning line per root that could not be guarded, naming what to do.
    `lock_timeout_ms`: give up rather than wait longer for a table's lock (while streaming)."""
    warnings = []
    for root in (t for t in tables if t.partitioned):
        with conn.cursor() as cur:
            cur.execute("BEGIN")
            try:
                added = _guard_root(cur, root, lock_timeout_ms)
                cur.execute("COMMIT")
            except psycopg2.Error as exc:
                cur.execute("ROLLBACK")
                said = exc.diag.message_primary or str(exc).strip()
                warnings.append(
                    f"cannot guard the partitions of {root.qualified_name} against TRUNCATE ({said}): a "
                    "TRUNCATE of one of its partitions would not reach its topic; let the worker's role "
                    "own them (or GRANT TRIGGER on them and CREATE on the schema), or use DELETE"
                )
                continue
        if added:
            log.info(
                "guarded %d partition(s) of %s against an uncaptured TRUNCATE", added, root.qualified_name
            )
    return warnings


# While streaming, a CREATE TRIGGER must not wait behind an application's long transaction on the
# leaf: the stream would stall with it. The next Relation message of the leaf tries again.
STREAM_LOCK_TIMEOUT_MS = 200
_UNGUARDED_ROOT = """
SELECT pg_partition_root(c.oid)::oid::bigint FROM pg_class c
 WHERE c.oid = %s AND NOT pg_is_in_recovery()
   AND NOT EXISTS (SELECT 1 FROM pg_trigger t WHERE t.tgrelid = c.oid AND t.tgname = %s)
"""


def guard_leaf(conn: psycopg2.extensions.connection, leaf_oid: int) -> list[str]:
    """Guard a leaf seen while streaming (Postgres describes a leaf beside its root when one of its
    changes is decoded): a partition created or attached after the start is guarded once it holds a
    row, before that row's transaction is acknowledged. Nothing when it is guarded already, or on a
    standby (where nothing can be written: its guards are the primary's)."""
    with conn.cursor() as cur:
        cur.execute(_UNGUARDED_ROOT, (leaf_oid, LEAF_TRIGGER))
        row = cur.fetchone()
    if row is None or row[0] is None:
        return []
    return install(conn, load_tables(conn, oids=[int(row[0])]), lock_timeout_ms=STREAM_LOCK_TIMEOUT_MS)
