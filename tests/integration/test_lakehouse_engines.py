"""The mirrors read by engines other than Spark, compared with Postgres: DuckDB's delta extension,
polars and delta-rs (`deltalake`), on default mirrors (column mapping, deletion vectors) and on
portable ones (`--mirror-features portable`). What each engine does with a default mirror is
asserted as it is today (docs/lakehouse.md, "Which engines read the mirrors")."""

from __future__ import annotations

import glob
import os
from decimal import Decimal
from typing import Any

import psycopg2
import pytest

from spark_jobs.lake import delta_tables
from tests.integration.lakehouse import LakeCase, execute

ROWS = 300
Row = tuple[Any, ...]


def postgres_rows(dsn: str) -> set[Row]:
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        cur.execute("SELECT id, name, qty, price FROM engines")
        return set(cur.fetchall())


def duckdb_rows(path: str) -> set[Row]:
    import duckdb
    import duckdb_extension_delta

    # The extension as its PyPI package ships it: DuckDB would otherwise download it from its site.
    extension = os.path.join(
        os.path.dirname(duckdb_extension_delta.__file__),
        "extensions",
        f"v{duckdb.__version__}",
        "delta.duckdb_extension",
    )
    with duckdb.connect() as con:
        con.execute(f"LOAD '{extension}'")
        rows = con.execute(f"SELECT id, name, qty, price FROM delta_scan('{path}')").fetchall()
    return set(rows)


def polars_rows(path: str) -> set[Row]:
    import polars as pl

    return set(pl.read_delta(path).select("id", "name", "qty", "price").rows())


def deltalake_rows(path: str) -> set[Row]:
    from deltalake import DeltaTable

    table = DeltaTable(path).to_pyarrow_table(columns=["id", "name", "qty", "price"])
    return {tuple(row.values()) for row in table.to_pylist()}


def deltalake_sql_rows(path: str) -> set[Row]:
    """delta-rs' DataFusion reader (`QueryBuilder`), which goes through delta-kernel."""
    import pyarrow as pa
    from deltalake import DeltaTable, QueryBuilder

    batches = QueryBuilder().register("t", DeltaTable(path)).execute("SELECT id, name, qty, price FROM t")
    table = pa.table(batches.read_all())
    return {tuple(row.values()) for row in table.to_pylist()}


def protocol(path: str) -> tuple[int, int, set[str]]:
    from deltalake import DeltaTable

    p = DeltaTable(path).protocol()
    return p.min_reader_version, p.min_writer_version, set(p.reader_features or ())


def test_default_and_portable_mirrors_in_duckdb_polars_and_delta_rs(
    lake: LakeCase, monkeypatch: pytest.MonkeyPatch
) -> None:
    from deltalake.exceptions import DeltaProtocolError

    # Deletion vectors on every MERGE, as a mirror past 8 MiB has them: the readers must apply them.
    monkeypatch.setattr(delta_tables, "SMALL_TABLE_BYTES", 0)
    portable = LakeCase(
        lake.spark, lake.dsn, lake.bootstrap, lake.registry, lake.tmp / "portable", lake.prefix, lake.slot
    )
    portable.tmp.mkdir()
    execute(
        lake.dsn,
        "CREATE TABLE engines (id bigint PRIMARY KEY, name text, qty int, price numeric(10,2))",
        f"INSERT INTO engines SELECT g, 'n' || g, g % 7, g * 1.25 FROM generate_series(1, {ROWS}) g",
    )
    with lake.worker("avro", "engines") as worker:
        worker.wait_caught_up()
        lake.merge_all()
        portable.merge_all(history=True, mirror_features="portable")
        execute(
            lake.dsn,
            "UPDATE engines SET name = 'u' || id, qty = qty + 100 WHERE id % 5 = 0",
            "DELETE FROM engines WHERE id % 11 = 0",
            "INSERT INTO engines VALUES (1000, 'late', 1, 9.99)",
        )
        worker.wait_caught_up()
        lake.merge_all()
        portable.merge_all(history=True, mirror_features="portable")
        expected = postgres_rows(lake.dsn)

        default_path, portable_path = lake.path("engines"), portable.path("engines")
        assert glob.glob(f"{default_path}/deletion_vector_*.bin"), "the default mirror has no vectors"
        assert protocol(default_path) == (3, 7, {"columnMapping", "deletionVectors"})
        assert duckdb_rows(default_path) == expected
        assert deltalake_sql_rows(default_path) == expected
        # polars reads deletion vectors but not column mapping (polars 2.1).
        with pytest.raises(DeltaProtocolError, match="columnMapping"):
            polars_rows(default_path)
        # delta-rs' pyarrow/pandas reader refuses both features (deltalake 1.6).
        with pytest.raises(DeltaProtocolError, match="not yet supported"):
            deltalake_rows(default_path)

        history = portable.path("engines__history")
        tombstones = f"{portable.warehouse}/_bw_state/public/engines/tombstones"
        for path in (portable_path, history, tombstones):
            assert protocol(path) == (1, 2, set()), path
        assert duckdb_rows(portable_path) == expected
        assert polars_rows(portable_path) == expected
        assert deltalake_rows(portable_path) == expected

        # A type widened in Postgres: the portable mirror is rewritten, still readable by all.
        execute(
            lake.dsn,
            "ALTER TABLE engines ALTER COLUMN qty TYPE bigint",
            "UPDATE engines SET qty = 5000000000 WHERE id = 1",
        )
        worker.wait_caught_up()
        portable.merge_all(history=True, mirror_features="portable")
    expected = postgres_rows(lake.dsn)
    assert (1, "n1", 5_000_000_000, Decimal("1.25")) in expected
    assert protocol(portable_path) == (1, 2, set())
    assert deltalake_rows(portable_path) == expected
    assert polars_rows(portable_path) == expected
