"""Partitioned tables captured as one table: the option, the snapshot's ranges over the leaves, and
the refusal to switch a resumed slot's mode. No services."""

from __future__ import annotations

from cdc_worker.config import config_from_values, resolve_values
from cdc_worker.core.model import Column, TableSchema
from cdc_worker.shell.postgres.catalog import CatalogTable
from cdc_worker.shell.postgres.partitions import (
    Leaf,
    PartitionMode,
    candidate,
    estimated_rows,
    switch_problem,
)
from cdc_worker.shell.snapshot.chunks import Chunk, plan_chunks

DSN = "postgresql://u@h/db"
ROOT = TableSchema(10, "shop", "events", (Column("id", 20, -1, True), Column("at", 1184, -1, True)))


def _leaf(oid: int, name: str, pages: int, rows: int = 100) -> Leaf:
    return Leaf(oid, "shop", name, pages, rows, selectable=True)


def _root(*leaves: Leaf) -> CatalogTable:
    pages = sum(leaf.pages for leaf in leaves)
    return CatalogTable(ROOT, True, True, True, pages, estimated_rows(leaves), (), leaves, partitioned=True)


def test_partitions_default_to_the_root_and_read_their_environment_variable() -> None:
    assert config_from_values(resolve_values({"postgres": DSN}, {})).partitions is PartitionMode.ROOT
    env = {"BOTTLEDWATER_PARTITIONS": "leaf"}
    assert config_from_values(resolve_values({"postgres": DSN}, env)).partitions is PartitionMode.LEAF
    given = {"postgres": DSN, "partitions": "root"}
    assert config_from_values(resolve_values(given, env)).partitions is PartitionMode.ROOT


def test_which_relations_are_tables_in_each_mode() -> None:
    # (relkind, is a partition): a plain table, a root, a sub-partitioned level, a leaf
    kinds = [("r", False), ("p", False), ("p", True), ("r", True)]
    assert [candidate(k, p, PartitionMode.ROOT) for k, p in kinds] == [True, True, False, False]
    assert [candidate(k, p, PartitionMode.LEAF) for k, p in kinds] == [True, False, False, True]


def test_a_root_is_read_leaf_by_leaf_and_published_as_itself() -> None:
    root = _root(
        _leaf(11, "events_2026_01", 300), _leaf(12, "events_2026_02", 50), _leaf(13, "events_def", 0)
    )
    chunks = plan_chunks([root], pages_per_chunk=128, workers=1)
    assert {c.table.schema.oid for c in chunks} == {10}, "every range is published under the root"
    by_leaf = [(c.leaf.name if c.leaf else None, c.first_page, c.end_page) for c in chunks]
    assert by_leaf == [
        ("events_2026_01", None, 128),
        ("events_2026_01", 128, 256),
        ("events_2026_01", 256, None),
        ("events_2026_02", None, None),
        ("events_def", None, None),
    ], "each leaf's own ctid ranges, the last open-ended, empty leaves read once"
    statement = repr(chunks[1].copy_statement())
    assert "Identifier('shop', 'events_2026_01')" in statement, "read from the leaf"
    assert "Identifier('id'), SQL(', '), Identifier('at')" in statement, (
        "the root's columns, in the root's order"
    )


def test_a_root_without_statistics_has_no_row_estimate() -> None:
    assert estimated_rows([_leaf(1, "a", 1, -1), _leaf(2, "b", 1, -1)]) == -1
    assert estimated_rows([_leaf(1, "a", 1, -1), _leaf(2, "b", 1, 7)]) == 7


def test_a_resumed_slot_keeps_its_mode() -> None:
    refused = switch_problem(
        slot="s1", publication="s1", recorded_via_root=False, mode=PartitionMode.ROOT, partitioned=True
    )
    assert refused is not None and "\n" not in refused
    assert "--partitions leaf" in refused and "bottledwater slot drop -s s1" in refused
    same = switch_problem(
        slot="s1", publication="s1", recorded_via_root=True, mode=PartitionMode.ROOT, partitioned=True
    )
    assert same is None
    no_partitions = switch_problem(
        slot="s1", publication="s1", recorded_via_root=False, mode=PartitionMode.ROOT, partitioned=False
    )
    assert no_partitions is None, "without partitioned tables the mode changes nothing"


def test_a_plain_table_chunk_reads_the_table_itself() -> None:
    table = CatalogTable(ROOT, True, True, True, 10, 5)
    assert "Identifier('shop', 'events')" in repr(Chunk(table).copy_statement())
