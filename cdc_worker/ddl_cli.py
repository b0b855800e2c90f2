"""`bottledwater ddl install|uninstall`, and the trigger's removal by `bottledwater slot drop`.

`install` lets a superuser (or `rds_superuser`) put the `--capture-ddl` event trigger in place once,
so that the worker itself can run under a role without that privilege; `uninstall` removes it from
the database. `slot drop` removes it too when the dropped slot was the database's last one, since
no worker is left to read its messages (they would only add to the WAL).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

import psycopg2
import psycopg2.extensions

from cdc_worker.config import WorkerConfig
from cdc_worker.shell.postgres import catalog as postgres
from cdc_worker.shell.postgres import ddl_trigger

EXIT_OK = 0
EXIT_RUNTIME_ERROR = 1
EXIT_STARTUP_ERROR = 2
COMMAND = "ddl"
ACTIONS = ("install", "uninstall")


def add_parser(
    commands: argparse._SubParsersAction,  # type: ignore[type-arg]
    add_options: Callable[[argparse.ArgumentParser], None],
) -> None:
    parser = commands.add_parser(
        COMMAND,
        help="Install or remove the --capture-ddl event trigger in the database (needs a superuser, "
        "or rds_superuser).",
    )
    add_options(parser)
    parser.add_argument(
        "action",
        choices=ACTIONS,
        help="install: create or update it (idempotent); uninstall: drop it and its function",
    )


def run(config: WorkerConfig, action: str) -> int:
    conn = postgres.connect(config.postgres)
    try:
        database = conn.info.dbname
        if action == "install":
            problems = ddl_trigger.check_capture(conn, conn.server_version)
            if problems:
                print(f"cannot install: {problems[0]}", file=sys.stderr)
                return EXIT_STARTUP_ERROR
            changed = ddl_trigger.install(conn)
            print(
                f"installed the DDL event trigger in database {database}"
                if changed
                else f"the DDL event trigger is already installed in database {database}"
            )
            return EXIT_OK
        removed = ddl_trigger.uninstall(conn)
    except psycopg2.errors.InsufficientPrivilege as exc:
        print(
            f"cannot {action} the DDL event trigger: {str(exc).strip().splitlines()[0]}: run this as a "
            "superuser (or rds_superuser)",
            file=sys.stderr,
        )
        return EXIT_STARTUP_ERROR
    finally:
        conn.close()
    print(
        f"removed the DDL event trigger from database {database}"
        if removed
        else f"no DDL event trigger in database {database}; nothing removed"
    )
    return EXIT_OK


def after_slot_drop(conn: psycopg2.extensions.connection) -> None:
    """Remove the trigger when no slot of the database remains to read its messages."""
    if not ddl_trigger.is_present(conn):
        return
    remaining = ddl_trigger.other_slots(conn)
    if remaining:
        print(f"the DDL event trigger is kept: {remaining} other slot(s) of this database may need it")
        return
    try:
        ddl_trigger.uninstall(conn)
    except psycopg2.errors.InsufficientPrivilege:
        print(
            "the DDL event trigger is left in place (this role may not drop it): run "
            "`bottledwater ddl uninstall` as a superuser"
        )
        return
    print("removed the DDL event trigger (--capture-ddl): no slot of this database is left")
