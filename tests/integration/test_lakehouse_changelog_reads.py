"""Reads fresher than the mirrors: a mirror version plus its changelog tail (`changelog_tail`).

The differential case: each table's mirror as of the first merge, with every change the changelog
holds after that version's watermark applied (inserts, updates, a key change, a delete and its key
re-inserted, an update leaving a TOASTed value alone, a TRUNCATE, an ADD COLUMN), equals the mirror
the merge made of the same changes and Postgres, in Avro and JSON. `read_consistent` through the
changelog, with a table parked behind it, is in test_lakehouse_changelog.py.

And the mirrors merged behind the changelog (`--mirror-budget`): left behind, read fresh through
their tails; merged from the changelog once they waited the maximum lag; caught up at a run's end.
"""

from __future__ import annotations

import time

import pytest
from psycopg2 import sql
from pyspark.sql import functions as F

from kafka_contract.topics import control_topic_name
from spark_jobs.consistent_read import read_consistent, versions_of
from spark_jobs.lake import changelog, delta_tables, watermark_io
from spark_jobs.merging import changelog_tail
from spark_jobs.merging.merge_batch import MergeOptions
from spark_jobs.rules import layout
from spark_jobs.rules.changelog_commit import ChangelogCommit
from spark_jobs.rules.watermark import Version
from tests.integration.conftest import unique_name
from tests.integration.lakehouse import (
    LakeCase,
    assert_delta_equals_postgres,
    assert_same_rows,
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


@pytest.mark.parametrize("fmt", ["avro", "json"])
def test_a_mirror_version_plus_its_changelog_tail_equals_the_merged_mirror_and_postgres(
    lake: LakeCase, fmt: str
) -> None:
    names = [f"{unique_name('tail')}_{i}" for i in range(KINDS)]
    toast = unique_name("toast")
    _create(lake, names)
    _toast_table(lake, toast)
    tables = [*names, toast]
    with running_worker(lake, fmt=fmt, tables="public.*", partitions=2) as worker:
        worker.wait_caught_up()
        first = lake.merge_all(fmt, changelog=True)
        assert not [r.error for r in first.values() if r.error], first
        bases: dict[str, Version] = {
            name: versions_of(lake.spark, lake.warehouse, f"public.{name}", use_history=False).versions[-1]
            for name in tables
        }

        _touch_all(lake, names, 1)
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
        runs = lake.merge_all(fmt, changelog=True)
        assert not [r.error for r in runs.values() if r.error], runs
        # The position covering every change: proven once a progress event after them is merged.
        head = _prove(lake, _newest_lsn(lake, tables), fmt=fmt)

    options = MergeOptions(
        lake.warehouse, fmt, lake.registry if fmt == "avro" else None, lake.prefix, postgres=lake.dsn
    )
    pinned = delta_tables.newest_version(lake.spark, layout.changelog_path(lake.warehouse))
    reads = {}
    for name in tables:
        path = lake.path(name)
        base = bases[name]
        assert base.mark.watermark < head.watermark, (name, base, head)
        properties = delta_tables.table_properties(lake.spark, path)
        location = layout.location_for_topic(lake.topic(name), lake.prefix)
        tail = changelog_tail.tail_records(
            lake.spark,
            lake.warehouse,
            location.topic,
            control_topic_name(lake.prefix),
            after=base.mark.watermark,
            upto=head.watermark,
            version=pinned,
        )
        assert tail.records.where(F.col("topic") == location.topic).count() > 0, name
        mirror = lake.spark.read.format("delta").option("versionAsOf", base.version).load(path)
        read = changelog_tail.with_tail(
            lake.spark, mirror, tail, location=location, options=options, properties=properties
        )
        # The merged mirror, exact at the head's position, and Postgres: the same rows, the
        # metadata columns included (the tail's events are the ones the merge applied).
        merged = lake.spark.read.format("delta").load(path)
        assert watermark_io.stored_mark(lake.spark, path).applied <= head.watermark
        assert sorted(read.columns) == sorted(merged.columns), name
        assert_same_rows(read.select(*merged.columns), merged)
        reads[name] = read
        assert_delta_equals_postgres(lake.spark, path, lake.dsn, name)
    toast_rows = {r["id"]: (r["n"], len(r["big"] or "")) for r in reads[toast].collect()}
    assert toast_rows == {1: (12, 9600), 2: (2, 4), 3: (13, 9600)}, toast_rows


def test_mirrors_merged_behind_the_changelog_within_a_budget_and_read_fresh_meanwhile(lake: LakeCase) -> None:
    names = [f"{unique_name('behind')}_{i}" for i in range(3)]
    qualified = [f"public.{n}" for n in names]
    _create(lake, names)
    options = MergeOptions(lake.warehouse, "avro", lake.registry, lake.prefix)
    with running_worker(lake, fmt="avro", tables="public.*", partitions=1) as worker:
        worker.wait_caught_up()
        lake.merge_all(changelog=True)
        before = {n: delta_tables.newest_version(lake.spark, lake.path(n)) for n in names}

        # No budget at all, and a run told to leave them: every mirror waits in the changelog.
        _touch_all(lake, names, 1)
        worker.wait_caught_up()
        runs = lake.merge_all(changelog=True, mirror_budget_s=0.0, catch_up=False)
        assert not [r.error for r in runs.values() if r.error], runs
        assert _parked_topics(lake) == {lake.topic(n) for n in names}
        assert {n: delta_tables.newest_version(lake.spark, lake.path(n)) for n in names} == before
        # Reads at the changelog's position are fresh all the same.
        wanted = _newest_changelog_lsn(lake)
        head = _prove(lake, wanted, mirror_budget_s=0.0, catch_up=False)
        fresh = read_consistent(lake.spark, lake.warehouse, qualified, tail_from=options)
        assert fresh.position == head.watermark
        for name in names:
            assert fresh.tables[f"public.{name}"].tail_after is not None, name
            frame = fresh.frame(f"public.{name}").drop(*layout.META_COLUMNS)
            assert_same_rows(frame, postgres_frame(lake.spark, lake.dsn, name, frame))

        # A mirror that has waited the maximum lag is merged whatever the budget: its deferred
        # slices and the batch's, from the changelog, in one MERGE.
        _touch_all(lake, names, 2)
        worker.wait_caught_up()
        runs = lake.merge_all(changelog=True, mirror_budget_s=0.0, mirror_max_lag_s=0.0, catch_up=False)
        assert not [r.error for r in runs.values() if r.error], runs
        assert _parked_topics(lake) == set()
        for name in names:
            assert_delta_equals_postgres(lake.spark, lake.path(name), lake.dsn, name)

        # A scheduled run ends with every mirror merged, unless told otherwise.
        _touch_all(lake, names, 3)
        worker.wait_caught_up()
        runs = lake.merge_all(changelog=True, mirror_budget_s=0.0)
        assert not [r.error for r in runs.values() if r.error], runs
        assert all(runs[n].messages for n in names), runs
        assert _parked_topics(lake) == set()
        for name in names:
            assert_delta_equals_postgres(lake.spark, lake.path(name), lake.dsn, name)


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
