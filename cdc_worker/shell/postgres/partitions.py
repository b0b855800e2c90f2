"""Partitioned tables: whether one is captured as one table (its root) or leaf by leaf, and its
leaves, which the snapshot reads one by one under the root.

Why the root by default: a consumer of `events` wants one topic, one key and one Delta mirror, not a
topic per month to re-assemble (and a row whose partition key changes moving between topics). The
publication then sets `publish_via_partition_root`, so pgoutput sends every leaf's changes as its
root's, keyed by the root's key; the snapshot still reads each leaf by its own ctid ranges (a
partitioned table has no heap of its own, and COPY refuses it) and publishes their rows as the
root's.

The mode is remembered by the publication itself (its publish_via_partition_root setting, read back
at start): a slot streamed in one mode cannot switch to the other without a new snapshot, since its
topics would change (`switch_problem`).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

import psycopg2.extensions


class PartitionMode(enum.StrEnum):
    """How partitioned tables are captured: `root`, one table (the publication publishes every
    leaf's changes under its root, publish_via_partition_root); `leaf`, each leaf partition a table
    of its own, as before this mode existed."""

    ROOT = "root"
    LEAF = "leaf"


@dataclass(frozen=True)
class Leaf:
    """One leaf partition of a partitioned table captured as one table: what the snapshot reads
    (by ctid ranges, as any table) and publishes under its root."""

    oid: int
    namespace: str
    name: str
    pages: int
    estimated_rows: int
    selectable: bool

    @property
    def qualified_name(self) -> str:
        return f"{self.namespace}.{self.name}"


# Every leaf of each partitioned table, at any depth (foreign partitions are never published).
_LEAVES_SQL = """
SELECT t.root, c.oid, n.nspname::text, c.relname::text,
       (pg_relation_size(c.oid) / current_setting('block_size')::int)::bigint, c.reltuples::bigint,
       has_table_privilege(c.oid, 'SELECT')
  FROM unnest(%s::oid[]) AS t(root)
 CROSS JOIN LATERAL pg_partition_tree(t.root) AS p
  JOIN pg_class c ON c.oid = p.relid
  JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE p.isleaf AND c.relkind = 'r'
 ORDER BY 1, 3, 4
"""


def candidate(relkind: str, is_partition: bool, mode: PartitionMode) -> bool:
    """Whether a relation is a table of its own under `mode`: in root mode the partitioned tables
    that are no one's partition and the plain tables; in leaf mode every table with storage."""
    if mode is PartitionMode.LEAF:
        return relkind == "r"
    return not is_partition


def load_leaves(cur: psycopg2.extensions.cursor, roots: Sequence[int]) -> dict[int, list[Leaf]]:
    leaves: dict[int, list[Leaf]] = {}
    if roots:
        cur.execute(_LEAVES_SQL, (list(roots),))
        for root, oid, namespace, name, pages, reltuples, selectable in cur.fetchall():
            leaves.setdefault(root, []).append(Leaf(oid, namespace, name, pages, reltuples, selectable))
    return leaves


def estimated_rows(leaves: Sequence[Leaf]) -> int:
    """The leaves' rows by the planner's statistics; -1 (unknown) when none was ever analyzed."""
    known = [leaf.estimated_rows for leaf in leaves if leaf.estimated_rows >= 0]
    return sum(known) if known else -1


def switch_problem(
    *, slot: str, publication: str, recorded_via_root: bool, mode: PartitionMode, partitioned: bool
) -> str | None:
    """Why a resumed slot cannot stream in `mode`, or None. The slot's topics were made in the mode
    its publication records: switching would start new topics (root's, or each leaf's) from the
    middle of the stream, without the rows published before. Without partitioned tables the mode
    changes nothing and the publication is simply aligned."""
    if not partitioned or recorded_via_root == (mode is PartitionMode.ROOT):
        return None
    was = PartitionMode.ROOT if recorded_via_root else PartitionMode.LEAF
    return (
        f"slot {slot} captures partitioned tables with --partitions {was} (publication {publication} has "
        f"publish_via_partition_root {'on' if recorded_via_root else 'off'}), not {mode}: restart with "
        f"--partitions {was} (BOTTLEDWATER_PARTITIONS={was}), or drop the slot (bottledwater slot drop -s "
        f"{slot}) and start again for a new snapshot into the {mode} topics"
    )


_ROOTS_SQL = (
    "SELECT c.oid::bigint, pg_partition_root(c.oid)::bigint FROM pg_class c WHERE c.oid = ANY (%s::oid[])"
)


def roots_of(conn: psycopg2.extensions.connection, oids: Sequence[int]) -> dict[int, int]:
    """Per partition among `oids`, its topmost root (a table that is no partition is its own)."""
    if not oids:
        return {}
    with conn.cursor() as cur:
        cur.execute(_ROOTS_SQL, (list(oids),))
        return {int(oid): int(root) if root is not None else int(oid) for oid, root in cur.fetchall()}
