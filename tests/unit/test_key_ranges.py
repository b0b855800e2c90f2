"""Where the Spark snapshot reads a table by key ranges instead of ctid ranges, and that its key
ranges cover every key exactly once (the planning alone: no database)."""

from __future__ import annotations

import bisect

from cdc_worker.core.model import Column, TableSchema
from cdc_worker.core.pgtypes.oids import PgType
from cdc_worker.shell.postgres.catalog import CatalogTable
from cdc_worker.shell.snapshot.chunks import Chunk, plan_chunks
from cdc_worker.shell.snapshot.key_ranges import KeyStats, choose_split, cut, plan_splits

PG15, PG13 = 150004, 130011
COLUMNS = (Column("id", PgType.INT8, -1), Column("note", PgType.TEXT, -1))


def table(oid: int, pages: int, rows: int) -> CatalogTable:
    schema = TableSchema(oid, "public", f"t{oid}", COLUMNS, key_columns=("id",))
    return CatalogTable(schema, True, selectable=True, owned=True, pages=pages, estimated_rows=rows)


def stats(correlation: float = 1.0, bounds: int = 101, type_oid: int = PgType.INT8) -> KeyStats:
    # A histogram of ids 0, 1000, ..., as ANALYZE writes it; rows of 28 bytes (id 8, note 20).
    return KeyStats("id", type_oid, tuple(str(i * 1000) for i in range(bounds)), correlation, 28)


# 1000 pages holding 140 rows each: full (~60 bytes per row with header and line pointer).
DENSE = table(1, 1000, 140_000)
# Ten times that heap after 90 % of its rows were deleted (VACUUM leaves the emptied pages).
SPARSE = table(2, 10_000, 140_000)


def test_ctid_ranges_stay_the_rule_on_postgres_14_and_later() -> None:
    assert choose_split(DENSE, stats(), PG15) is None, "a full heap: ctid ranges are balanced"
    assert choose_split(SPARSE, None, PG15) is None, "no statistics: ctid"
    assert choose_split(SPARSE, stats(correlation=0.2), PG15) is None, "keys scattered over the heap"
    assert choose_split(SPARSE, stats(type_oid=PgType.TEXT), PG15) is None, "a collation's order"
    assert choose_split(SPARSE, stats(bounds=2), PG15) is None, "no histogram to cut"


def test_a_mostly_empty_heap_with_keys_in_heap_order_is_read_by_key() -> None:
    split = choose_split(SPARSE, stats(correlation=-0.95), PG15)
    assert split is not None and split.column == "id"
    assert "of its heap" in split.reason


def test_before_postgres_14_a_keyed_table_is_read_by_key_and_any_other_whole() -> None:
    split = choose_split(DENSE, stats(correlation=0.0), PG13)
    assert split is not None and "before Postgres 14" in split.reason
    other = table(3, 5000, 700_000)
    chunks = plan_chunks([other], 128, 2, ctid_ranges=False)
    assert chunks == [Chunk(other)], "never N full scans of one table"


def test_cut_points_are_increasing_inner_bounds_at_most_one_per_range() -> None:
    bounds = [str(i) for i in range(0, 101, 10)]  # 10 buckets
    assert cut(bounds, 1) == ()
    assert cut(bounds, 5) == ("20", "40", "60", "80")
    assert cut(bounds, 40) == tuple(str(i) for i in range(10, 100, 10)), "at most the histogram's"
    assert cut(["1", "5", "5", "5", "9"], 4) == ("5",), "duplicates dropped"


def test_key_ranges_cover_every_key_once_and_are_sized_by_the_live_rows() -> None:
    splits = plan_splits([SPARSE, DENSE], {2: stats()}, PG15)
    assert set(splits) == {2}
    pages = splits[2][1]
    assert pages < SPARSE.pages / 5, "sized by what its live rows fill, not by its empty pages"
    chunks = plan_chunks([SPARSE, DENSE], 8192, 2, key_splits=splits)
    by_key = [c for c in chunks if c.table is SPARSE]
    assert all(c.key_column == "id" and c.first_page is None and c.end_page is None for c in by_key)
    assert len(by_key) >= 4, "its rows shared by several tasks"
    assert by_key[0].low_key is None and by_key[-1].high_key is None, "open-ended at both ends"
    # Every key, inside the histogram or outside it, falls in exactly one range.
    cuts = [int(c.high_key) for c in by_key[:-1] if c.high_key is not None]
    assert cuts == sorted(cuts) and [int(c.low_key) for c in by_key[1:] if c.low_key] == cuts
    for key in (-5, 0, 999, 1000, 54_321, 100_000, 10**12):
        holders = [c for c in by_key if (c.low_key is None or key >= int(c.low_key))
                   and (c.high_key is None or key < int(c.high_key))]  # fmt: skip
        assert len(holders) == 1, key
        assert holders[0] is by_key[bisect.bisect_right(cuts, key)]
    assert any(c.table is DENSE and c.first_page is not None for c in chunks), "DENSE keeps ctid"
