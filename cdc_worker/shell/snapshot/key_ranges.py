"""Key ranges for the Spark snapshot, where ctid ranges do not split a table well.

ctid ranges are the default: a range of heap pages is read without touching the rest of the table,
whatever the table's keys. Where they are not used, and why:

- **Partitioned tables** never need anything else: each leaf is read by its own ctid ranges,
  whether it is a table of its own (`--partitions leaf`) or read under its root (`plan_chunks`).
- **A table whose `pg_class.relpages` is 0 or stale** (bulk-loaded since its last VACUUM or
  ANALYZE) is sized from `pg_relation_size` when the job is planned, not from `relpages`.
- **Views, materialized views and foreign tables** are never in a publication: never snapshotted.
- **Postgres 12 and 13** have no TID range scan: `ctid >= ... AND ctid < ...` is a filter over a
  full scan there, so N ranges would read the table N times. A table with a usable key is split
  by key instead (below), any other table is read whole by one task.
- **Rows packed in a small part of the heap** (most of it empty after a mass delete): equal page
  ranges give most tasks nothing to publish and leave the rows to one or two. When the table's
  live rows fill less than `SPARSE_HEAP` of its heap, by the planner's statistics, and its key is
  laid out in heap order (`pg_stats.correlation` at least `MIN_CORRELATION`, so an index range scan
  reads nearly sequential pages), it is split by key.

Key ranges use the first primary key column of a type whose order does not depend on a collation
(`ORDERED_TYPES`), cut at the bounds of its `pg_stats` histogram: buckets of equal row counts as of
the last ANALYZE. The first and last ranges are open-ended, so a key outside the histogram is still
read once; stale statistics only make ranges uneven, never lose or repeat a row.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import psycopg2.extensions

from cdc_worker.core.pgtypes.oids import PgType
from cdc_worker.shell.postgres.catalog import CatalogTable, connect

log = logging.getLogger(__name__)

TID_RANGE_SCAN_VERSION = 140000  # Postgres 14
SPARSE_HEAP = 1 / 3
MIN_CORRELATION = 0.9
PAGE_BYTES = 8192
PAGE_HEADER_BYTES = 24
TUPLE_HEADER_BYTES = 24  # HeapTupleHeader with its alignment
LINE_POINTER_BYTES = 4
MAXALIGN = 8
ORDERED_TYPES = frozenset(
    {
        PgType.INT2,
        PgType.INT4,
        PgType.INT8,
        PgType.NUMERIC,
        PgType.DATE,
        PgType.TIMESTAMP,
        PgType.TIMESTAMPTZ,
        PgType.UUID,
    }
)


@dataclass(frozen=True)
class KeyStats:
    """What the planner's statistics say about a keyed table (`pg_stats`, as of its last ANALYZE)."""

    column: str  # the first primary key column
    type_oid: int
    bounds: tuple[str, ...]  # its histogram bounds, in its order
    correlation: float  # of its values with the heap order, -1..1
    row_width: int  # sum of the columns' average widths, in bytes


@dataclass(frozen=True)
class KeySplit:
    """A table read by key ranges: `column` cut at `bounds` (ascending; n bounds, n + 1 ranges)."""

    column: str
    bounds: tuple[str, ...]
    reason: str


def live_fraction(table: CatalogTable, row_width: int) -> float:
    """How much of the table's heap its live rows fill, estimated from `reltuples` and the average
    row width; 1.0 when unknown (never analyzed, or empty)."""
    if table.pages <= 0 or table.estimated_rows < 0:
        return 1.0
    tuple_bytes = -(-(TUPLE_HEADER_BYTES + row_width) // MAXALIGN) * MAXALIGN + LINE_POINTER_BYTES
    return table.estimated_rows * tuple_bytes / (table.pages * (PAGE_BYTES - PAGE_HEADER_BYTES))


def choose_split(table: CatalogTable, stats: KeyStats | None, server_version_num: int) -> KeySplit | None:
    """Whether (and why) to read `table` by key ranges rather than ctid ranges; None: by ctid (or, on
    Postgres before 14 without usable statistics, whole)."""
    if stats is None or stats.type_oid not in ORDERED_TYPES or len(stats.bounds) < 3:
        return None
    if server_version_num < TID_RANGE_SCAN_VERSION:
        return KeySplit(stats.column, stats.bounds, "no TID range scan before Postgres 14")
    fraction = live_fraction(table, stats.row_width)
    if fraction < SPARSE_HEAP and abs(stats.correlation) >= MIN_CORRELATION:
        return KeySplit(stats.column, stats.bounds, f"live rows fill {fraction:.0%} of its heap")
    return None


def cut(bounds: Sequence[str], ranges: int) -> tuple[str, ...]:
    """`ranges - 1` of the histogram's inner bounds, evenly spaced (each range about the same rows),
    duplicates dropped: the cut points of `ranges` key ranges (fewer when the histogram is short)."""
    buckets = len(bounds) - 1
    if ranges <= 1 or buckets < 2:
        return ()
    chosen: list[str] = []
    for index in range(1, ranges):
        bound = bounds[min(buckets - 1, max(1, round(index * buckets / ranges)))]
        if not chosen or chosen[-1] != bound:
            chosen.append(bound)
    return tuple(chosen)


def effective_pages(table: CatalogTable, split: KeySplit | None, stats: KeyStats | None) -> int:
    """The pages a table's ranges are sized by: its live rows' share of the heap when it is read by
    key (a mostly empty heap reads fast by key), else its whole heap."""
    if split is None or stats is None:
        return table.pages
    return max(1, round(table.pages * min(1.0, live_fraction(table, stats.row_width))))


_STATS_SQL = """
SELECT c.oid, a.attname::text, a.atttypid, s.histogram_bounds::text::text[], s.correlation,
       (SELECT sum(w.avg_width) FROM pg_stats w
         WHERE w.schemaname = n.nspname AND w.tablename = c.relname AND NOT w.inherited)::int
  FROM pg_class c
  JOIN pg_namespace n ON n.oid = c.relnamespace
  JOIN pg_index i ON i.indrelid = c.oid AND i.indisprimary
  JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = i.indkey[0]
  JOIN pg_stats s ON s.schemaname = n.nspname AND s.tablename = c.relname AND s.attname = a.attname
                 AND NOT s.inherited
 WHERE c.oid = ANY (%s::oid[])
"""


def load_key_stats(
    conn: psycopg2.extensions.connection, tables: Sequence[CatalogTable]
) -> tuple[int, dict[int, KeyStats]]:
    """The server's version and, per table with a primary key and statistics, its `KeyStats`."""
    with conn.cursor() as cur:
        cur.execute("SELECT current_setting('server_version_num')::int")
        row = cur.fetchone()
        version = int(row[0]) if row else TID_RANGE_SCAN_VERSION
        keyed = [t.schema.oid for t in tables if t.has_primary_key]
        if not keyed:
            return version, {}
        cur.execute(_STATS_SQL, (keyed,))
        found = {
            int(oid): KeyStats(
                column, int(type_oid), tuple(bounds or ()), float(corr or 0.0), int(width or 0)
            )
            for oid, column, type_oid, bounds, corr, width in cur.fetchall()
        }
    return version, found


def table_splits(dsn: str, tables: Sequence[CatalogTable]) -> tuple[dict[int, tuple[KeySplit, int]], bool]:
    """What `chunks.plan_chunks` needs for `tables`: the key splits, and whether ctid ranges are
    read without a full scan (Postgres 14+). Statistics only shape the ranges: any connection."""
    conn = connect(dsn, application_name="bottledwater-snapshot-planner")
    try:
        version, stats = load_key_stats(conn, tables)
        conn.rollback()
    finally:
        conn.close()
    return plan_splits(tables, stats, version), version >= TID_RANGE_SCAN_VERSION


def plan_splits(
    tables: Sequence[CatalogTable], stats: Mapping[int, KeyStats], server_version_num: int
) -> dict[int, tuple[KeySplit, int]]:
    """Per table to read by key: its split and the pages to size its ranges by."""
    splits: dict[int, tuple[KeySplit, int]] = {}
    for table in tables:
        table_stats = stats.get(table.schema.oid)
        split = choose_split(table, table_stats, server_version_num)
        if split is not None:
            splits[table.schema.oid] = (split, effective_pages(table, split, table_stats))
            log.info(
                "spark snapshot: %s read by ranges of its key %s (%s)",
                table.qualified_name,
                split.column,
                split.reason,
            )
    return splits
