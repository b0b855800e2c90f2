"""Postgres -> the real worker -> Kafka -> the merge job -> Delta, compared with Postgres."""

from __future__ import annotations

import pytest
from psycopg2 import sql

from spark_jobs.rules import layout
from tests.integration.conftest import unique_name
from tests.integration.lakehouse import LakeCase, assert_delta_equals_postgres, execute, running_worker

CREATE = (
    "CREATE TABLE {} (id int PRIMARY KEY, name text, amount numeric(10,2), seen timestamptz, "
    "local timestamp, day date, flag boolean, payload bytea, score double precision, tags text[])"
)


def _insert(table: sql.Identifier, first: int, count: int) -> tuple[sql.Composed, tuple[int, int]]:
    return (
        sql.SQL(
            "INSERT INTO {} SELECT i, 'name ' || i, i * 1.25, "
            "timestamptz '2024-01-01 00:00:00+00' + i * interval '1 minute', "
            "timestamp '2024-02-03 04:05:06.789' + i * interval '1 second', date '2024-01-01' + i, "
            "i %% 2 = 0, decode(lpad(to_hex(i), 8, '0'), 'hex'), i / 3.0, ARRAY['a' || i, NULL] "
            "FROM generate_series(%s, %s) AS i"
        ).format(table),
        (first, first + count - 1),
    )


@pytest.mark.parametrize("fmt", ["avro", "json"])
def test_snapshot_and_stream_end_equal_to_postgres(lake: LakeCase, fmt: str) -> None:
    name = unique_name("people")
    table = sql.Identifier(name)
    execute(lake.dsn, sql.SQL(CREATE).format(table), _insert(table, 1, 20))
    with lake.worker(fmt, name) as worker:
        worker.wait_caught_up()
        execute(
            lake.dsn,
            _insert(table, 21, 10),
            sql.SQL("UPDATE {} SET name = name || ' v2', amount = amount + 1 WHERE id % 3 = 0").format(table),
            sql.SQL("DELETE FROM {} WHERE id % 5 = 0").format(table),
            sql.SQL("UPDATE {} SET name = NULL, tags = NULL WHERE id = 7").format(table),
            sql.SQL("DELETE FROM {} WHERE id = 8").format(table),
            _insert(table, 8, 1),  # a key deleted and inserted again
        )
        worker.wait_caught_up()
    run = lake.merge(name, fmt)
    assert run.messages > 30
    assert_delta_equals_postgres(lake.spark, run.path, lake.dsn, name)
    assert run.path == lake.path(name)
    meta = lake.spark.read.format("delta").load(run.path).select(*layout.META_COLUMNS).schema.simpleString()
    assert meta == "struct<_bw_lsn:bigint,_bw_seq:bigint,_bw_op:string,_bw_commit_ts:timestamp>"


def test_an_unkeyed_table_mirrors_its_events_once_each(lake: LakeCase) -> None:
    """No key, no row identity: the mirror keeps each published event (inserts here) exactly once,
    however often the changelog is merged again."""
    import shutil

    name = unique_name("views")
    table = sql.Identifier(name)
    insert = sql.SQL("INSERT INTO {} SELECT '/page/' || i, i FROM generate_series(%s, %s) AS i").format(table)
    execute(lake.dsn, sql.SQL("CREATE TABLE {} (path text, n int)").format(table), (insert, (1, 5)))
    with running_worker(lake, fmt="avro", tables=f"public.{name}", extra_args=["--allow-unkeyed"]) as worker:
        worker.wait_caught_up()
        execute(lake.dsn, (insert, (6, 8)), (insert, (1, 1)))  # a duplicate row, as Postgres allows
        worker.wait_caught_up()
    run = lake.merge(name)
    assert run.error is None
    assert_delta_equals_postgres(lake.spark, run.path, lake.dsn, name)

    shutil.rmtree(lake.checkpoints)  # every event is read and merged again
    lake.merge(name)
    assert_delta_equals_postgres(lake.spark, run.path, lake.dsn, name)
