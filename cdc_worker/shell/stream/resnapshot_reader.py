"""The Postgres side of a re-snapshot while streaming (see `incremental` for the algorithm):
asking for one, and reading one chunk between its two watermarks."""

from __future__ import annotations

import time
import uuid
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from types import SimpleNamespace

import psycopg2
import psycopg2.extensions
from psycopg2 import sql

from cdc_worker.core.incremental import (
    SIGNAL_PREFIX,
    WINDOW_CLOSE,
    WINDOW_OPEN,
    ChunkPlan,
    KeyText,
    SnapshotXids,
    request_content,
    watermark_content,
)
from cdc_worker.core.model import TableSchema
from cdc_worker.core.pgtypes.copy_text import CopyRow, parse_copy_text_line
from cdc_worker.shell.postgres import subsets
from cdc_worker.shell.postgres.catalog import CatalogTable, load_tables
from cdc_worker.shell.postgres.partitions import roots_of
from cdc_worker.shell.postgres.slot import publishes_generated_columns

_EMIT = "SELECT pg_logical_emit_message(true, %s, %s)"
_TABLE_OID = """
SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %s AND c.relname = %s AND c.relkind IN ('r', 'p')
"""
# The chunk's snapshot, to tell which streamed transactions it saw (see `SnapshotXids`).
_SNAPSHOT = """
SELECT pg_snapshot_xmin(s)::text, pg_snapshot_xmax(s)::text, ARRAY(SELECT x::text FROM pg_snapshot_xip(s) x)
  FROM pg_current_snapshot() s
"""
# Commits decoded lately, to compare with a chunk's snapshot: a commit is decoded once its record
# is flushed, and becomes visible a moment later (after a synchronous standby's answer, when there
# is one), so a commit decoded a few thousand transactions ago is visible long since.
RECENT_XIDS = 4096
SETTLE_POLL_S = 0.002
SETTLE_TIMEOUT_S = 60.0
_PUBLISHED = """
SELECT 1 FROM pg_publication_tables WHERE pubname = ANY(%s) AND schemaname = %s AND tablename = %s
"""
# Whether a partition's root is in the publications, which publish it as one table.
_PUBLISHED_AS_ROOT = """
SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
  JOIN pg_class r ON r.oid = pg_partition_root(c.oid)
  JOIN pg_namespace rn ON rn.oid = r.relnamespace
  JOIN pg_publication_tables pt ON pt.schemaname = rn.nspname AND pt.tablename = r.relname
  JOIN pg_publication p ON p.pubname = pt.pubname AND p.pubviaroot
 WHERE n.nspname = %s AND c.relname = %s AND c.relispartition AND pt.pubname = ANY (%s)
"""
NEWLINE = b"\n"


class ChunkUnreadable(RuntimeError):
    """The table cannot be re-snapshotted (gone, no key, no SELECT); the message says why."""


def emit_signal(conn: psycopg2.extensions.connection, content: bytes) -> int:
    """Write one signal into the WAL in a transaction of its own; returns its LSN."""
    with conn.cursor() as cur:
        cur.execute(_EMIT, (SIGNAL_PREFIX, content.decode()))
        row = cur.fetchone()
    lsn_text = str(row[0]) if row else "0/0"
    high, low = lsn_text.split("/")
    return (int(high, 16) << 32) | int(low, 16)


def request_resnapshot(
    conn: psycopg2.extensions.connection, slot: str, tables: Sequence[tuple[str, str]]
) -> tuple[str, int]:
    """Ask the worker streaming `slot` to re-snapshot `tables` (schema, name) while it streams.
    The request waits in the slot's WAL until a worker reads it. Returns (request id, its LSN)."""
    if not conn.autocommit:
        raise ValueError("request_resnapshot needs an autocommit connection: the request must commit")
    request_id = uuid.uuid4().hex
    return request_id, emit_signal(conn, request_content(slot, request_id, list(tables)))


@dataclass(frozen=True)
class ChunkRead:
    table: TableSchema
    rows: dict[KeyText, CopyRow]  # key -> row, in key order
    snapshot: SnapshotXids


class ChunkSource:
    """Reads chunks on the worker's ordinary (autocommit) connection: low watermark, one keyset
    page by COPY, high watermark, each its own transaction, so the page's snapshot falls between the
    two watermarks' commits."""

    def __init__(self, conn: psycopg2.extensions.connection, slot: str, publications: Sequence[str]) -> None:
        self.conn = conn
        self.slot = slot
        self.publications = list(publications)
        # One TableSchema object per table while it does not change: the serializers cache their
        # compiled plans (and registered schema ids) by object.
        self._schemas: dict[int, TableSchema] = {}
        self._recent: deque[int] = deque(maxlen=RECENT_XIDS)
        # Per table asked for (schema, name): the relation its rows are read from, when that is a
        # leaf partition published as its root (read from the leaf, published as the root).
        self._read_from: dict[tuple[str, str], tuple[str, str]] = {}
        self._row_filters: dict[int, str | None] = {}  # per table OID, its publication's row filter

    def decoded(self, xid: int) -> None:
        """The stream decoded the commit of `xid` (in commit order)."""
        self._recent.append(xid)

    def find_table(self, schema: str, name: str) -> CatalogTable:
        with self.conn.cursor() as cur:
            cur.execute(_TABLE_OID, (schema, name))
            found = cur.fetchone()
        if not found:
            raise ChunkUnreadable(f"table {schema}.{name} does not exist (dropped or renamed?)")
        generated = publishes_generated_columns(self.conn, self.publications)
        tables = load_tables(self.conn, oids=[int(found[0])], generated=generated)
        if not tables:
            raise ChunkUnreadable(
                f"{schema}.{name} is not a table the worker captures (an unlogged or temporary "
                "table): ask for a logged table"
            )
        table = tables[0]
        if table.is_partition:
            # A partition attached with rows, say: its rows join its root's topic when the
            # publication publishes the root (`--partitions root`); else it is a table of its own.
            root_oid = roots_of(self.conn, [table.schema.oid]).get(table.schema.oid)
            roots = load_tables(self.conn, oids=[root_oid], generated=generated) if root_oid else []
            if roots and self._published(roots[0].schema.namespace, roots[0].schema.name):
                self._read_from[(schema, name)] = (schema, name)
                table = roots[0]
        held = subsets.published(self.conn, self.publications).get(table.schema.oid)
        if held is not None:  # the columns and rows the stream publishes, not the whole table
            table = subsets.as_published(table, held)
        self._row_filters[table.schema.oid] = table.row_filter
        if not table.schema.is_keyed:
            raise ChunkUnreadable(
                f"table {table.qualified_name} has no primary key or replica identity index: a re-snapshot "
                "while streaming reads it in key order; add a key, or drop the slot for a full snapshot"
            )
        if not self._published(table.schema.namespace, table.schema.name):
            # Its changes inside a window would not be decoded, so a chunk row could be stale.
            raise ChunkUnreadable(
                f"table {table.qualified_name} is not in the worker's publication "
                f"({', '.join(self.publications)}): add it to the worker's --tables and restart the "
                "worker, which then re-snapshots it"
            )
        if not table.selectable:
            raise ChunkUnreadable(
                f"no SELECT privilege on {table.qualified_name}: GRANT SELECT on it to the worker's role"
            )
        cached = self._schemas.get(table.schema.oid)
        if cached != table.schema:
            self._schemas[table.schema.oid] = table.schema
        return table

    def _published(self, schema: str, name: str) -> bool:
        with self.conn.cursor() as cur:
            cur.execute(_PUBLISHED, (self.publications, schema, name))
            return cur.fetchone() is not None

    def published_as_root(self, schema: str, name: str) -> bool:
        """Whether `schema.name` is a partition whose root the worker publishes as one table."""
        with self.conn.cursor() as cur:
            cur.execute(_PUBLISHED_AS_ROOT, (schema, name, self.publications))
            return cur.fetchone() is not None

    def schema(self, oid: int) -> TableSchema:
        return self._schemas[oid]

    def _settled_snapshot(self, cur: psycopg2.extensions.cursor, table: str) -> SnapshotXids:
        """Open a REPEATABLE READ transaction whose snapshot sees every commit the stream has
        decoded so far (the stream decodes commits before they are visible): the commits it has not
        seen yet are those it decodes after this, which `IncrementalSnapshot.observe` watches."""
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        while True:
            cur.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            cur.execute(_SNAPSHOT)  # the first query takes the transaction's snapshot
            row = cur.fetchone()
            assert row is not None
            snapshot = SnapshotXids(int(row[0]), int(row[1]), frozenset(int(x) for x in row[2]))
            if all(snapshot.sees(xid) for xid in self._recent):
                return snapshot
            cur.execute("ROLLBACK")
            if time.monotonic() > deadline:
                raise ChunkUnreadable(
                    f"cannot read {table}: transactions decoded {SETTLE_TIMEOUT_S:.0f}s ago are still "
                    "not visible (a synchronous standby that does not answer?); fix that, then ask again"
                )
            time.sleep(SETTLE_POLL_S)

    def read(self, plan: ChunkPlan) -> ChunkRead:
        table = self.find_table(plan.table.schema, plan.table.table)
        schema = self._schemas[table.schema.oid]
        source = self._read_from.get((plan.table.schema, plan.table.table))
        statement = chunk_statement(
            schema, plan.after, plan.limit, source, row_filter=self._row_filters.get(schema.oid)
        )
        lines: list[bytes] = []

        def write(data: bytes) -> int:
            lines.append(data)
            return len(data)

        emit_signal(self.conn, watermark_content(WINDOW_OPEN, self.slot, plan.window, plan.progress))
        try:
            with self.conn.cursor() as cur:
                snapshot = self._settled_snapshot(cur, schema.qualified_name)
                try:
                    cur.copy_expert(statement, SimpleNamespace(write=write))
                finally:
                    cur.execute("ROLLBACK")  # read only: nothing to keep
        except psycopg2.Error as exc:
            message = exc.diag.message_primary or str(exc).splitlines()[0]
            raise ChunkUnreadable(
                f"cannot read {schema.qualified_name}: {message}; if it is a timeout, raise the worker "
                "role's statement_timeout/lock_timeout or lower --resnapshot-chunk-rows, then ask again"
            ) from exc
        finally:
            # Always closed, so the stream never waits on a window that would not end.
            emit_signal(self.conn, watermark_content(WINDOW_CLOSE, self.slot, plan.window, plan.progress))
        rows: dict[KeyText, CopyRow] = {}
        key_indexes = schema.key_indexes
        for line in b"".join(lines).split(NEWLINE)[:-1]:
            row = parse_copy_text_line(line)
            rows[tuple(row[i] for i in key_indexes)] = row
        return ChunkRead(schema, rows, snapshot)


def chunk_statement(
    schema: TableSchema,
    after: KeyText | None,
    limit: int,
    source: tuple[str, str] | None = None,
    *,
    row_filter: str | None = None,
) -> sql.Composed:
    """COPY of the next `limit` rows in key order after the key `after` (text values, which
    Postgres reads back as the key columns' types); from `source` (a leaf partition of the table
    `schema` describes) when given; only the rows of the publication's `row_filter` (the text
    Postgres printed for it)."""
    columns = sql.SQL(", ").join(sql.Identifier(c.name) for c in schema.columns)
    key = sql.SQL(", ").join(sql.Identifier(name) for name in schema.key_columns)
    relation = sql.Identifier(*(source or (schema.namespace, schema.name)))
    conditions = [] if row_filter is None else [sql.SQL("({})").format(sql.SQL(row_filter))]
    if after is not None:
        bound = sql.SQL(", ").join(sql.Literal(value) for value in after)
        conditions.append(sql.SQL("({}) > ({})").format(key, bound))
    where = sql.SQL(" WHERE {}").format(sql.SQL(" AND ").join(conditions)) if conditions else sql.SQL("")
    return sql.SQL("COPY (SELECT {} FROM {}{} ORDER BY {} LIMIT {}) TO STDOUT").format(
        columns, relation, where, key, sql.Literal(limit)
    )
