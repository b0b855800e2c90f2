"""The mirrors merged behind the lake's changelog, off the batches (`--mirror-budget`, docs/lakehouse.md).

With a mirror budget a batch of the merge query appends every table's records to the changelog,
merges only the mirrors that do not exist yet, and records every other table's slice as deferred
in the parked log (one commit); then it returns, so the next batch's changelog commit, the lake's
position, never waits for a mirror's MERGE. This module's thread merges the deferred slices from
the changelog in rounds: each round starts tables in `merge_order` (the one waiting longest first,
then the one with most records) until the budget is spent, a table that has waited the maximum lag
whatever the budget; the rounds follow one another while they merge something and mirrors wait,
and otherwise wait for the next batch (or `IDLE_WAKE_S`). A slice a batch defers while its table is
being merged stays deferred: a round forgets only the slices it merged (`ParkedLog.resolve_slices`).
While a batch runs (`batch_running`) a round starts no MERGE, and the budget's clock stops: the
batch's changelog commit is the lake's position, and on two cores every MERGE started beside it
delays that commit (docs/lakehouse.md, "Mirrors merged behind it").

Exactly once as the catch-up of a scheduled run: a slice's MERGE is idempotent under its txn and
newer-wins by (lsn, seq), and its slices are forgotten only after it committed, so a process killed
at any point merges them again. A table whose merge fails is parked as failed (the owner's
`park_failed`) and replayed by the merge's retries with its deferred slices. A round that fails
outside a table's merge (the parked log unwritable) is kept in `failure`: the next batch raises it,
and the query's supervisor restarts the merge.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from spark_jobs.merging.parked import ParkedLog, ParkedSlice
from spark_jobs.rules.mirror_schedule import Pending, merge_order, must_merge

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)
# The tag of the rounds' Spark jobs, cancelled when the merge stops.
JOB_TAG = "bottledwater-mirrors-behind"
# A round with no batch to wake it: mirrors that reach the maximum lag on an idle source.
IDLE_WAKE_S = 30.0

MergeDeferred = Callable[["SparkSession", str, list[ParkedSlice]], bool]


def records(topic: str, slices: list[ParkedSlice]) -> int:
    """The table's own records in its slices (the control topic's aside)."""
    return sum(last - first + 1 for s in slices for (t, _), (first, last) in s.ranges.items() if t == topic)


class MirrorsBehind:
    """The thread that merges the deferred mirrors. `merge(spark, topic, slices)`: merges a table's
    slices from the changelog in the calling thread, True when they committed (False: the owner
    parked the table as failed)."""

    def __init__(
        self,
        parked: ParkedLog,
        merge: MergeDeferred,
        *,
        budget_s: float,
        max_lag_s: float,
        threads: int,
    ) -> None:
        self.parked = parked
        self.merge = merge
        self.budget_s = budget_s
        self.max_lag_s = max_lag_s
        self.failure: BaseException | None = None
        self._pool = ThreadPoolExecutor(max(1, threads), thread_name_prefix="bw-mirrors")
        self._wake = threading.Event()
        self._stop = threading.Event()
        # The running batch's start (None: none runs; no MERGE starts then, and the budget's clock,
        # `_outside_batches`, stops) and the batches' time so far; notified when a batch ends or the
        # merge stops.
        self._batches = threading.Condition()
        self._inside_s = 0.0
        self._batch_started: float | None = None
        self._spark: SparkSession | None = None
        self._thread: threading.Thread | None = None

    def wake(self, spark: SparkSession) -> None:
        """A batch deferred slices (or ran): start the thread, or start its next round now."""
        self._spark = spark
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="bw-mirrors-behind", daemon=True)
            self._thread.start()
        self._wake.set()

    @contextmanager
    def batch_running(self) -> Iterator[None]:
        """Around a batch of the query: the rounds start no MERGE inside (those already running go
        on), so that the batch, whose changelog commit moves the lake's position, has the cores."""
        started = time.monotonic()
        with self._batches:
            self._batch_started = started
        try:
            yield
        finally:
            with self._batches:
                self._inside_s += time.monotonic() - started
                self._batch_started = None
                self._batches.notify_all()

    def _outside_batches(self) -> float:
        """The budget's clock: monotonic seconds with the batches' runs left out, so that a round
        woken inside a batch, or overlapping the next, still gets its budget of starting merges."""
        now = time.monotonic()
        with self._batches:
            inside = self._inside_s + (0.0 if self._batch_started is None else now - self._batch_started)
        return now - inside

    def stop(self, *, cancel: bool) -> None:
        """End the thread after its round (`cancel`: the round's Spark jobs cancelled, its slices
        left deferred for the next run)."""
        self._stop.set()
        self._wake.set()
        with self._batches:
            self._batches.notify_all()
        if cancel and self._spark is not None:
            self._spark.sparkContext.cancelJobsWithTag(JOB_TAG)
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._stop.clear()

    def close(self) -> None:
        self.stop(cancel=True)
        self._pool.shutdown(wait=True)

    def round(self, spark: SparkSession) -> int:
        """One round: the deferred tables started in `merge_order` within the budget (a table that
        waited the maximum lag whatever it), the merged slices forgotten in one commit; returns how
        many tables merged."""
        # A scheduled run whose query had no batch (nothing new in Kafka) never loaded the parked
        # log, and its end's round is what merges the mirrors left waiting by earlier runs.
        self.parked.load(spark)
        now = datetime.now(UTC)
        waiting = {t: self.parked.waiting_s(t, now) for t in self.parked.deferred_topics()}
        if not waiting:
            return 0
        slices = {t: self.parked.slices(t) for t in waiting}
        pending = [Pending(t, records(t, slices[t]), waiting[t]) for t in waiting]
        deadline = self._outside_batches() + self.budget_s
        futures = {
            topic: self._pool.submit(self._one, spark, topic, slices[topic], deadline, waiting[topic])
            for topic in merge_order(pending)
        }
        merged = {t: [s.batch_id for s in slices[t]] for t, f in futures.items() if f.result()}
        self.parked.resolve_slices(spark, merged)
        if merged:
            left = len(waiting) - len(merged)
            log.info("%s mirror(s) merged behind the changelog, %s wait", len(merged), left)
        return len(merged)

    def _one(
        self,
        spark: SparkSession,
        topic: str,
        slices: list[ParkedSlice],
        deadline: float,
        waiting_s: float | None,
    ) -> bool:
        with self._batches:
            self._batches.wait_for(lambda: self._batch_started is None or self._stop.is_set())
        late = self._outside_batches() >= deadline and not must_merge(waiting_s, self.max_lag_s)
        if late or self._stop.is_set():
            return False
        spark.sparkContext.addJobTag(JOB_TAG)
        try:
            return self.merge(spark, topic, slices)
        finally:
            spark.sparkContext.removeJobTag(JOB_TAG)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(IDLE_WAKE_S)
            self._wake.clear()
            spark = self._spark
            if self._stop.is_set() or spark is None:
                return
            try:
                # Rounds back to back while they merge and mirrors wait; then wait for a batch.
                while not self._stop.is_set() and self.round(spark) and self.parked.deferred_topics():
                    pass
            except Exception as exc:
                if self._stop.is_set():
                    return
                log.exception("merging the mirrors behind the changelog failed")
                self.failure = exc
                return
