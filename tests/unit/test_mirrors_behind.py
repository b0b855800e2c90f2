"""The mirrors' rounds behind the changelog (`merging.mirrors_behind`) on a real parked log (a Delta
table): which deferred tables a round merges, in what order, and which slices it forgets. The merge
itself is the caller's (here a function that records its calls and may park a slice meanwhile, as a
batch does while a table is being merged)."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from spark_jobs.merging.mirrors_behind import MergeDeferred, MirrorsBehind, records
from spark_jobs.merging.parked import DEFERRED, ParkedLog, ParkedSlice

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

CONTROL = "app.bottledwater.control"


def _slice(topic: str, batch: int, count: int, *, waited_s: float = 0.0) -> ParkedSlice:
    at = datetime.now(UTC) - timedelta(seconds=waited_s)
    ranges = {(topic, 0): (batch * 100, batch * 100 + count - 1), (CONTROL, 0): (batch, batch)}
    return ParkedSlice(topic, batch, ranges, DEFERRED, at)


def _log(spark: SparkSession, tmp_path: Path, slices: list[ParkedSlice]) -> ParkedLog:
    parked = ParkedLog(str(tmp_path / "lake"))
    parked.load(spark)
    parked.park_all(spark, slices)
    return parked


def _stored(spark: SparkSession, parked: ParkedLog) -> list[tuple[str, int]]:
    rows = spark.read.format("delta").load(parked.path).collect()
    return sorted((r["topic"], r["batch_id"]) for r in rows)


def _round(
    spark: SparkSession, parked: ParkedLog, merge: MergeDeferred, *, budget_s: float, threads: int
) -> int:
    """One round of a mirrors' thread that is then closed; how many tables it merged."""
    behind = MirrorsBehind(parked, merge, budget_s=budget_s, max_lag_s=300.0, threads=threads)
    try:
        return behind.round(spark)
    finally:
        behind.close()


def test_records_count_the_tables_own_messages_not_the_control_topics() -> None:
    assert records("app.a", [_slice("app.a", 1, 5), _slice("app.a", 2, 7)]) == 12


def test_a_round_merges_every_table_oldest_first_and_forgets_only_what_it_merged(
    spark: SparkSession, tmp_path: Path
) -> None:
    slices = [
        _slice("app.big", 1, 50),
        _slice("app.small", 1, 2),
        _slice("app.old", 1, 1, waited_s=120),
        _slice("app.big", 2, 50),
    ]
    parked = _log(spark, tmp_path, slices)
    calls: list[tuple[str, list[int]]] = []
    lock = threading.Lock()

    def merge(session: SparkSession, topic: str, merged: list[ParkedSlice]) -> bool:
        with lock:
            calls.append((topic, [s.batch_id for s in merged]))
        if topic == "app.big":  # a batch defers the table's next slice while it is being merged
            parked.park_all(session, [_slice("app.big", 3, 10)])
        return True

    assert _round(spark, parked, merge, budget_s=60.0, threads=1) == 3
    assert calls == [("app.old", [1]), ("app.big", [1, 2]), ("app.small", [1])]
    assert parked.deferred_topics() == ["app.big"]
    assert [s.batch_id for s in parked.slices("app.big")] == [3]
    assert _stored(spark, parked) == [("app.big", 3)]


def test_a_zero_budget_merges_only_the_tables_that_waited_the_maximum_lag(
    spark: SparkSession, tmp_path: Path
) -> None:
    parked = _log(spark, tmp_path, [_slice("app.fresh", 1, 3), _slice("app.late", 1, 3, waited_s=400)])
    merged: list[str] = []

    def merge(session: SparkSession, topic: str, slices: list[ParkedSlice]) -> bool:
        merged.append(topic)
        return True

    assert _round(spark, parked, merge, budget_s=0.0, threads=2) == 1
    assert merged == ["app.late"]
    assert _stored(spark, parked) == [("app.fresh", 1)]


def test_a_table_whose_merge_fails_keeps_its_slices(spark: SparkSession, tmp_path: Path) -> None:
    parked = _log(spark, tmp_path, [_slice("app.ok", 1, 3), _slice("app.bad", 1, 3)])

    def merge(session: SparkSession, topic: str, slices: list[ParkedSlice]) -> bool:
        return topic != "app.bad"  # the owner parked it as failed

    assert _round(spark, parked, merge, budget_s=60.0, threads=2) == 1
    assert _stored(spark, parked) == [("app.bad", 1)]


def test_the_thread_merges_what_a_batch_deferred_and_stops(spark: SparkSession, tmp_path: Path) -> None:
    parked = _log(spark, tmp_path, [_slice("app.a", 1, 3)])
    done = threading.Event()

    def merge(session: SparkSession, topic: str, slices: list[ParkedSlice]) -> bool:
        done.set()
        return True

    behind = MirrorsBehind(parked, merge, budget_s=5.0, max_lag_s=300.0, threads=1)
    try:
        behind.wake(spark)
        assert done.wait(60), "the thread never merged the deferred table"
        behind.stop(cancel=False)
    finally:
        behind.close()
    assert behind.failure is None
    assert _stored(spark, parked) == []


def test_no_merge_starts_while_a_batch_runs_and_the_batch_spends_no_budget(
    spark: SparkSession, tmp_path: Path
) -> None:
    parked = _log(spark, tmp_path, [_slice("app.a", 1, 3)])
    merged = threading.Event()
    batch_ended = threading.Event()
    order: list[str] = []

    def merge(session: SparkSession, topic: str, slices: list[ParkedSlice]) -> bool:
        order.append("merge" if batch_ended.is_set() else "merge inside the batch")
        merged.set()
        return True

    # A batch longer than the budget: the round woken inside it still merges once it ends.
    behind = MirrorsBehind(parked, merge, budget_s=1.0, max_lag_s=300.0, threads=1)
    try:
        with behind.batch_running():
            behind.wake(spark)
            assert not merged.wait(2.5), "a MERGE started while the batch ran"
            batch_ended.set()
        assert merged.wait(60), "the held MERGE never started after the batch"
        behind.stop(cancel=False)
    finally:
        behind.close()
    assert order == ["merge"]
    assert _stored(spark, parked) == []


def test_a_merge_held_by_a_batch_is_left_deferred_when_the_merge_stops(
    spark: SparkSession, tmp_path: Path
) -> None:
    parked = _log(spark, tmp_path, [_slice("app.a", 1, 3)])
    merged: list[str] = []

    def merge(session: SparkSession, topic: str, slices: list[ParkedSlice]) -> bool:
        merged.append(topic)
        return True

    behind = MirrorsBehind(parked, merge, budget_s=60.0, max_lag_s=300.0, threads=1)
    with behind.batch_running():
        behind.wake(spark)
        time.sleep(1.0)  # the round is waiting for the batch
        behind.close()  # the stop ends the wait, not the batch
    assert merged == []
    assert _stored(spark, parked) == [("app.a", 1)]
