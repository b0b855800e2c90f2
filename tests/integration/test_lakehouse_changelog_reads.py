"""Mirrors merged behind the lake's changelog (`--mirror-budget`), and reads fresher than them: each
mirror's version plus its changelog tail (`changelog_tail`).

The differential case: with every mirror left behind, a consistent read through the changelog
after inserts, updates, a key change, a delete and its key re-inserted, an update leaving a TOASTed
value alone, a TRUNCATE and an ADD COLUMN equals Postgres. Then mirrors that waited the maximum lag
are merged from the changelog and equal Postgres and the earlier read, metadata columns included,
and a run's end catches them up. `read_consistent` through the changelog with a table parked behind it is in
test_lakehouse_changelog.py.
"""

from __future__ import annotations

import random
import threading
import time
from datetime import UTC, datetime

import psycopg2
import pytest
from psycopg2 import sql
from pyspark.sql import functions as F

from kafka_contract.topics import control_topic_name
from spark_jobs.lake import changelog, delta_tables
from spark_jobs.merge_options import MergeOptions
from spark_jobs.reading.consistent import NoCommonWatermark, read_consistent
from spark_jobs.rules import layout
from spark_jobs.rules.changelog_commit import ChangelogCommit
from tests.integration.conftest import unique_name
from tests.integration.lakehouse import (
    ContinuousMerge,
    LakeCase,
    assert_delta_equals_postgres,
    assert_same_rows,
    continuous_merge,
    execute,
    postgres_frame,
    running_worker,
)
from tests.integration.test_lakehouse_many_tables import _create, _parked_topics, _touch_all

# One of each kind `_touch_all` makes: update, key change, delete, TRUNCATE, ADD COLUMN, inserts only.
KINDS = 6
PROVE_ATTEMPTS = 6


def _toast_table(lake: LakeCase, name: str) -> None:
    t = sql.Identifier(name)
    execute(
        lake.dsn,
        sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, big text, n int)").format(t),
        # md5 text does not compress: stored out of line (TOASTed), so an update of n alone
        # publishes big as unchanged.
        sql.SQL(
            "INSERT INTO {} SELECT g, (SELECT string_agg(md5(g::text || i::text), '') "
            "FROM generate_series(1, 300) i), g FROM generate_series(1, 3) g"
        ).format(t),
    )


def _newest_lsn(lake: LakeCase, names: list[str]) -> int:
    """The newest change the mirrors hold: the position the changelog must prove to cover them all."""
    newest = 0
    for name in names:
        row = lake.spark.read.format("delta").load(lake.path(name)).agg(F.max(layout.LSN)).head()
        newest = max(newest, int(row[0] or 0) if row is not None else 0)
    return newest


# Avro in the suite; "json" passes too (the tail is decoded by the merge's own `TableMerger.decode`)
# and is left out for the suite's time (tests/README.md).
@pytest.mark.parametrize("fmt", ["avro"])
def test_mirrors_left_behind_the_changelog_read_fresh_through_their_tails_then_merge_from_it(
    lake: LakeCase, fmt: str
) -> None:
    names = [f"{unique_name('tail')}_{i}" for i in range(KINDS)]
    toast, quiet = unique_name("toast"), names[-1]
    _create(lake, names)
    _toast_table(lake, toast)
    tables = [*names, toast]
    qualified = [f"public.{n}" for n in tables]
    options = MergeOptions(
        lake.warehouse, fmt, lake.registry if fmt == "avro" else None, lake.prefix, postgres=lake.dsn
    )
    with running_worker(lake, fmt=fmt, tables="public.*", partitions=2) as worker:
        worker.wait_caught_up()
        # The snapshot's run, with no budget at all: a table without a mirror is merged all the same
        # (a read through the changelog starts from its mirror), so none waits.
        first = lake.merge_all(fmt, changelog=True, mirror_budget_s=0.0, catch_up=False)
        assert not [r.error for r in first.values() if r.error], first
        assert not [n for n in tables if first[n].deferred] and _parked_topics(lake) == set(), first
        before = {n: delta_tables.newest_version(lake.spark, lake.path(n)) for n in tables}

        _touch_all(lake, names, 1)
        # Postgres between the two rounds, for a read through the changelog by time.
        between = datetime.now(UTC)
        as_of_between = {}
        for name in (names[1], names[3]):  # a key change; a TRUNCATE
            like = lake.spark.read.format("delta").load(lake.path(name)).drop(*layout.META_COLUMNS)
            as_of_between[name] = postgres_frame(lake.spark, lake.dsn, name, like)
        t = sql.Identifier(toast)
        execute(
            lake.dsn,
            sql.SQL("UPDATE {} SET n = n + 10").format(t),  # big unchanged: TOAST carried
            sql.SQL("DELETE FROM {} WHERE id = 2").format(t),
        )
        _touch_all(lake, names, 2)
        execute(
            lake.dsn,
            sql.SQL("INSERT INTO {} VALUES (2, 'back', 2)").format(t),  # a deleted key re-inserted
            sql.SQL("UPDATE {} SET n = n + 1 WHERE id = 1").format(t),
        )
        worker.wait_caught_up()
        # No budget at all, and a run told not to catch up: every mirror waits in the changelog.
        behind: dict[str, object] = {"mirror_budget_s": 0.0, "catch_up": False}
        runs = lake.merge_all(fmt, changelog=True, **behind)
        assert not [r.error for r in runs.values() if r.error], runs
        assert _parked_topics(lake) == {lake.topic(n) for n in tables}
        assert all(runs[n].deferred for n in tables), runs
        assert {n: delta_tables.newest_version(lake.spark, lake.path(n)) for n in tables} == before
        head = _prove(lake, _newest_changelog_lsn(lake), fmt, **behind)

        # Read through the changelog, every table is as of its position all the same: its mirror's
        # version plus its tail (inserts, updates, a key change, a delete and the key re-inserted, an
        # update leaving a TOASTed value alone, a TRUNCATE, an ADD COLUMN).
        fresh = read_consistent(lake.spark, lake.warehouse, qualified, tail_from=options)
        assert fresh.position == head.watermark and fresh.changelog_version is not None
        for name in tables:
            assert (fresh.tables[f"public.{name}"].version or 0) <= before[name], name
            assert fresh.tables[f"public.{name}"].tail_after is not None, name
            frame = fresh.frame(f"public.{name}").drop(*layout.META_COLUMNS)
            assert_same_rows(frame, postgres_frame(lake.spark, lake.dsn, name, frame))
        toast_frame = fresh.frame(f"public.{toast}")
        toast_rows = {r["id"]: (r["n"], len(r["big"] or "")) for r in toast_frame.collect()}
        assert toast_rows == {1: (12, 9600), 2: (2, 4), 3: (13, 9600)}, toast_rows
        # Time travel by time through the changelog: as of a moment between the rounds, which only
        # the changelog holds (the mirrors are still at their first merge).
        past = read_consistent(lake.spark, lake.warehouse, qualified, at_time=between, tail_from=options)
        assert past.position < fresh.position and past.changelog_version is not None, past
        for name, expected in as_of_between.items():
            assert past.tables[f"public.{name}"].tail_after is not None, name
            assert_same_rows(past.frame(f"public.{name}").select(*expected.columns), expected)

        # Mirrors that waited the maximum lag are merged whatever the budget, from the changelog: the
        # quiet table's deferred slices with the batch's, the others' alone.
        late = sql.SQL("INSERT INTO {} VALUES (%s, 'late', %s)").format(sql.Identifier(quiet))
        execute(lake.dsn, (late, (77, 77)))
        worker.wait_caught_up()
        runs = lake.merge_all(fmt, changelog=True, mirror_budget_s=0.0, mirror_max_lag_s=0.0, catch_up=False)
        assert not [r.error for r in runs.values() if r.error], runs
        assert _parked_topics(lake) == set() and not [r for r in runs.values() if r.deferred]
        for name in tables:
            assert_delta_equals_postgres(lake.spark, lake.path(name), lake.dsn, name)
            if name != quiet:
                # The read at the head equals the mirror merged since, metadata columns included.
                merged = lake.spark.read.format("delta").load(lake.path(name))
                assert_same_rows(fresh.frame(f"public.{name}").select(*merged.columns), merged)

        # A scheduled run ends with every mirror merged, unless told otherwise.
        execute(lake.dsn, (late, (78, 78)))
        worker.wait_caught_up()
        runs = lake.merge_all(fmt, changelog=True, mirror_budget_s=0.0)
        assert not [r.error for r in runs.values() if r.error], runs
        assert runs[quiet].messages, runs[quiet]
        assert _parked_topics(lake) == set()
        assert_delta_equals_postgres(lake.spark, lake.path(quiet), lake.dsn, quiet)


def _newest_changelog_lsn(lake: LakeCase) -> int:
    """The newest change the changelog holds."""
    frame = lake.spark.read.format("delta").load(layout.changelog_path(lake.warehouse))
    row = frame.where(F.col("topic") != control_topic_name(lake.prefix)).agg(F.max(layout.LSN)).head()
    return int(row[0] or 0) if row is not None else 0


def _prove(lake: LakeCase, wanted: int, fmt: str = "avro", **merge: object) -> ChangelogCommit:
    """Merge runs until the changelog proves `wanted` (a progress event after it merged)."""
    for _ in range(PROVE_ATTEMPTS):
        head = changelog.newest(lake.spark, lake.warehouse)
        if head is not None and head.watermark >= wanted:
            return head
        time.sleep(1.5)
        lake.merge_all(fmt, changelog=True, **merge)
    raise AssertionError(
        f"the changelog never proved {wanted}: {changelog.newest(lake.spark, lake.warehouse)}"
    )


BANK_STREAM_S = 12.0
BANK_BURST_S = 5.0
BANK_TRIGGER_S = 3.0
BANK_CATCH_UP_S = 180.0


@pytest.mark.parametrize("budget_s", [0.0, 2.0], ids=["mirrors_behind", "mirrors_merged_off_the_batches"])
def test_bank_transfers_read_through_the_changelog_while_the_continuous_merge_keeps_mirrors_behind(
    lake: LakeCase, budget_s: float
) -> None:
    """Transfers stream while the continuous merge runs behind the changelog and a reader loops
    through it: every read holds the bank's invariant, positions never go back, and once the
    changelog holds the last transfer a read equals Postgres. With no mirror budget a mirror is
    merged only to create it (every later slice waits in the changelog: the mirrors still trail at
    the end); with one, the mirrors' thread merges them off the batches while the batches go on, and
    every mirror catches up and equals Postgres with the merge still running."""
    from tests.integration.test_lakehouse_watermark import TOTAL, create_bank, invariant, stream_transfers

    names = create_bank(lake)
    keys = ("a", "b", "transfers")
    qualified = [f"public.{names[k]}" for k in (*keys, "quiet")]
    options = MergeOptions(
        lake.warehouse,
        "avro",
        lake.registry,
        lake.prefix,
        changelog=True,
        mirror_budget_s=budget_s,
        mirror_max_lag_s=3600.0,
    )
    done = threading.Event()
    topics = [lake.topic(n) for n in names.values()]
    with running_worker(lake, fmt="avro", tables=",".join(f"public.{v}" for v in names.values())) as worker:
        worker.wait_caught_up()
        with continuous_merge(lake, options, topics, BANK_TRIGGER_S) as merge:
            stream_transfers(lake.dsn, names, BANK_STREAM_S, random.Random(33), done)
            positions: list[int] = []
            through_tails = 0
            final = None
            deadline = time.monotonic() + BANK_STREAM_S + BANK_CATCH_UP_S
            while final is None and time.monotonic() < deadline:
                assert not merge.failure, merge.failure
                assert merge.thread.is_alive(), "the continuous merge stopped by itself"
                finished = done.is_set()  # before the read: a read after it may hold every transfer
                try:
                    read = read_consistent(lake.spark, lake.warehouse, qualified, tail_from=options)
                except NoCommonWatermark:  # before the first transfer's mirror exists
                    time.sleep(1)
                    continue
                frames = {k: read.frame(q) for k, q in zip(keys, qualified, strict=False)}
                total, moves, twice = invariant(frames)
                assert total == TOTAL and moves == twice, (read.position, total, moves, twice)
                positions.append(read.position)
                through_tails += any(t.tail_after is not None for t in read.tables.values())
                if finished and twice // 2 == _count(lake, names["transfers"]):
                    if len(set(positions)) < 2:
                        # The merge served its first read after the transfers ended (a slow start):
                        # a second burst, so that reads see the position move while transfers go on.
                        done.clear()
                        stream_transfers(lake.dsn, names, BANK_BURST_S, random.Random(34), done)
                        continue
                    final = read
            assert final is not None, f"no read held every transfer in {BANK_CATCH_UP_S} s: {positions[-3:]}"
            for key, name in zip(keys, qualified, strict=False):
                frame = final.frame(name).drop(*layout.META_COLUMNS)
                assert_same_rows(frame, postgres_frame(lake.spark, lake.dsn, names[key], frame))
            if budget_s:
                _wait_mirrors_merged(lake, [names[k] for k in keys], merge)
    assert not merge.failure, merge.failure
    assert positions == sorted(positions) and len(set(positions)) >= 2, positions
    if not budget_s:
        # The mirrors trailed: their slices waited in the changelog, and reads came through their tails.
        assert {lake.topic(names["a"]), lake.topic(names["b"])} <= _parked_topics(lake)
        assert through_tails >= 2, through_tails


def _wait_mirrors_merged(lake: LakeCase, tables: list[str], merge: ContinuousMerge) -> None:
    """Until the mirrors' thread merged every deferred slice while the merge still runs; then every
    mirror equals Postgres."""
    deadline = time.monotonic() + BANK_CATCH_UP_S
    while _parked_topics(lake) and time.monotonic() < deadline:
        assert not merge.failure and merge.thread.is_alive(), merge.failure
        time.sleep(2)
    left = _parked_topics(lake)
    assert not left, f"mirrors still deferred after {BANK_CATCH_UP_S} s: {left}"
    for table in tables:
        assert_delta_equals_postgres(lake.spark, lake.path(table), lake.dsn, table)


def _count(lake: LakeCase, table: str) -> int:
    with psycopg2.connect(lake.dsn) as conn, conn.cursor() as cur:
        cur.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table)))
        return int(cur.fetchone()[0])
