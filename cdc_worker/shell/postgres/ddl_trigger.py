"""The `--capture-ddl` event trigger: install it (idempotently), check it, remove it.

Two event triggers (`bottledwater_ddl_end` on `ddl_command_end`, `bottledwater_ddl_drop` on
`sql_drop`) call `public.bottledwater_ddl()`, which writes one transactional logical message
(`pg_logical_emit_message(true, 'bottledwater.ddl', json)`) per table a command created, altered or
dropped: command tag, object type and identity, schema, table, OID, the statement text and the
table's columns after the command (`core.ddl.parse_ddl` reads it). Temporary and unlogged tables are
left out (logical decoding does not carry their rows either).

Event triggers are per database and only a superuser (`rds_superuser` on RDS and Aurora) may create
them. The function is `SECURITY DEFINER`, so roles that run DDL need no right to emit logical
messages; it does nothing unless `wal_level` is `logical`, so it can never make a DDL fail because
of the setting. Every worker of the database shares the one trigger: `bottledwater ddl uninstall`
and `bottledwater slot drop` (when no other slot of the database remains) remove it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import psycopg2.extensions
from psycopg2 import sql

FUNCTION_SCHEMA = "public"
FUNCTION_NAME = "bottledwater_ddl"
END_TRIGGER = "bottledwater_ddl_end"
DROP_TRIGGER = "bottledwater_ddl_drop"
MINIMUM_VERSION_NUM = 140000  # pgoutput's `messages` option carries the trigger's messages

# The function's body: compared with pg_proc.prosrc to tell an installed trigger is the current one.
# Its prefix and format version are `core.ddl`'s DDL_PREFIX and DDL_FORMAT_VERSION (a test holds them).
FUNCTION_BODY = """
DECLARE
  dropped record;
  command record;
  target record;
  columns jsonb;
BEGIN
  IF current_setting('wal_level') <> 'logical' THEN
    RETURN;
  END IF;
  IF TG_EVENT = 'sql_drop' THEN
    FOR dropped IN
      SELECT * FROM pg_event_trigger_dropped_objects()
       WHERE object_type = 'table' AND NOT is_temporary
    LOOP
      PERFORM pg_logical_emit_message(true, 'bottledwater.ddl', jsonb_build_object(
        'version', 1, 'event', TG_EVENT, 'command_tag', TG_TAG,
        'object_type', dropped.object_type, 'object_identity', dropped.object_identity,
        'schema', dropped.schema_name, 'table', dropped.object_name,
        'table_oid', dropped.objid::bigint,
        'statement', current_query(), 'columns', '[]'::jsonb)::text);
    END LOOP;
    RETURN;
  END IF;
  FOR command IN
    SELECT * FROM pg_event_trigger_ddl_commands()
     WHERE classid = 'pg_class'::regclass AND object_type IN ('table', 'table column')
  LOOP
    SELECT c.oid, c.relname, n.nspname INTO target
      FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
     WHERE c.oid = command.objid AND c.relkind IN ('r', 'p') AND c.relpersistence = 'p';
    IF NOT FOUND THEN
      CONTINUE;
    END IF;
    SELECT coalesce(jsonb_agg(jsonb_build_object(
             'name', a.attname, 'type', format_type(a.atttypid, a.atttypmod),
             'base_type', e.typname,
             'typmod', CASE WHEN t.typtype = 'd' THEN t.typtypmod ELSE a.atttypmod END,
             'array', b.typcategory = 'A' AND b.typelem <> 0, 'not_null', a.attnotnull)
             ORDER BY a.attnum), '[]'::jsonb)
      INTO columns
      FROM pg_attribute a
      JOIN pg_type t ON t.oid = a.atttypid
      JOIN pg_type b ON b.oid = CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE t.oid END
      JOIN pg_type e ON e.oid = CASE WHEN b.typcategory = 'A' AND b.typelem <> 0 THEN b.typelem
                                     ELSE b.oid END
     WHERE a.attrelid = target.oid AND a.attnum > 0 AND NOT a.attisdropped;
    PERFORM pg_logical_emit_message(true, 'bottledwater.ddl', jsonb_build_object(
      'version', 1, 'event', TG_EVENT, 'command_tag', command.command_tag,
      'object_type', command.object_type, 'object_identity', command.object_identity,
      'schema', target.nspname, 'table', target.relname, 'table_oid', target.oid::bigint,
      'statement', current_query(), 'columns', columns)::text);
  END LOOP;
END
"""

_FUNCTION = sql.Identifier(FUNCTION_SCHEMA, FUNCTION_NAME)
_CREATE_FUNCTION = sql.SQL(
    "CREATE OR REPLACE FUNCTION {}() RETURNS event_trigger LANGUAGE plpgsql SECURITY DEFINER "
    "SET search_path = pg_catalog AS {}"
).format(_FUNCTION, sql.Literal(FUNCTION_BODY))
_CREATE_TRIGGER = "CREATE EVENT TRIGGER {} ON {} EXECUTE FUNCTION {}()"

_STATE_SQL = """
SELECT (SELECT p.prosrc FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
         WHERE n.nspname = %(schema)s AND p.proname = %(function)s AND p.pronargs = 0),
       (SELECT count(*) FROM pg_event_trigger
         WHERE evtname IN (%(end)s, %(drop)s) AND evtenabled <> 'D')::int,
       (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)
       OR EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'rds_superuser'
                   AND pg_has_role(current_user, oid, 'MEMBER')),
       current_user::text, current_database()::text
"""
_NAMES = {"schema": FUNCTION_SCHEMA, "function": FUNCTION_NAME, "end": END_TRIGGER, "drop": DROP_TRIGGER}


@contextmanager
def _transaction(conn: psycopg2.extensions.connection) -> Iterator[psycopg2.extensions.cursor]:
    """One transaction on a connection that is otherwise in autocommit (the worker's are)."""
    autocommit = conn.autocommit
    conn.autocommit = False
    try:
        with conn, conn.cursor() as cur:
            yield cur
    finally:
        conn.autocommit = autocommit


def _state(conn: psycopg2.extensions.connection) -> tuple[bool, bool, str, str]:
    """(installed and current, may install, role, database)."""
    with conn.cursor() as cur:
        cur.execute(_STATE_SQL, _NAMES)
        row = cur.fetchone()
    assert row is not None
    body, triggers, privileged, role, database = row
    return body == FUNCTION_BODY and triggers == 2, bool(privileged), role, database


def is_installed(conn: psycopg2.extensions.connection) -> bool:
    """Whether the current trigger function and both enabled event triggers are in this database."""
    return _state(conn)[0]


def check_capture(conn: psycopg2.extensions.connection, server_version_num: int) -> list[str]:
    """Startup check for `--capture-ddl`: one line per problem, each naming its fix."""
    if server_version_num < MINIMUM_VERSION_NUM:
        return [
            "--capture-ddl needs Postgres 14 or later (pgoutput's messages option carries the DDL "
            "events): upgrade the server, or run without --capture-ddl"
        ]
    installed, privileged, role, database = _state(conn)
    if installed or privileged:
        return []
    return [
        f"--capture-ddl: role {role} cannot create the event trigger in database {database} (that "
        "needs a superuser, or rds_superuser on RDS/Aurora): run `bottledwater -d <DSN of a superuser> "
        "ddl install` once, or ALTER ROLE "
        f"{role} SUPERUSER, or run without --capture-ddl"
    ]


def install(conn: psycopg2.extensions.connection) -> bool:
    """Create or update the function and create the missing event triggers, in one transaction;
    False (nothing done) when the current version is installed already."""
    if is_installed(conn):
        return False
    with _transaction(conn) as cur:
        # Serialises two workers installing at once (CREATE EVENT TRIGGER has no IF NOT EXISTS).
        cur.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (FUNCTION_NAME,))
        cur.execute(_CREATE_FUNCTION)
        cur.execute(
            "SELECT evtname FROM pg_event_trigger WHERE evtname IN (%s, %s)", (END_TRIGGER, DROP_TRIGGER)
        )
        present = {row[0] for row in cur.fetchall()}
        for name, event in ((END_TRIGGER, "ddl_command_end"), (DROP_TRIGGER, "sql_drop")):
            if name in present:
                cur.execute(sql.SQL("ALTER EVENT TRIGGER {} ENABLE").format(sql.Identifier(name)))
            else:
                cur.execute(
                    sql.SQL(_CREATE_TRIGGER).format(sql.Identifier(name), sql.Identifier(event), _FUNCTION)
                )
    return True


def uninstall(conn: psycopg2.extensions.connection) -> bool:
    """Drop both event triggers and the function; False when none of them was there."""
    with _transaction(conn) as cur:
        cur.execute(
            "SELECT count(*) FROM pg_event_trigger WHERE evtname IN (%s, %s)", (END_TRIGGER, DROP_TRIGGER)
        )
        row = cur.fetchone()
        cur.execute(
            "SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
            "WHERE n.nspname = %s AND p.proname = %s",
            (FUNCTION_SCHEMA, FUNCTION_NAME),
        )
        function = cur.fetchone()
        for name in (END_TRIGGER, DROP_TRIGGER):
            cur.execute(sql.SQL("DROP EVENT TRIGGER IF EXISTS {}").format(sql.Identifier(name)))
        cur.execute(sql.SQL("DROP FUNCTION IF EXISTS {}()").format(_FUNCTION))
    return bool((row and row[0]) or (function and function[0]))


def is_present(conn: psycopg2.extensions.connection) -> bool:
    """Whether any part of the trigger (either event trigger, the function) is in this database."""
    with conn.cursor() as cur:
        cur.execute(
            "SELECT EXISTS (SELECT 1 FROM pg_event_trigger WHERE evtname IN (%s, %s)) OR EXISTS ("
            "SELECT 1 FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
            "WHERE n.nspname = %s AND p.proname = %s)",
            (END_TRIGGER, DROP_TRIGGER, FUNCTION_SCHEMA, FUNCTION_NAME),
        )
        row = cur.fetchone()
    return bool(row and row[0])


def other_slots(conn: psycopg2.extensions.connection) -> int:
    """Replication slots of this database: the trigger stays while any worker may need it."""
    with conn.cursor() as cur:
        cur.execute("SELECT count(*)::int FROM pg_replication_slots WHERE database = current_database()")
        row = cur.fetchone()
    return int(row[0]) if row else 0
