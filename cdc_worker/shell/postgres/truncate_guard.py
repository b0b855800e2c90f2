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
since: when the first change of it is decoded (`guard_leaf`), and by a look at the captured roots'
partitions every few seconds (`guard_new_leaves`: pgoutput sends nothing at an ATTACH). A root that
cannot be guarded is named in a warning, with what to do.

A leaf's guard is also the database's record that the leaf has been seen under its root, which is
what makes an ATTACH of a table with rows safe across restarts: its rows were never in the WAL as
the root's. When the worker guards a leaf while streaming (or at the start of a resumed slot,
`announce`), it first looks for rows older than the leaf's place under the root (a row whose xmin
is not younger than the newest `pg_inherits` link on the leaf's path: the ATTACH, or the CREATE ...
PARTITION OF), rows no change of the root ever carried; if there are any, a re-snapshot request of
the leaf goes into the WAL in the same transaction as the trigger, so the guard and the request
exist together or not at all. The request is for every slot (`ANY_SLOT`): another worker capturing
the same root in its own slot sees the leaf guarded already, and reads the request in its own
stream. A partition created empty and then written to has no such rows, and costs no re-snapshot.
A leaf detached and attached again keeps its trigger, which then predates its new link: it counts
as unguarded, and is checked again. One case escapes the xmin test: rows inserted by a
subtransaction (a savepoint) of the very transaction that then attaches the table carry a younger
xid than the attachment's; attach a table with rows in a transaction of its own.

`bottledwater slot drop` removes the guards with the database's last slot (`uninstall`).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence

import psycopg2
import psycopg2.extensions
from psycopg2 import sql

from cdc_worker.core.incremental import ANY_SLOT, SIGNAL_PREFIX, request_content
from cdc_worker.shell.postgres.catalog import CatalogTable, load_tables
from cdc_worker.shell.postgres.partitions import Leaf

log = logging.getLogger(__name__)

FUNCTION_NAME = "bottledwater_truncate_guard"
LEAF_TRIGGER = "bottledwater_truncate_guard"
ROOT_BEFORE_TRIGGER = "bottledwater_truncate_root_begins"
ROOT_AFTER_TRIGGER = "bottledwater_truncate_root_ends"
SETTING = "bottledwater.truncating"

# TG_ARGV[0]: 'root' on the root's two triggers, 'leaf' on each leaf's. SECURITY DEFINER: the rows
# are deleted with the rights of the role that owns the guard (the tables' owner), whoever truncates.
# A leaf detached since keeps its trigger, which then lets its TRUNCATE be (it is no root's now).
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
  ELSIF (SELECT c.relispartition FROM pg_class c WHERE c.oid = TG_RELID)
        AND NOT (pg_partition_root(TG_RELID)::oid::text = ANY (roots)) THEN
    EXECUTE format('DELETE FROM ONLY %I.%I', TG_TABLE_SCHEMA, TG_TABLE_NAME);
  END IF;
  RETURN NULL;
END
"""

_ROOT_TRIGGERS = "SELECT tgname::text FROM pg_trigger WHERE tgrelid = %s AND tgname = ANY (%s)"
# The newest link of a leaf's path under its root (age: 0 for the current transaction, growing).
_LINK_AGE = sql.SQL(
    "(SELECT min(age(i.xmin)) FROM pg_inherits i JOIN pg_partition_ancestors({}) a ON a.relid = i.inhrelid)"
)
# Whether the leaf has a current guard: a trigger younger than its newest link.
_GUARD_CURRENT = sql.SQL(
    "EXISTS (SELECT 1 FROM pg_trigger t WHERE t.tgrelid = {leaf} AND t.tgname = %s AND age(t.xmin) <= {link})"
)
_LEAF_OID = sql.SQL("l.oid")
# The leaves (of those given) whose guard is current.
_GUARDED = sql.SQL("SELECT l.oid::bigint FROM unnest(%s::oid[]) AS l(oid) WHERE {}").format(
    _GUARD_CURRENT.format(leaf=_LEAF_OID, link=_LINK_AGE.format(_LEAF_OID))
)
# Rows of the leaf no change of the root carried: inserted before (or in) the transaction that put
# the leaf under the root, and not changed since (a change since was decoded as the root's).
_UNSTREAMED_ROWS = sql.SQL("SELECT EXISTS (SELECT 1 FROM ONLY {leaf} WHERE age(xmin) >= {link})")
_EMIT = "SELECT pg_logical_emit_message(true, %s, %s)"


def _create_trigger(
    name: str, when: str, table: sql.Composable, function: sql.Composable, kind: str
) -> sql.Composed:
    return sql.SQL("CREATE TRIGGER {} {} TRUNCATE ON {} FOR EACH STATEMENT EXECUTE FUNCTION {}({})").format(
        sql.Identifier(name), sql.SQL(when), table, function, sql.Literal(kind)
    )


def _guard_root(
    cur: psycopg2.extensions.cursor, root: CatalogTable, lock_timeout_ms: int | None, announce: bool
) -> tuple[int, list[str]]:
    """Install the function and the missing triggers of one root, in the caller's transaction;
    returns how many leaf guards were added and the leaves whose rows were asked for again (when
    `announce`). Two workers starting together take turns (a lock)."""
    if lock_timeout_ms is not None:
        cur.execute("SET LOCAL lock_timeout = %s", (f"{lock_timeout_ms}ms",))
    cur.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (SETTING,))
    schema = root.schema
    cur.execute(_ROOT_TRIGGERS, (schema.oid, [ROOT_BEFORE_TRIGGER, ROOT_AFTER_TRIGGER]))
    root_triggers = {str(name) for (name,) in cur.fetchall()}
    cur.execute(_GUARDED, ([leaf.oid for leaf in root.leaves], LEAF_TRIGGER))
    guarded = {int(oid) for (oid,) in cur.fetchall()}
    new = [leaf for leaf in root.leaves if leaf.oid not in guarded]
    # The rows are looked for before any trigger is made: a CREATE TRIGGER blocks the table's
    # writers until the commit, and a look may read a whole leaf (one filled since it was created).
    unstreamed = [leaf for leaf in new if announce and _holds_unstreamed_rows(cur, leaf)]
    function = sql.Identifier(schema.namespace, FUNCTION_NAME)
    cur.execute(
        sql.SQL(
            "CREATE OR REPLACE FUNCTION {}() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER "
            "SET search_path = pg_catalog AS {}"
        ).format(function, sql.Literal(FUNCTION_BODY))
    )
    relation = sql.Identifier(schema.namespace, schema.name)
    for name, when in ((ROOT_BEFORE_TRIGGER, "BEFORE"), (ROOT_AFTER_TRIGGER, "AFTER")):
        if name not in root_triggers:
            cur.execute(_create_trigger(name, when, relation, function, "root"))
    for leaf in new:
        leaf_relation = sql.Identifier(leaf.namespace, leaf.name)
        # A trigger older than the leaf's link (detached and attached again) is made anew, so that
        # it is younger than the link and records the leaf as seen.
        cur.execute(
            sql.SQL("DROP TRIGGER IF EXISTS {} ON {}").format(sql.Identifier(LEAF_TRIGGER), leaf_relation)
        )
        cur.execute(_create_trigger(LEAF_TRIGGER, "BEFORE", leaf_relation, function, "leaf"))
    if unstreamed:
        request_id = uuid.uuid4().hex
        tables = [(leaf.namespace, leaf.name) for leaf in unstreamed]
        cur.execute(_EMIT, (SIGNAL_PREFIX, request_content(ANY_SLOT, request_id, tables).decode()))
    return len(new), [leaf.qualified_name for leaf in unstreamed]


def _holds_unstreamed_rows(cur: psycopg2.extensions.cursor, leaf: Leaf) -> bool:
    """Whether the leaf holds a row no change of its root carried (see `_UNSTREAMED_ROWS`)."""
    link = _LINK_AGE.format(sql.SQL("%s::oid::regclass"))
    cur.execute(
        _UNSTREAMED_ROWS.format(leaf=sql.Identifier(leaf.namespace, leaf.name), link=link), (leaf.oid,)
    )
    row = cur.fetchone()
    return bool(row and row[0])


def install(
    conn: psycopg2.extensions.connection,
    tables: Sequence[CatalogTable],
    *,
    lock_timeout_ms: int | None = None,
    announce: bool = False,
) -> list[str]:
    """Guard the leaves of every partitioned table in `tables` (each root in its own transaction);
    returns one warning line per root that could not be guarded, naming what to do.
    `lock_timeout_ms`: give up rather than wait longer for a table's lock (while streaming).
    `announce`: the slot streams already (no snapshot to come will read the new leaves), so a new
    leaf's rows that never came through the WAL are asked for with a re-snapshot."""
    warnings = []
    for root in (t for t in tables if t.partitioned):
        with conn.cursor() as cur:
            cur.execute("BEGIN")
            try:
                added, asked = _guard_root(cur, root, lock_timeout_ms, announce)
                cur.execute("COMMIT")
            except psycopg2.Error as exc:
                cur.execute("ROLLBACK")
                said = exc.diag.message_primary or str(exc).strip()
                warnings.append(
                    f"cannot guard the partitions of {root.qualified_name} against TRUNCATE ({said}): a "
                    "TRUNCATE of one of its partitions would not reach its topic, nor the rows of one "
                    "attached with rows; let the worker's role own them (or GRANT TRIGGER on them and "
                    "CREATE on the schema), or use DELETE and `bottledwater resnapshot <partition>`"
                )
                continue
        if added:
            log.info(
                "guarded %d partition(s) of %s against an uncaptured TRUNCATE", added, root.qualified_name
            )
        if asked:
            log.info(
                "partition(s) %s of %s hold rows that never came through the WAL (attached with "
                "them): asked for a re-snapshot of them",
                ", ".join(asked),
                root.qualified_name,
            )
    return warnings


# While streaming, a CREATE TRIGGER must not wait behind an application's long transaction on the
# leaf: the stream would stall with it. The next look (a Relation message, the next round of
# `guard_new_leaves`) tries again.
STREAM_LOCK_TIMEOUT_MS = 200
_C_OID = sql.SQL("c.oid")
_UNGUARDED = sql.SQL("NOT {}").format(_GUARD_CURRENT.format(leaf=_C_OID, link=_LINK_AGE.format(_C_OID)))
_UNGUARDED_ROOT = sql.SQL(
    "SELECT pg_partition_root(c.oid)::oid::bigint FROM pg_class c"
    " WHERE c.oid = %s AND c.relispartition AND NOT pg_is_in_recovery() AND {}"
).format(_UNGUARDED)
# The roots the publications publish as one table with a leaf not guarded (or guarded before its
# latest ATTACH).
_ROOTS_WITH_UNGUARDED = sql.SQL("""
SELECT DISTINCT r.oid::bigint
  FROM pg_publication p
  JOIN pg_publication_tables pt ON pt.pubname = p.pubname
  JOIN pg_namespace n ON n.nspname = pt.schemaname
  JOIN pg_class r ON r.relnamespace = n.oid AND r.relname = pt.tablename AND r.relkind = 'p'
 CROSS JOIN LATERAL pg_partition_tree(r.oid) AS tree
  JOIN pg_class c ON c.oid = tree.relid AND c.relkind = 'r'
 WHERE p.pubname = ANY (%s) AND p.pubviaroot AND tree.isleaf AND NOT pg_is_in_recovery() AND {}
""").format(_UNGUARDED)


def guard_leaf(conn: psycopg2.extensions.connection, leaf_oid: int, *, announce: bool = True) -> list[str]:
    """Guard a leaf seen while streaming (Postgres describes a leaf beside its root when one of its
    changes is decoded), before that change is acknowledged, and ask for its rows if it was attached
    with rows. Nothing when it is guarded already, or on a standby (where nothing can be written:
    its guards are the primary's)."""
    with conn.cursor() as cur:
        cur.execute(_UNGUARDED_ROOT, (leaf_oid, LEAF_TRIGGER))
        row = cur.fetchone()
    if row is None or row[0] is None:
        return []
    return _install_roots(conn, [int(row[0])], announce)


def guard_new_leaves(
    conn: psycopg2.extensions.connection,
    publications: Sequence[str],
    *,
    skip: frozenset[int] = frozenset(),
    announce: bool = True,
) -> dict[int, list[str]]:
    """Guard the leaves of the published roots that are not (a partition created or attached while
    streaming, before any change of it is decoded): pgoutput says nothing of an ATTACH, so without
    this look an attached partition that nobody writes to would keep its rows out of the topic.
    Returns the warnings per root OID; the roots in `skip` are left alone. `announce`: as for
    `install` (False where the server cannot send the request back: before Postgres 14)."""
    with conn.cursor() as cur:
        cur.execute(_ROOTS_WITH_UNGUARDED, (list(publications), LEAF_TRIGGER))
        roots = [int(oid) for (oid,) in cur.fetchall() if int(oid) not in skip]
    return {oid: _install_roots(conn, [oid], announce) for oid in roots}


def _install_roots(conn: psycopg2.extensions.connection, oids: list[int], announce: bool) -> list[str]:
    tables = load_tables(conn, oids=oids)
    return install(conn, tables, lock_timeout_ms=STREAM_LOCK_TIMEOUT_MS, announce=announce)


_GUARD_FUNCTIONS = """
SELECT n.nspname::text FROM pg_proc f JOIN pg_namespace n ON n.oid = f.pronamespace
 WHERE f.proname = %s AND f.pronargs = 0 AND f.prorettype = 'trigger'::regtype
"""


def is_present(conn: psycopg2.extensions.connection) -> bool:
    """Whether a guard function exists in some schema of the database."""
    with conn.cursor() as cur:
        cur.execute(_GUARD_FUNCTIONS, (FUNCTION_NAME,))
        return cur.fetchone() is not None


def uninstall(conn: psycopg2.extensions.connection) -> int:
    """Drop the guard function of every schema, and with it (CASCADE) every trigger calling it, in
    one transaction; returns how many functions were dropped. Raises psycopg2's error (a role that
    does not own them) after rolling back."""
    with conn.cursor() as cur:
        cur.execute(_GUARD_FUNCTIONS, (FUNCTION_NAME,))
        schemas = [str(name) for (name,) in cur.fetchall()]
        cur.execute("BEGIN")
        try:
            for schema in schemas:
                cur.execute(
                    sql.SQL("DROP FUNCTION {}() CASCADE").format(sql.Identifier(schema, FUNCTION_NAME))
                )
            cur.execute("COMMIT")
        except psycopg2.Error:
            cur.execute("ROLLBACK")
            raise
    return len(schemas)
