"""Everything the worker asks Postgres over ordinary SQL connections: connecting with canonical
session settings, the catalog (tables, keys, types), and the startup checks.

Canonical text output matters because pgoutput and COPY both send each value as its type's text
output, which depends on session settings; the converters (`pgtext`) parse one fixed form. The
settings travel in the startup packet (`options=-c ...`), so they also hold for the walsender of a
replication connection, where pgoutput runs the output functions.
"""

from __future__ import annotations

import fnmatch
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg2
import psycopg2.extensions
import psycopg2.extras

from cdc_worker.core.errors import ConfigurationError, InfrastructureError
from cdc_worker.core.model import Column, ReplicaIdentity, TableSchema
from cdc_worker.shell.postgres.partitions import Leaf, PartitionMode, candidate, estimated_rows, load_leaves
from shared_connections.libpq_tls import tls_hint

log = logging.getLogger(__name__)

APPLICATION_NAME = "bottledwater"
DEFAULT_CONNECT_TIMEOUT_S = "10"
# The text forms `pgtext` parses; see its module docstring.
SESSION_SETTINGS = (
    ("TimeZone", "UTC"),
    ("DateStyle", "ISO"),
    ("IntervalStyle", "postgres"),
    ("extra_float_digits", "3"),
    ("bytea_output", "hex"),
    ("lc_monetary", "C"),
)
REQUIRED_ENCODING = "UTF8"
SYSTEM_SCHEMAS = ("pg_catalog", "information_schema")
EXIT_CONFIG_ERROR = 2


class StartupCheckFailed(ConfigurationError, RuntimeError):
    """One or more problems found before anything was created; each line names its fix."""

    def __init__(self, problems: Sequence[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = list(problems)


class PostgresConnectionLost(InfrastructureError, RuntimeError):
    """The connection to Postgres broke (a restart, a terminated backend, a network failure)."""

    @classmethod
    def from_error(cls, error: psycopg2.Error) -> PostgresConnectionLost:
        said = " ".join(str(error).split())
        return cls(f"Postgres connection failed: {said}{tls_hint(said)}")


def connection_lost(error: psycopg2.Error) -> bool:
    """Whether `error` means the connection is gone rather than a statement failed: libpq's own
    connection errors (OperationalError, InterfaceError), and errors with no SQLSTATE, which the
    server never sent (libpq lost its protocol state: `no COPY in progress` once a restarting
    server has ended the replication stream)."""
    if isinstance(error, psycopg2.OperationalError | psycopg2.InterfaceError):
        return True
    return type(error) is psycopg2.DatabaseError and error.pgcode is None


def session_options(dsn: str) -> str:
    """The DSN's own `options` followed by ours (later `-c` settings win in Postgres)."""
    own = psycopg2.extensions.parse_dsn(dsn).get("options", "")
    ours = " ".join(f"-c {name}={value}" for name, value in SESSION_SETTINGS)
    return f"{own} {ours}".strip()


def connect(
    dsn: str, *, replication: bool = False, application_name: str = APPLICATION_NAME
) -> psycopg2.extensions.connection:
    """A connection with the canonical session settings; logical replication if `replication`."""
    params: dict[str, Any] = {"options": session_options(dsn)}
    parsed = psycopg2.extensions.parse_dsn(dsn)
    if "application_name" not in parsed:
        params["application_name"] = application_name
    if "connect_timeout" not in parsed:
        params["connect_timeout"] = DEFAULT_CONNECT_TIMEOUT_S
    if replication:  # always autocommit, as the replication protocol requires
        return psycopg2.connect(
            dsn, connection_factory=psycopg2.extras.LogicalReplicationConnection, **params
        )
    conn = psycopg2.connect(dsn, **params)
    conn.autocommit = True
    return conn


# -- catalog -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class CatalogTable:
    """A table as the catalog describes it now, with what the checks and the snapshot need."""

    schema: TableSchema
    has_primary_key: bool
    selectable: bool  # the role has SELECT on it
    owned: bool  # the role may add it to a publication
    pages: int  # heap size in blocks, for splitting the snapshot into ctid ranges
    estimated_rows: int  # pg_class.reltuples, for progress (-1 when never analyzed)
    # Stored generated columns among `schema.columns` (published on Postgres 18+): COPY refuses
    # them in its column list, so the snapshot reads such a table through a query.
    generated_columns: tuple[str, ...] = ()
    # A partitioned table captured as one (`PartitionMode.ROOT`): its leaves, at every level.
    leaves: tuple[Leaf, ...] = ()
    partitioned: bool = False
    is_partition: bool = False  # a leaf partition (captured as a table of its own in leaf mode)
    # What the publication publishes of it (`subsets`, Postgres 15+): its column list (None: every
    # column; `schema.columns` holds only the published ones) and its row filter (None: every row).
    column_list: tuple[str, ...] | None = None
    row_filter: str | None = None

    @property
    def qualified_name(self) -> str:
        return self.schema.qualified_name

    @property
    def has_replica_identity(self) -> bool:
        """Whether Postgres can log old rows for it; without one, a publication that publishes
        updates or deletes makes every UPDATE and DELETE of the table fail at the source."""
        identity = self.schema.replica_identity
        if identity is ReplicaIdentity.DEFAULT:
            return self.has_primary_key
        return identity is not ReplicaIdentity.NOTHING


_TABLES_SQL = """
SELECT c.oid, n.nspname, c.relname, c.relreplident,
       has_table_privilege(c.oid, 'SELECT'),
       pg_has_role(c.relowner, 'USAGE'),
       (pg_relation_size(c.oid) / current_setting('block_size')::int)::bigint,
       c.reltuples::bigint, c.relkind::text, c.relispartition,
       ARRAY(SELECT a.attname::text
               FROM pg_index i
               CROSS JOIN LATERAL unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, ord)
               JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
              WHERE i.indrelid = c.oid AND i.indisprimary AND k.ord <= i.indnkeyatts
              ORDER BY k.ord),
       ARRAY(SELECT a.attname::text
               FROM pg_index i
               CROSS JOIN LATERAL unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, ord)
               JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
              WHERE i.indrelid = c.oid AND i.indisreplident AND k.ord <= i.indnkeyatts
              ORDER BY k.ord)
  FROM pg_class c
  JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE c.relkind IN ('r', 'p') AND c.relpersistence = 'p'
   AND n.nspname <> ALL (%(system)s) AND n.nspname NOT LIKE 'pg\\_toast%%'
   AND (%(oids)s::oid[] IS NULL OR c.oid = ANY (%(oids)s::oid[]))
 ORDER BY n.nspname, c.relname
"""

# Generated columns are left out unless the publication publishes the stored ones (Postgres 18+,
# `publish_generated_columns = stored`): pgoutput sends exactly the columns the publication
# publishes, and the snapshot's schema must be the stream's. Virtual ones (18+) are never sent.
_COLUMNS_SQL = """
SELECT attrelid, attname::text, atttypid, atttypmod, attgenerated <> ''
  FROM pg_attribute
 WHERE attrelid = ANY (%s::oid[]) AND attnum > 0 AND NOT attisdropped
   AND (attgenerated = '' OR (%s AND attgenerated = 's'))
 ORDER BY attrelid, attnum
"""


def table_matches(schema: str, table: str, globs: Iterable[str]) -> bool:
    """Whether `schema.table` matches one of `globs` (a glob without a dot: the table name alone)."""
    qualified = f"{schema}.{table}"
    return any(fnmatch.fnmatchcase(qualified if "." in glob else table, glob) for glob in globs)


def _key_columns(
    identity: ReplicaIdentity, primary_key: list[str], identity_index: list[str]
) -> tuple[str, ...]:
    """The Kafka key (docs/worker.md, "Topics"): the replica identity index if one is set, else the
    primary key."""
    if identity is ReplicaIdentity.INDEX and identity_index:
        return tuple(identity_index)
    return tuple(primary_key)


def _identity_flags(identity: ReplicaIdentity, names: list[str], pk: list[str], ri: list[str]) -> list[bool]:
    """The per-column replica identity flags pgoutput's Relation message would carry."""
    if identity is ReplicaIdentity.FULL:
        return [True] * len(names)
    if identity is ReplicaIdentity.INDEX:
        return [n in ri for n in names]
    if identity is ReplicaIdentity.DEFAULT:
        return [n in pk for n in names]
    return [False] * len(names)


def load_tables(
    conn: psycopg2.extensions.connection,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    *,
    oids: Sequence[int] | None = None,
    generated: bool = False,
    partitions: PartitionMode = PartitionMode.ROOT,
) -> list[CatalogTable]:
    """The tables selected by the globs (all when `include` is empty), or exactly `oids`; with
    `generated`, their stored generated columns too (as a publication publishing them sends them).
    `partitions` says whether a partitioned table is one table (its leaves listed in it) or each
    leaf is a table; `oids` are taken whatever their kind."""
    with conn.cursor() as cur:
        cur.execute(_TABLES_SQL, {"system": list(SYSTEM_SCHEMAS), "oids": list(oids) if oids else None})
        rows = [
            r
            for r in cur.fetchall()
            if (oids or candidate(r[8], r[9], partitions))
            and (not include or table_matches(r[1], r[2], include))
            and not table_matches(r[1], r[2], exclude)
        ]
        leaves = load_leaves(cur, [r[0] for r in rows if r[8] == "p"])
        columns: dict[int, list[tuple[str, int, int]]] = {}
        generated_columns: dict[int, list[str]] = {}
        if rows:
            cur.execute(_COLUMNS_SQL, ([r[0] for r in rows], generated))
            for relid, name, type_oid, typmod, is_generated in cur.fetchall():
                columns.setdefault(relid, []).append((name, type_oid, typmod))
                if is_generated:
                    generated_columns.setdefault(relid, []).append(name)
    tables = []
    for (
        oid,
        namespace,
        name,
        replident,
        selectable,
        owned,
        pages,
        reltuples,
        kind,
        is_partition,
        pk,
        ri,
    ) in rows:
        identity = ReplicaIdentity(replident)
        cols = columns.get(oid, [])
        names = [c[0] for c in cols]
        flags = _identity_flags(identity, names, pk, ri)
        schema = TableSchema(
            oid=oid,
            namespace=namespace,
            name=name,
            columns=tuple(Column(n, t, m, f) for (n, t, m), f in zip(cols, flags, strict=True)),
            replica_identity=identity,
            key_columns=_key_columns(identity, pk, ri),
        )
        generated_names = tuple(generated_columns.get(oid, ()))
        parts = tuple(leaves.get(oid, ()))
        # A partitioned table has no storage of its own: it is sized by its leaves.
        size = sum(leaf.pages for leaf in parts) if kind == "p" else pages
        rows_estimate = estimated_rows(parts) if kind == "p" else reltuples
        tables.append(
            CatalogTable(
                schema,
                bool(pk),
                selectable,
                owned,
                size,
                rows_estimate,
                generated_names,
                parts,
                kind == "p",
                is_partition,
            )
        )
    return tables


# -- startup checks ----------------------------------------------------------------------------


LOGICAL_MESSAGES_VERSION = 140000
GENERATED_COLUMNS_VERSION = 180000  # publish_generated_columns
RESNAPSHOT_NEEDS = "a re-snapshot while streaming needs Postgres 14 or later (pgoutput's messages option)"


@dataclass(frozen=True)
class ServerFacts:
    role: str
    database: str
    wal_level: str
    encoding: str
    replication_role: bool
    max_slots: int
    used_slots: int
    max_wal_senders: int
    used_wal_senders: int
    can_create_publication: bool
    wal_sender_timeout_ms: int
    server_version_num: int = LOGICAL_MESSAGES_VERSION
    in_recovery: bool = False  # a standby
    hot_standby_feedback: bool = False  # what a standby needs to keep a logical slot valid

    @property
    def decodes_logical_messages(self) -> bool:
        """pgoutput's `messages` option (Postgres 14+), which re-snapshots while streaming need."""
        return self.server_version_num >= LOGICAL_MESSAGES_VERSION

    @property
    def publishes_generated_columns(self) -> bool:
        """Whether a publication can publish stored generated columns (Postgres 18+); before 18
        pgoutput never sends generated columns, so they are absent from the topics."""
        return self.server_version_num >= GENERATED_COLUMNS_VERSION


_FACTS_SQL = """
SELECT current_user::text, current_database()::text, current_setting('wal_level'),
       current_setting('server_encoding'),
       (SELECT rolreplication OR rolsuper FROM pg_roles WHERE rolname = current_user),
       current_setting('max_replication_slots')::int,
       (SELECT count(*) FROM pg_replication_slots)::int,
       current_setting('max_wal_senders')::int,
       (SELECT count(*) FROM pg_stat_replication)::int,
       has_database_privilege(current_database(), 'CREATE'),
       (SELECT setting::int FROM pg_settings WHERE name = 'wal_sender_timeout'),
       current_setting('server_version_num')::int,
       pg_is_in_recovery(), current_setting('hot_standby_feedback')::bool
"""


def server_facts(conn: psycopg2.extensions.connection) -> ServerFacts:
    with conn.cursor() as cur:
        cur.execute(_FACTS_SQL)
        row = cur.fetchone()
    assert row is not None
    return ServerFacts(*row)


def check_server(facts: ServerFacts, *, creating_slot: bool, replacing_slot: bool = False) -> list[str]:
    """Problems with the server or the role; each one line that names the fix. `replacing_slot`:
    the slot to create replaces one that exists (an interrupted snapshot's), whose place it takes."""
    problems = []  # a standby's own checks: shell/postgres/standby.py
    if facts.wal_level != "logical":
        problems.append(
            f"wal_level is {facts.wal_level!r}: set wal_level = logical in postgresql.conf "
            "(ALTER SYSTEM SET wal_level = logical) and restart Postgres"
        )
    if facts.encoding != REQUIRED_ENCODING:
        problems.append(
            f"database {facts.database} is encoded in {facts.encoding}: the worker reads UTF8 databases "
            "only; capture a database created with ENCODING 'UTF8'"
        )
    if not facts.replication_role:
        problems.append(
            f"role {facts.role} lacks the REPLICATION attribute: ALTER ROLE {facts.role} REPLICATION"
        )
    used_after_drop = facts.used_slots - (1 if replacing_slot else 0)
    if creating_slot and used_after_drop >= facts.max_slots:
        problems.append(
            f"all {facts.max_slots} replication slots are in use: raise max_replication_slots in "
            "postgresql.conf (restart needed) or drop an unused slot (bottledwater slot drop -s NAME)"
        )
    if facts.used_wal_senders >= facts.max_wal_senders:
        problems.append(
            f"all {facts.max_wal_senders} WAL senders are in use: raise max_wal_senders in "
            "postgresql.conf (restart needed) or stop another replication client"
        )
    return problems


def check_tables(
    tables: Sequence[CatalogTable], *, allow_unkeyed: bool, role: str, filters_given: bool
) -> list[str]:
    """Problems with the selected tables: none selected, no SELECT grant, unkeyed without -u."""
    if not tables:
        where = "match --tables/--exclude-tables" if filters_given else "are visible to role " + role
        return [f"no ordinary, logged tables {where}: create one, or fix the globs / grants"]
    problems = []
    for table in tables:
        name = table.qualified_name
        if not table.selectable:
            problems.append(f"role {role} cannot read table {name}: GRANT SELECT ON {name} TO {role}")
        for leaf in table.leaves:
            if not leaf.selectable:  # the snapshot reads each leaf by its own ctid ranges
                problems.append(
                    f"role {role} cannot read partition {leaf.qualified_name} of {name}: "
                    f"GRANT SELECT ON {leaf.qualified_name} TO {role}"
                )
        if not table.schema.is_keyed and not allow_unkeyed:
            problems.append(
                f"table {name} has no primary key or replica identity index: add a primary key, set "
                "REPLICA IDENTITY USING INDEX, exclude it with --exclude-tables, or pass -u/--allow-unkeyed"
            )
    return problems
