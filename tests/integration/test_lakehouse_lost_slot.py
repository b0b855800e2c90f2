"""The lost-slot rebuild (docs/orchestration.md, "Rebuilding after a lost slot") on a lake that keeps
the changelog, then a topic recreated outside the runbook.

The pipeline first as a new user runs it: the merge's command line given no lake flag keeps the
changelog. Then the runbook's steps as an operator runs them: the worker stopped, `bottledwater
rebuild --confirm` (the slot dropped, the topics deleted), rows updated and deleted meanwhile (changes
no stream carries), the reset_delta job, the worker started again (a new snapshot into topics that
start over at offset 0), the continuous merge. After it the mirror equals Postgres; after more changes
merged with the mirror left behind, a read through the changelog's tail equals Postgres, and so does
a mirror rebuilt from the changelog. Before the fix, the changelog kept the old topics' records and a
read through it took each `(topic, partition, offset)` once: deleted rows came back and new changes
were missing. Last, a topic deleted and recreated under its name by hand is refused by the merge, in
one line, before anything of it reaches the lake.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from dataclasses import replace

import dagster as dg
import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from psycopg2 import sql

from orchestration.jobs import reset_delta_job
from orchestration.resources import DeltaWarehouseResource, PostgresResource, SparkResource
from spark_jobs.lake import changelog, delta_tables
from spark_jobs.merge_options import MergeOptions
from spark_jobs.reading.consistent import read_consistent
from spark_jobs.rebuild import rebuild
from spark_jobs.rules import layout
from spark_jobs.rules.topic_identity import TopicRecreated
from tests.integration.conftest import unique_name
from tests.integration.lakehouse import (
    PROJECT_ROOT,
    WORKER,
    LakeCase,
    assert_delta_equals_postgres,
    assert_same_rows,
    continuous_merge,
    execute,
    postgres_frame,
    running_worker,
)
from tests.integration.test_lakehouse_changelog_reads import _newest_changelog_lsn, _prove

ROWS = 300
CONTINUOUS_TRIGGER_S = 1.0
CONTINUOUS_TIMEOUT_S = 120.0


def _changes(lake: LakeCase, table: str, round_: int) -> None:
    """Updates, deletes and inserts: the kinds a stale changelog got wrong."""
    t = sql.Identifier(table)
    execute(
        lake.dsn,
        (sql.SQL("UPDATE {} SET note = %s WHERE id %% 7 = %s").format(t), (f"round {round_}", round_)),
        (sql.SQL("DELETE FROM {} WHERE id %% 11 = %s").format(t), (round_,)),
        (
            sql.SQL("INSERT INTO {} SELECT g, %s FROM generate_series(%s, %s) g").format(t),
            (f"new in round {round_}", 1000 * round_, 1000 * round_ + 20),
        ),
    )


def _merge_as_a_new_user_would(lake: LakeCase) -> None:
    """`python -m spark_jobs.merge` with the addresses and the tables, and no lake flag at all."""
    args = [
        sys.executable, "-m", "spark_jobs.merge", "-b", lake.bootstrap, "-r", lake.registry,
        "-p", lake.prefix, "--warehouse", lake.warehouse, "--checkpoints", lake.checkpoints,
        "--topic-pattern", re.escape(lake.prefix) + r"\..*",
    ]  # fmt: skip
    done = subprocess.run(args, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def _bottledwater_rebuild(lake: LakeCase, table: str) -> None:
    """Runbook step 2, the worker's own command: the slot dropped and the topics deleted."""
    args = [
        *WORKER, "-d", lake.dsn, "-s", lake.slot, "-b", lake.bootstrap, "-r", lake.registry,
        "-p", lake.prefix, "--tables", f"public.{table}", "rebuild", "--confirm", lake.slot,
    ]  # fmt: skip
    done = subprocess.run(args, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"deleted topic {lake.topic(table)}" in done.stdout, done.stdout


def _reset_delta(lake: LakeCase, table: str) -> None:
    """Runbook step 3, the Dagster job, on the test's warehouse. The merges after it run in this
    process's Spark session, whose Delta log cache still knows the deleted tables: a merge after a
    reset is a new process in production (a Dagster run), so the cache is cleared as one would be."""
    result = reset_delta_job([dg.AssetKey(["delta", "public", table])]).execute_in_process(
        run_config={"ops": {"reset_delta_tables": {"config": {"confirm": lake.slot}}}},
        resources={
            "postgres": PostgresResource(dsn=lake.dsn, slot=lake.slot),
            "warehouse": DeltaWarehouseResource(root=lake.warehouse, checkpoint_root=lake.checkpoints),
            "spark": SparkResource(),
        },
    )
    assert result.success
    assert not delta_tables.table_exists(lake.spark, layout.changelog_path(lake.warehouse))
    lake.spark._jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()  # type: ignore[union-attr]


def _recreate_topic(bootstrap: str, topic: str) -> None:
    """The topic deleted and created again by hand, with the same partitions: offsets start at 0."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    partitions = len(admin.list_topics(topic, timeout=30).topics[topic].partitions)
    admin.delete_topics([topic])[topic].result(timeout=30)
    deadline = time.monotonic() + 60
    while True:
        try:
            admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(timeout=30)
            return
        except Exception:  # the deletion still under way ("marked for deletion"): try again
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def test_the_lost_slot_rebuild_with_the_changelog_then_a_topic_recreated_by_hand(lake: LakeCase) -> None:
    table = unique_name("people")
    t = sql.Identifier(table)
    execute(
        lake.dsn,
        sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, note text)").format(t),
        (sql.SQL("INSERT INTO {} SELECT g, 'first' FROM generate_series(1, %s) g").format(t), (ROWS,)),
    )
    options = MergeOptions(lake.warehouse, "avro", lake.registry, lake.prefix)
    with running_worker(lake, fmt="avro", tables=f"public.{table}") as worker:
        worker.wait_caught_up()
        _changes(lake, table, 1)
        worker.wait_caught_up()
        _merge_as_a_new_user_would(lake)
    # Given no lake flags, the merge kept the changelog, and caught the mirror up before it ended.
    assert changelog.newest(lake.spark, lake.warehouse) is not None
    assert_delta_equals_postgres(lake.spark, lake.path(table), lake.dsn, table)

    # The runbook, the worker stopped: the slot and topics gone, changes no stream carries, the reset.
    _bottledwater_rebuild(lake, table)
    _changes(lake, table, 2)
    _reset_delta(lake, table)

    with running_worker(lake, fmt="avro", tables=f"public.{table}") as worker:
        worker.wait_caught_up()
        # The continuous merge, as Dagster's supervisor starts it again after the reset.
        keeping = replace(options, changelog=True)
        with continuous_merge(lake, keeping, [lake.topic(table)], CONTINUOUS_TRIGGER_S) as merge:
            deadline = time.monotonic() + CONTINUOUS_TIMEOUT_S
            while True:
                assert merge.running(), merge.failure
                try:
                    if delta_tables.table_exists(lake.spark, lake.path(table)):
                        assert_delta_equals_postgres(lake.spark, lake.path(table), lake.dsn, table)
                        break
                except AssertionError:
                    if time.monotonic() > deadline:
                        raise
                assert time.monotonic() < deadline, "the continuous merge made no mirror"
                time.sleep(CONTINUOUS_TRIGGER_S)
        assert not merge.failure, merge.failure

        # More changes, merged into the changelog with the mirror left behind.
        _changes(lake, table, 3)
        worker.wait_caught_up()
        behind: dict[str, object] = {"mirror_budget_s": 0.0, "catch_up": False}
        runs = lake.merge_all(changelog=True, **behind)
        assert runs[table].deferred, runs
        _prove(lake, _newest_changelog_lsn(lake), **behind)

    qualified = f"public.{table}"
    fresh = read_consistent(lake.spark, lake.warehouse, [qualified], tail_from=options)
    assert fresh.tables[qualified].tail_after is not None
    frame = fresh.frame(qualified).drop(*layout.META_COLUMNS)
    assert_same_rows(frame, postgres_frame(lake.spark, lake.dsn, table, frame))
    rebuilt = rebuild(lake.spark, options, qualified)
    assert rebuilt.messages > 0
    assert_delta_equals_postgres(lake.spark, lake.path(table), lake.dsn, table)

    # A topic deleted and created again outside the runbook: refused at the merge's start, in one
    # line that names it; the changelog gets nothing of it.
    version = delta_tables.newest_version(lake.spark, layout.changelog_path(lake.warehouse))
    recorded = changelog.newest(lake.spark, lake.warehouse)
    assert recorded is not None and lake.topic(table) in recorded.topic_ids
    _recreate_topic(lake.bootstrap, lake.topic(table))
    with pytest.raises(TopicRecreated, match=f"topic {lake.topic(table)} was deleted and created again"):
        lake.merge_all(changelog=True)
    assert delta_tables.newest_version(lake.spark, layout.changelog_path(lake.warehouse)) == version
