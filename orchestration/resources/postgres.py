"""The source database: where the slot, the publication and the captured tables live."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import dagster as dg
import psycopg2.extensions
from pydantic import Field

from cdc_worker.shell.postgres import catalog as pg
from orchestration.policy.slot_health import SlotObservation
from spark_jobs.connections.postgres_connect import PostgresUnreachable, failure_line

# What a user sets to fix a refused connection (a wrong CA or host name, a password).
DSN_SETTING = "the postgres resource's dsn (BOTTLEDWATER_POSTGRES)"

# One row per slot; LSNs as integers so that the checks can do arithmetic without parsing. A lost
# slot has no restart_lsn: its retained WAL is NULL (unknown), not 0 (SlotObservation.lag_bytes says
# how far behind it is).
_SLOT_SQL = """
SELECT s.slot_name::text,
       s.database::text,
       s.active,
       s.wal_status,
       (s.confirmed_flush_lsn - '0/0'::pg_lsn)::bigint,
       (s.restart_lsn - '0/0'::pg_lsn)::bigint,
       (pg_current_wal_lsn() - '0/0'::pg_lsn)::bigint,
       pg_wal_lsn_diff(pg_current_wal_lsn(), s.restart_lsn)::bigint
  FROM pg_replication_slots s
 WHERE s.slot_name = %s
"""


class PostgresResource(dg.ConfigurableResource):
    """The database the worker captures, and the slot and publication it owns there.

    `dsn` usually holds a password: configure it with `EnvVar("BOTTLEDWATER_POSTGRES")` so that the
    UI shows the variable's name, not its value.
    """

    dsn: str = Field(description="libpq connection string or URL of the captured database (secret).")
    slot: str = Field(default="bottledwater", description="Logical replication slot of the worker.")
    publication: str | None = Field(
        default=None, description="Publication of the captured tables; default: the slot's name."
    )
    tables: list[str] = Field(
        default_factory=list, description="schema.table globs the worker captures; empty: all tables."
    )

    @property
    def publication_name(self) -> str:
        return self.publication or self.slot

    @contextmanager
    def connect(self) -> Iterator[psycopg2.extensions.connection]:
        """An autocommit connection with the worker's session settings; closed on exit."""
        try:
            conn = pg.connect(self.dsn, application_name="bottledwater-dagster")
        except psycopg2.OperationalError as exc:  # still one: the sensors report it as unreachable
            raise PostgresUnreachable(failure_line(exc, DSN_SETTING)) from None
        try:
            yield conn
        finally:
            conn.close()

    def location(self) -> str:
        """host:port/dbname without credentials: safe to put in alerts and metadata."""
        params = psycopg2.extensions.parse_dsn(self.dsn)
        host = params.get("host", "localhost")
        port = params.get("port", "5432")
        return f"{host}:{port}/{params.get('dbname', params.get('user', ''))}"

    def observe_slot(self) -> SlotObservation | None:
        """The slot as pg_replication_slots shows it now; None when it does not exist."""
        with self.connect() as conn, conn.cursor() as cur:
            cur.execute(_SLOT_SQL, (self.slot,))
            row = cur.fetchone()
        if row is None:
            return None
        name, database, active, wal_status, confirmed, restart, current, retained = row
        return SlotObservation(
            slot_name=name,
            database=database,
            active=bool(active),
            wal_status=wal_status,
            confirmed_flush_lsn=confirmed,
            restart_lsn=restart,
            current_wal_lsn=current,
            retained_wal_bytes=None if retained is None else max(0, int(retained)),
            observed_at=time.time(),
        )
