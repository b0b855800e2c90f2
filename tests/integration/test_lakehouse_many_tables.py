"""One merge query for many tables (spark_jobs.merging.merge_query): every table equals Postgres after a
multi-table workload, a failing table is parked while the others merge and catches up once fixed,
and a deployment of per-table checkpoints resumes where they left off."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from psycopg2 import sql

from kafka_contract.topics import control_topic_name
from spark_jobs.connections.kafka_source import KafkaSource, stream_reader
from spark_jobs.lake import changelog as changelog_io
from spark_jobs.lake import delta_tables, local_log, watermark_io
from spark_jobs.lake.mirror_versions import lake_watermark
from spark_jobs.merge_options import MergeOptions
from spark_jobs.merging.merge_batch import TableMerger
from spark_jobs.merging.parked import parked_path
from spark_jobs.merging.query_checkpoint import query_checkpoint
from spark_jobs.rules import layout
from spark_jobs.rules.watermark import START, Mark
from tests.integration.conftest import unique_name
from tests.integration.lakehouse import (
    PROJECT_ROOT,
    LakeCase,
    assert_delta_equals_postgres,
    execute,
    running_worker,
)
from tests.integration.orchestration_harness import stop_group
from tests.integration.watermark_checks import Committed, assert_never_back, claimed, commit_transaction

# Six tables in each format, one of each kind of change `_touch_all` makes: each table costs about
# 4 s of mirror creation and comparison here, a suite-time matter. How the merge's cost grows with
# hundreds of tables is the benchmarks' (bench/many_tables_bench.py).
TABLES = {"avro": 6, "json": 6}


def _create(lake: LakeCase, names: list[str], rows: int = 3) -> None:
    for name in names:
        t = sql.Identifier(name)
        execute(
            lake.dsn,
            sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, v text, n int)").format(t),
            (
                sql.SQL("INSERT INTO {} SELECT g, 'row ' || g, g FROM generate_series(1, %s) g").format(t),
                (rows,),
            ),
        )


def _touch_all(lake: LakeCase, names: list[str], round_: int) -> None:
    """One transaction touching every table: inserts everywhere, and by table an update, a key
    change, a delete, a TRUNCATE, an ADD COLUMN."""
    statements: list[object] = []
    for i, name in enumerate(names):
        t = sql.Identifier(name)
        base = 1000 * round_
        statements.append(
            (sql.SQL("INSERT INTO {} VALUES (%s, 'new', %s), (%s, 'new', %s)").format(t),
             (base + 1, round_, base + 2, round_))
        )  # fmt: skip
        kind = i % 6
        if kind == 0:
            statements.append((sql.SQL("UPDATE {} SET v = %s, n = n + 1").format(t), (f"updated {round_}",)))
        elif kind == 1:
            statements.append((sql.SQL("UPDATE {} SET id = id + 500 WHERE id = 1").format(t), ()))
        elif kind == 2:
            statements.append((sql.SQL("DELETE FROM {} WHERE id = 2").format(t), ()))
        elif kind == 3 and round_ == 1:
            statements.append(sql.SQL("TRUNCATE {}").format(t))
            statements.append(sql.SQL("INSERT INTO {} VALUES (7, 'after truncate', 7)").format(t))
        elif kind == 4 and round_ == 1:
            statements.append(sql.SQL("ALTER TABLE {} ADD COLUMN extra text").format(t))
            statements.append(sql.SQL("UPDATE {} SET extra = 'added' WHERE id = 3").format(t))
    execute(lake.dsn, *statements)


@pytest.mark.parametrize("fmt", ["avro", "json"])
def test_many_tables_merged_by_one_query_equal_postgres(lake: LakeCase, fmt: str) -> None:
    names = [f"{unique_name('t')}_{i}" for i in range(TABLES[fmt])]
    _create(lake, names)
    with running_worker(lake, fmt=fmt, tables="public.*", partitions=1) as worker:
        worker.wait_caught_up()
        first = lake.merge_all(fmt)
        assert sorted(first) == sorted(names), sorted(set(first) ^ set(names))
        assert not [r.error for r in first.values() if r.error]
        _touch_all(lake, names, 1)
        _touch_all(lake, names, 2)
        worker.wait_caught_up(timeout=300)
    runs = lake.merge_all(fmt)
    assert not [r.error for r in runs.values() if r.error]
    assert all(runs[n].messages for n in names), "a table merged nothing in the second run"
    # One query, one checkpoint: no table has its own.
    assert (lake.tmp / "checkpoints" / "_bw_merge" / "commits").is_dir()
    assert not (lake.tmp / "checkpoints" / "public").exists()
    for name in names:
        assert_delta_equals_postgres(lake.spark, lake.path(name), lake.dsn, name)


def _set_key_property(lake: LakeCase, name: str, keys: tuple[str, ...]) -> None:
    lake.spark.sql(
        f"ALTER TABLE delta.`{lake.path(name)}` SET TBLPROPERTIES "
        f"('{layout.KEY_PROPERTY}' = '{layout.encode_key_columns(keys)}')"
    )


def _parked_topics(lake: LakeCase) -> set[str]:
    path = parked_path(lake.warehouse)
    if not delta_tables.table_exists(lake.spark, path):
        return set()
    return {r["topic"] for r in lake.spark.read.format("delta").load(path).select("topic").collect()}


def test_a_failing_table_is_parked_the_others_merge_and_it_catches_up_once_fixed(lake: LakeCase) -> None:
    names = [unique_name("ok"), unique_name("ok"), unique_name("broken")]
    broken = names[2]
    _create(lake, names)
    with running_worker(lake, fmt="avro", tables="public.*", partitions=2) as worker:
        worker.wait_caught_up()
        lake.merge_all()
        # A fault the merge refuses (its key is not the mirror's): as an unsupported type change would.
        _set_key_property(lake, broken, ("nope",))
        _touch_all(lake, names, 1)
        worker.wait_caught_up()
        runs = lake.merge_all()
        assert runs[broken].error and "the key is now" in runs[broken].error, runs[broken]
        for name in names[:2]:
            assert runs[name].error is None, runs[name].error
            assert_delta_equals_postgres(lake.spark, lake.path(name), lake.dsn, name)
        assert _parked_topics(lake) == {lake.topic(broken)}

        _touch_all(lake, names, 2)  # more changes behind the parked ones
        worker.wait_caught_up()
        runs = lake.merge_all()
        assert runs[broken].error, "the table merged although still broken"
        for name in names[:2]:
            assert_delta_equals_postgres(lake.spark, lake.path(name), lake.dsn, name)

    _set_key_property(lake, broken, ("id",))  # the operator's fix
    runs = lake.merge_all()
    assert not [r.error for r in runs.values() if r.error]
    assert runs[broken].messages, "the parked changes were not replayed"
    assert _parked_topics(lake) == set()
    for name in names:
        assert_delta_equals_postgres(lake.spark, lake.path(name), lake.dsn, name)


def _legacy_merge(lake: LakeCase, name: str) -> None:
    """What the merge was before the one query: a query per table, its checkpoint under
    <checkpoints>/<schema>/<table>."""
    topic = lake.topic(name)
    options = MergeOptions(lake.warehouse, "avro", lake.registry, lake.prefix)
    location = layout.location_for_topic(topic, lake.prefix)
    merger = TableMerger(location, options)
    control = control_topic_name(lake.prefix)
    pattern = f"^({re.escape(topic)}|{re.escape(control)})$"
    query = (
        stream_reader(lake.spark, KafkaSource(lake.bootstrap), pattern, "earliest")
        .load()
        .writeStream.option("checkpointLocation", location.checkpoint(lake.checkpoints))
        .trigger(availableNow=True)
        .foreachBatch(merger)
        .start()
    )
    merger.bind(str(query.id))
    query.awaitTermination()


def test_per_table_checkpoints_are_resumed_not_merged_again(lake: LakeCase) -> None:
    old, new = unique_name("legacy"), unique_name("fresh")
    _create(lake, [old], rows=50)
    _create(lake, [new], rows=5)
    with running_worker(lake, fmt="avro", tables="public.*", partitions=2) as worker:
        worker.wait_caught_up()
        _legacy_merge(lake, old)  # the other table has no checkpoint of its own
        execute(lake.dsn, sql.SQL("UPDATE {} SET n = n + 1 WHERE id <= 4").format(sql.Identifier(old)))
        worker.wait_caught_up()
    assert not (lake.tmp / "checkpoints" / "_bw_merge").exists()
    runs = lake.merge_all()
    # The legacy table resumes after its last committed batch: only the four updates are read.
    assert runs[old].messages == 4, runs[old].batches
    assert runs[new].messages == 5, runs[new].batches  # no checkpoint of its own: its snapshot
    assert (lake.tmp / "checkpoints" / "_bw_merge" / "commits").is_dir()
    assert query_checkpoint(lake.checkpoints).endswith("_bw_merge")
    for name in (old, new):
        assert_delta_equals_postgres(lake.spark, lake.path(name), lake.dsn, name)


# Enough for a kill to land between two tables' commits (the merge commits them one by one): it
# lands after the first table's, leaving two behind; each table costs three merges and a comparison,
# about 15 s of the test here.
KILL_TABLES = 3
KILL_ROWS = 3000
KILL_ATTEMPTS = 3
MERGE_TIMEOUT_S = 300
# The worker publishes progress each second while its position moves: let one go out after a catch-up.
PROGRESS_WAIT_S = 3.0


def _newest_versions(lake: LakeCase, names: list[str]) -> dict[str, int]:
    return {name: max(local_log.commit_versions(lake.path(name)) or [-1]) for name in names}


def _kill_between_tables(
    lake: LakeCase, names: list[str], log_path: Path, *, changelog: bool
) -> tuple[set[str], set[str]] | None:
    """Runs the merge (one thread: the tables commit one after the other) and SIGKILLs it once some
    tables committed the batch and others not yet. (committed, not committed), or None when the run
    ended first. `changelog`: the merge appends to the lake's changelog first and merges every
    mirror behind it (no budget: each at the run's catch-up), so the kill lands between the
    changelog's commit and the mirrors' MERGEs."""
    before = _newest_versions(lake, names)
    command = [
        sys.executable, "-m", "spark_jobs.merge", "-b", lake.bootstrap, "-r", lake.registry, "-f", "avro",
        "-p", lake.prefix, "--warehouse", lake.warehouse, "--checkpoints", lake.checkpoints,
        "--topic-pattern", re.escape(lake.prefix) + r"\..*", "--merge-threads", "1",
    ]  # fmt: skip
    command += ["--changelog", "--mirror-budget", "0"] if changelog else ["--no-changelog"]
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}
    with log_path.open("ab") as log:
        merge = subprocess.Popen(
            command, cwd=PROJECT_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + MERGE_TIMEOUT_S
        while merge.poll() is None:
            assert time.monotonic() < deadline, f"the merge did not finish in {MERGE_TIMEOUT_S}s"
            now = _newest_versions(lake, names)
            if any(now[n] > before[n] for n in names):
                os.killpg(merge.pid, signal.SIGKILL)
                merge.wait(30)
                after = _newest_versions(lake, names)
                committed = {n for n in names if after[n] > before[n]}
                return (committed, set(names) - committed) if committed != set(names) else None
            time.sleep(0.02)
        assert merge.returncode == 0, log_path.read_text(errors="replace")[-4000:]
        return None
    finally:
        stop_group(merge, timeout=30)


@pytest.mark.parametrize("changelog", [False, True], ids=["mirrors", "behind_the_changelog"])
def test_one_query_killed_between_two_tables_commits_then_replayed_equals_postgres(
    lake: LakeCase, changelog: bool
) -> None:
    names = [f"{unique_name('k')}_{i}" for i in range(KILL_TABLES)]
    _create(lake, names, rows=KILL_ROWS)
    window = None
    rounds: list[Committed] = []
    with running_worker(lake, fmt="avro", tables="public.*", partitions=1) as worker:
        worker.wait_caught_up()
        lake.merge_all(changelog=changelog)
        initial = _newest_versions(lake, names)
        older = lake.tmp / "older-checkpoint"
        shutil.copytree(query_checkpoint(lake.checkpoints), older)
        marks: dict[str, list[Mark]] = {
            n: [watermark_io.stored_mark(lake.spark, lake.path(n))] for n in names
        }
        commons = [_common(lake, names)]
        for attempt in range(KILL_ATTEMPTS):
            # One transaction over every table: a watermark past its commit claims it in all of them.
            rounds.append(
                commit_transaction(
                    lake.dsn,
                    *(
                        stmt
                        for t in map(sql.Identifier, names)
                        for stmt in (
                            (sql.SQL("UPDATE {} SET n = n + %s, v = md5(v) WHERE id %% 2 = %s").format(t),
                             (attempt + 1, attempt % 2)),
                            (sql.SQL("DELETE FROM {} WHERE id %% 11 = %s").format(t), (attempt,)),
                        )
                    ),
                )
            )  # fmt: skip
            worker.wait_caught_up()
            time.sleep(PROGRESS_WAIT_S)  # a progress event past the round, for the merge to prove
            window = _kill_between_tables(lake, names, lake.tmp / f"merge-{attempt}.log", changelog=changelog)
            if window is not None:
                break
    assert window is not None, (
        f"the kill never landed between two tables' commits in {KILL_ATTEMPTS} attempts"
    )
    committed, pending = window
    assert committed and pending, window
    if changelog:
        # The kill came after the changelog's commit: the lake held the round, whole, before any
        # of the pending mirrors did.
        head = changelog_io.newest(lake.spark, lake.warehouse)
        assert head is not None and head.watermark >= rounds[-1].commit_lsn, (head, rounds[-1])
    for name in names:
        marks[name].append(watermark_io.stored_mark(lake.spark, lake.path(name)))
    commons.append(_common(lake, names))

    # An older checkpoint put back: the replay reaches past commits some tables already hold.
    shutil.rmtree(query_checkpoint(lake.checkpoints))
    shutil.copytree(older, query_checkpoint(lake.checkpoints))
    runs = lake.merge_all(changelog=changelog)
    assert not [r.error for r in runs.values() if r.error]
    for name in names:
        assert_delta_equals_postgres(lake.spark, lake.path(name), lake.dsn, name)
        delta = lake.spark.read.format("delta").load(lake.path(name))
        assert delta.count() == delta.select("id").distinct().count(), f"{name}: a key held twice"
        marks[name].append(watermark_io.stored_mark(lake.spark, lake.path(name)))
    commons.append(_common(lake, names))
    _assert_watermarks_true(lake, names, marks=marks, commons=commons, rounds=rounds, initial=initial)
    print(f"killed with {sorted(committed)} committed and {sorted(pending)} not; common watermarks {commons}")


def _common(lake: LakeCase, names: list[str]) -> int:
    common = lake_watermark(lake.spark, lake.warehouse, [f"public.{n}" for n in names])["common_watermark"]
    return int(common or START.watermark)


def _assert_watermarks_true(
    lake: LakeCase,
    names: list[str],
    *,
    marks: dict[str, list[Mark]],
    commons: list[int],
    rounds: list[Committed],
    initial: dict[str, int],
) -> None:
    """Through the kill, the restored checkpoint and the replay: no watermark went back (the table
    property before, after the kill and after the replay; every commit's mark; the common one), and
    every version holds every round its watermark claims, by Postgres's commit LSNs: none of the rows
    the round deleted, none of those it updated older than its commit."""

    assert commons == sorted(commons), f"the common watermark went back: {commons}"
    assert commons[-1] >= rounds[-1].commit_lsn, (
        f"the replay proved no position past the last round ({commons} < {rounds[-1].commit_lsn}): "
        "nothing was checked"
    )
    for number, name in enumerate(names):
        assert_never_back(marks[name], f"{name}'s property")
        versions = watermark_io.marked_versions(lake.spark, lake.path(name))
        assert_never_back([v.mark for v in versions], f"{name}'s commits")
        for version, claims in claimed(versions, rounds):
            misses = _misses(lake, name, version.version, claims, rounds)
            assert not any(misses), (
                f"{name} v{version.version} {version.mark} claims rounds {claims} "
                f"({[rounds[r].commit_lsn for r in claims]}) but lacks some: {misses}"
            )
        if number == 0:  # the check can fail: the version from before the rounds lacks every one
            assert all(_misses(lake, name, initial[name], list(range(len(rounds))), rounds))


def _misses(lake: LakeCase, name: str, version: int, claims: list[int], rounds: list[Committed]) -> list[int]:
    """Per round, the rows of the version that show it is not applied: rows it deleted, rows it
    updated that are older than its commit."""
    from pyspark.sql import functions as F

    frame = lake.spark.read.format("delta").option("versionAsOf", version).load(lake.path(name))
    lsn, key = F.col(layout.LSN), F.col("id")
    row = frame.agg(
        *(
            F.sum(((key % 11 == r) | ((key % 2 == r % 2) & (lsn < rounds[r].commit_lsn))).cast("int"))
            for r in claims
        )
    ).head()
    assert row is not None
    return [int(v or 0) for v in row]
