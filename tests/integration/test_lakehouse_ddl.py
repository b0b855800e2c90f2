"""DDL events in the merge (`--capture-ddl`): an ADD COLUMN reaches the Delta table before any row
has the column; RENAME COLUMN, ALTER TYPE, RENAME TABLE and DROP TABLE are recorded in the table's
DDL log once, however often the merge runs."""

from __future__ import annotations

import pytest
from psycopg2 import sql

from spark_jobs.merging import ddl
from spark_jobs.rules import layout
from tests.integration.conftest import unique_name
from tests.integration.lakehouse import LakeCase, assert_delta_equals_postgres, execute, running_worker


@pytest.mark.parametrize("fmt", ["avro", "json"])
def test_ddl_reaches_the_delta_table_and_its_log(lake: LakeCase, fmt: str) -> None:
    name = unique_name("orders")
    table, dropped = sql.Identifier(name), sql.Identifier(name + "_old")
    execute(
        lake.dsn,
        sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, qty int)").format(table),
        sql.SQL("INSERT INTO {} VALUES (1, 10), (2, 20)").format(table),
        sql.SQL("CREATE TABLE {} (id int PRIMARY KEY)").format(dropped),
        sql.SQL("INSERT INTO {} VALUES (1)").format(dropped),
    )
    location = layout.TableLocation(lake.topic(name), "public", name)
    with running_worker(lake, fmt=fmt, tables=f"public.{name}*", extra_args=["--capture-ddl"]) as worker:
        worker.wait_caught_up()
        lake.merge(name, fmt)
        execute(
            lake.dsn,
            sql.SQL("ALTER TABLE {} ADD COLUMN price numeric(10,2), ADD COLUMN note text").format(table),
        )
        worker.wait_caught_up()
        # No row carries the new columns yet: the DDL event alone adds them.
        run = lake.merge(name, fmt)
        fields = {
            f.name: f.dataType.simpleString() for f in lake.spark.read.format("delta").load(run.path).schema
        }
        assert fields["price"] == "decimal(10,2)" and fields["note"] == "string"
        execute(
            lake.dsn,
            sql.SQL("UPDATE {} SET price = 1.50, note = 'x' WHERE id = 1").format(table),
            sql.SQL("ALTER TABLE {} RENAME COLUMN note TO remark").format(table),
            sql.SQL("ALTER TABLE {} ALTER COLUMN qty TYPE bigint").format(table),
        )
        worker.wait_caught_up()
        lake.merge(name, fmt)
        execute(lake.dsn, sql.SQL("ALTER TABLE {} RENAME TO {}").format(table, sql.Identifier(name + "_v2")))
        execute(lake.dsn, sql.SQL("DROP TABLE {}").format(dropped))
        worker.wait_caught_up()
        lake.merge(name, fmt)
        lake.merge(name + "_old", fmt)
    lake.merge(name, fmt)  # nothing new: nothing logged twice
    entries = ddl.read_log(lake.spark, lake.warehouse, location)
    assert [(e["command"], e["object_type"], e["renamed_to"]) for e in entries] == [
        ("ALTER TABLE", "table", None),
        ("ALTER TABLE", "table column", None),
        ("ALTER TABLE", "table", None),
        ("ALTER TABLE", "table", f"public.{name}_v2"),
    ]
    assert "RENAME COLUMN note TO remark" in entries[1]["statement"]
    assert "TYPE bigint" in entries[2]["statement"]
    positions = [(e[layout.LSN], e[layout.SEQ]) for e in entries]
    assert positions == sorted(set(positions))
    old = ddl.read_log(
        lake.spark, lake.warehouse, layout.TableLocation(lake.topic(name + "_old"), "public", name + "_old")
    )
    assert [(e["command"], e["object_identity"], e["columns"]) for e in old] == [
        ("DROP TABLE", f"public.{name}_old", "[]")
    ]
    # The mirror of the dropped table keeps its rows: the log says it was dropped.
    assert lake.spark.read.format("delta").load(lake.path(name + "_old")).count() == 1


def test_the_rows_still_equal_postgres_after_ddl(lake: LakeCase) -> None:
    name = unique_name("items")
    table = sql.Identifier(name)
    execute(lake.dsn, sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, v text)").format(table))
    with running_worker(lake, fmt="avro", tables=f"public.{name}", extra_args=["--capture-ddl"]) as worker:
        worker.wait_caught_up()
        execute(
            lake.dsn,
            sql.SQL("INSERT INTO {} SELECT g, 'v' || g FROM generate_series(1, 5) g").format(table),
            sql.SQL("ALTER TABLE {} ADD COLUMN w int").format(table),
            sql.SQL("UPDATE {} SET w = id * 2 WHERE id <= 3").format(table),
        )
        worker.wait_caught_up()
    run = lake.merge(name)
    assert_delta_equals_postgres(lake.spark, run.path, lake.dsn, name)
