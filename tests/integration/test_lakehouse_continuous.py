"""The continuous merge (`--continuous`): long-running queries with a processing-time trigger keep the
mirror equal to Postgres while the worker streams, and a stop ends them at a batch boundary."""

from __future__ import annotations

import threading
import time

from psycopg2 import sql

from spark_jobs.merge_options import MergeOptions
from tests.integration.conftest import unique_name
from tests.integration.lakehouse import LakeCase, assert_delta_equals_postgres, continuous_merge, execute

TRIGGER_S = 2.0
CATCH_UP_TIMEOUT_S = 180.0


def wait_for_rows(lake: LakeCase, path: str, expected: int, runner: threading.Thread) -> None:
    """Until the mirror holds `expected` rows; fails if the merge thread died."""
    from delta.tables import DeltaTable

    deadline = time.monotonic() + CATCH_UP_TIMEOUT_S
    while time.monotonic() < deadline:
        assert runner.is_alive(), "the continuous merge stopped by itself"
        if (
            DeltaTable.isDeltaTable(lake.spark, path)
            and lake.spark.read.format("delta").load(path).count() == expected
        ):
            return
        time.sleep(1)
    raise AssertionError(f"the mirror never reached {expected} rows")


def test_continuous_merge_follows_the_stream_and_stops_cleanly(lake: LakeCase) -> None:
    name = unique_name("live")
    table = sql.Identifier(name)
    execute(
        lake.dsn,
        sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, note text)").format(table),
        sql.SQL("INSERT INTO {} SELECT i, 'n' || i FROM generate_series(1, 10) AS i").format(table),
    )
    options = MergeOptions(lake.warehouse, "avro", lake.registry, lake.prefix)
    with lake.worker("avro", name) as worker:
        worker.wait_caught_up()
        with continuous_merge(lake, options, [lake.topic(name)], TRIGGER_S) as merge:
            runner = merge.thread
            wait_for_rows(lake, lake.path(name), 10, runner)
            # Changes made while the queries run reach the lake without another job run.
            execute(
                lake.dsn,
                sql.SQL("INSERT INTO {} SELECT i, 'n' || i FROM generate_series(11, 15) AS i").format(table),
                sql.SQL("UPDATE {} SET note = 'changed' WHERE id <= 3").format(table),
                sql.SQL("DELETE FROM {} WHERE id = 4").format(table),
            )
            worker.wait_caught_up()
            wait_for_rows(lake, lake.path(name), 14, runner)
            changed = lake.spark.read.format("delta").load(lake.path(name)).where("note = 'changed'").count()
            deadline = time.monotonic() + CATCH_UP_TIMEOUT_S
            while changed != 3 and time.monotonic() < deadline:
                time.sleep(1)
                changed = (
                    lake.spark.read.format("delta").load(lake.path(name)).where("note = 'changed'").count()
                )
    assert not runner.is_alive(), "the continuous merge did not stop"
    assert not merge.failure, merge.failure
    assert_delta_equals_postgres(lake.spark, lake.path(name), lake.dsn, name)
    assert not [q for q in lake.spark.streams.active if q.name and name in q.name]
