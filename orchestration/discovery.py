"""Which tables the pipeline captures, read from the publication when the code location loads.

This is the code location's one piece of I/O at load time, and it is documented as such
(docs/orchestration.md): Dagster builds one Kafka topic asset and one Delta asset per captured table,
so it has to know the tables. It fails soft: when Postgres cannot be reached, or the publication
does not exist yet (before the first `replication_slot` materialization), the code location still
loads, with the slot and snapshot assets only and a warning saying what to do; reloading the code
location after the slot is created brings the per-table assets in.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import psycopg2

from cdc_worker.core.model import TableSchema
from cdc_worker.shell.postgres import catalog as pg
from cdc_worker.shell.postgres.slot import INSERTS_SUFFIX
from kafka_contract.topics import NamingError, safe_name, topic_name
from shared_connections.libpq_tls import tls_hint

log = logging.getLogger(__name__)

# An unreachable host must not hold up the UI for libpq's default (forever).
DISCOVERY_CONNECT_TIMEOUT_S = 5

_PUBLICATION_EXISTS_SQL = "SELECT 1 FROM pg_publication WHERE pubname = %s"
# The worker keeps tables without a replica identity in a companion publication, `<name>_inserts`.
# pg_publication_tables also expands FOR ALL TABLES and FOR TABLES IN SCHEMA publications.
_PUBLICATION_OIDS_SQL = """
SELECT DISTINCT c.oid
  FROM pg_publication_tables t
  JOIN pg_namespace n ON n.nspname = t.schemaname
  JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = t.tablename
 WHERE t.pubname = ANY (%s)
"""


@dataclass(frozen=True)
class CapturedTable:
    """One table of the publication, with what its assets and checks need."""

    schema: str
    name: str
    key_columns: tuple[str, ...]
    columns: tuple[str, ...]
    topic: str

    @property
    def qualified_name(self) -> str:
        return f"{self.schema}.{self.name}"

    @property
    def asset_name(self) -> str:
        """Safe for Dagster names: `inventory__products`, `public__orders`."""
        return f"{safe_name(self.schema)}__{safe_name(self.name)}"


@dataclass(frozen=True)
class Discovery:
    tables: tuple[CapturedTable, ...]
    problem: str | None = None  # why there are no tables, in a sentence that says what to do


def _connect_dsn(dsn: str) -> str:
    params = psycopg2.extensions.parse_dsn(dsn)
    if "connect_timeout" in params:
        return dsn
    return str(psycopg2.extensions.make_dsn(dsn, connect_timeout=DISCOVERY_CONNECT_TIMEOUT_S))


def discover_tables(dsn: str, publication: str, topic_prefix: str | None) -> Discovery:
    """The publication's tables; never raises for an unreachable database or a missing publication."""
    try:
        conn = pg.connect(_connect_dsn(dsn), application_name="bottledwater-dagster-discovery")
    except psycopg2.Error as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        reason += tls_hint(" ".join(str(exc).split()))  # a wrong CA or host name: what to fix
        return Discovery((), f"Postgres is not reachable ({reason}): no per-table assets until it is")
    try:
        with conn.cursor() as cur:
            cur.execute(_PUBLICATION_EXISTS_SQL, (publication,))
            if cur.fetchone() is None:
                return Discovery(
                    (),
                    f"publication {publication!r} does not exist yet: materialize replication_slot "
                    "(or start the worker), then reload the code location",
                )
            cur.execute(_PUBLICATION_OIDS_SQL, ([publication, publication + INSERTS_SUFFIX],))
            oids = [row[0] for row in cur.fetchall()]
        if not oids:
            return Discovery((), f"publication {publication!r} has no tables")
        catalog = pg.load_tables(conn, oids=oids)
    except psycopg2.Error as exc:
        return Discovery((), f"could not read publication {publication!r}: {str(exc).strip()}")
    finally:
        conn.close()
    return Discovery(tuple(_captured(t.schema, topic_prefix) for t in catalog))


def _captured(schema: TableSchema, topic_prefix: str | None) -> CapturedTable:
    try:
        topic = topic_name(schema, topic_prefix)
    except NamingError as exc:
        # The worker refuses such a table too; showing it under its escaped name keeps it visible.
        log.warning("%s", exc)
        topic = safe_name(schema.name)
    return CapturedTable(
        schema=schema.namespace,
        name=schema.name,
        key_columns=tuple(schema.key_columns),
        columns=tuple(c.name for c in schema.columns),
        topic=topic,
    )


def tables_by_asset_name(tables: Sequence[CapturedTable]) -> dict[str, CapturedTable]:
    return {t.asset_name: t for t in tables}
