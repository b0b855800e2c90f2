"""A mirror plus its changelog tail (`changelog_tail.apply_tail`) against the MERGE itself: the same
changes applied to the same mirror, once by the read and once by `mirror_merge.merge_changes`, give
the same rows, TOAST columns left unchanged, deletes, re-inserts and stale events included. The
read's one-statement form (`apply_tail_sql` over `changes.newest_per_key_nested_sql`) against the
step-wise one, a TRUNCATE's cut included."""

from __future__ import annotations

import random
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spark_jobs.lake import delta_tables, mirror_merge
from spark_jobs.lake.mirror_merge import MergeSpec
from spark_jobs.reading.changelog_tail import apply_tail, apply_tail_sql
from spark_jobs.rules import changes, layout
from spark_jobs.rules.names import delta_path, quote
from tests.unit.test_merge_steps import DATA, KEYS, events

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

TOAST = ["body"]


def _all(frame: Any) -> list[tuple[Any, ...]]:
    return sorted(tuple(r) for r in frame.select(*DATA, *layout.META_COLUMNS).collect())


def test_the_tail_applied_by_a_read_equals_the_tail_merged(spark: SparkSession, tmp_path: Path) -> None:
    rng = random.Random(11)
    base = [(k, f"v{k}", f"body{k}", 100 + k, 0, "r", ()) for k in range(12)]
    path = str(tmp_path / "mirror")
    mirror_rows = changes.newest_per_key(events(spark, *base), KEYS).drop(layout.UNCHANGED)
    mirror_rows.write.format("delta").save(path)
    for round_ in range(2):
        tail = []
        for n in range(25):
            key, lsn = rng.randrange(16), 200 + 10 * round_ + rng.randrange(8)
            op = rng.choice(["u", "u", "c", "d"])
            unchanged = ("body",) if op == "u" and rng.random() < 0.5 else ()
            body = None if unchanged or op == "d" else f"b{round_}.{n}"
            tail.append((key, None if op == "d" else f"l{round_}.{n}", body, lsn, n, op, unchanged))
        # A stale event: older than the mirror's row of its key, it changes nothing.
        tail.append((3, "stale", "stale", 50, 0, "u", ()))
        batch = events(spark, *tail)
        carried = changes.carry_unchanged(batch, KEYS, TOAST)
        newest = changes.newest_per_key(carried, KEYS)
        mirror = spark.read.format("delta").load(path)
        nested = changes.newest_per_key_nested(carried, KEYS)
        read = apply_tail(mirror, nested, tail_columns=carried.columns, keys=KEYS, toast=TOAST, columns=DATA)
        expected = _all(read)
        txn = delta_tables.Txn("unit-changelog-tail", round_)
        spec = MergeSpec(path, tuple(KEYS), tuple(DATA), txn, toast_columns=tuple(TOAST))
        mirror_merge.merge_changes(spark, newest, spec)
        assert _all(spark.read.format("delta").load(path)) == expected, round_


def test_the_tail_as_one_statement_equals_the_tail_applied_step_by_step(
    spark: SparkSession, tmp_path: Path
) -> None:
    rng = random.Random(5)
    path = str(tmp_path / "mirror")
    base = [(k, f"v{k}", f"body{k}", 100 + k, 0, "r", ()) for k in range(10)]
    changes.newest_per_key(events(spark, *base), KEYS).drop(layout.UNCHANGED).write.format("delta").save(path)
    tail = [
        (rng.randrange(14), f"l{n}", f"b{n}", 200 + rng.randrange(20), n, rng.choice(["u", "c", "d"]), ())
        for n in range(40)
    ]
    tail.append((3, "stale", "stale", 50, 0, "u", ()))  # older than the mirror's row: no change
    batch = events(spark, *tail)
    view = "unit_tail_events"
    batch.createOrReplaceTempView(view)
    try:
        for cut in (None, (209, 0)):  # without and with a TRUNCATE's position in the tail
            kept = changes.drop_truncated(batch, cut)
            stepwise = apply_tail(
                spark.read.format("delta").load(path),
                changes.newest_per_key_nested(kept, KEYS),
                tail_columns=batch.columns,
                keys=KEYS,
                toast=(),
                columns=DATA,
            )
            newest = changes.newest_per_key_nested_sql(changes.drop_truncated_sql(quote(view), cut), KEYS)
            statement = apply_tail_sql(
                delta_path(path),
                spark.read.format("delta").load(path).columns,
                f"({newest})",
                tail_columns=batch.columns,
                keys=KEYS,
                columns=DATA,
            )
            read = spark.sql(statement)
            assert read.columns == stepwise.columns
            assert _all(read) == _all(stepwise), cut
            assert len(_all(read)) > 5  # some rows kept, some deleted: not two empty frames
    finally:
        spark.catalog.dropTempView(view)


ODD = ["id", "a`b", "it's", "x.y z"]
ODD_SCHEMA = (
    "id long, `a``b` string, `it's` string, `x.y z` string,"
    " _bw_lsn long, _bw_seq long, _bw_op string, _bw_commit_ts timestamp"
)


def test_a_tail_over_columns_named_with_quotes_backticks_dots_and_spaces(spark: SparkSession) -> None:
    """The read's expressions are Spark SQL text: every name must stay one quoted identifier, and a
    TOAST column's name one string literal."""
    from datetime import UTC, datetime

    ts = datetime(2024, 1, 2, tzinfo=UTC)
    mirror = spark.createDataFrame(
        [
            (1, "m1", "t1", "z1", 10, 0, "c", ts),
            (2, "m2", "t2", "z2", 10, 1, "c", ts),
            (3, "m3", "t3", "z3", 30, 0, "u", ts),
        ],
        ODD_SCHEMA,
    )
    tail = spark.createDataFrame(
        [
            (1, "n1", None, "nz1", 20, 0, "u", ts, ["it's"]),  # TOAST: keeps the mirror's value
            (2, None, None, None, 20, 1, "d", ts, []),
            (3, "stale", "stale", "stale", 20, 2, "u", ts, []),  # older than the mirror's row
            (4, "n4", "t4", "z4", 20, 3, "c", ts, []),
        ],
        ODD_SCHEMA + ", _bw_unchanged array<string>",
    )
    newest = changes.newest_per_key_nested(tail, ["id"])
    read = apply_tail(mirror, newest, tail_columns=tail.columns, keys=["id"], toast=["it's"], columns=ODD)
    assert read.columns == [*ODD, *layout.META_COLUMNS]
    assert sorted(tuple(r)[:6] for r in read.collect()) == [
        (1, "n1", "t1", "nz1", 20, 0),
        (3, "m3", "t3", "z3", 30, 0),
        (4, "n4", "t4", "z4", 20, 3),
    ]
