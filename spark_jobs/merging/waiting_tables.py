"""The merge query's tables that wait, and who says when they go on (`merge_query` hands each
batch's slices here):

- parked: a table whose slice failed is parked (`parked`) with its offset ranges and the others go
  on; a slice of a parked table waits behind its earlier ones. Parked tables are replayed at the
  next batch (every `retry_parked_s` at most) or at the end of a scheduled run, several at once,
  from the changelog when it holds their batches, else from Kafka;
- behind: with a mirror budget the batch merges only the mirrors that do not exist yet and defers
  the other slices to the mirrors' thread (`mirrors_behind`), which merges them from the changelog
  off the batches;
- idle: the query's tables with nothing in a batch that holds control events (progress among them)
  advance their source watermark without a commit of their own: one commit of the batch's idle
  marks for all of them (`watermark_io.write_idle_marks`), in parallel with the tables' slices. A
  batch whose progress events move no position (an idle source) writes no commit: the newer proof
  time goes to the query's proof file (`watermark_io.write_proofs`), and no table is read.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from spark_jobs.connections.kafka_source import KafkaSource, read_ranges
from spark_jobs.lake import changelog, watermark_io
from spark_jobs.merge_options import MergeOptions
from spark_jobs.merging import batch_schema
from spark_jobs.merging.changelog_writer import ChangelogWriter
from spark_jobs.merging.merge_batch import BatchResult, TableMerger
from spark_jobs.merging.mirrors_behind import MirrorsBehind
from spark_jobs.merging.parked import DEFERRED, ParkedLog, ParkedSlice, union
from spark_jobs.merging.streamed_commits import resolve_kept
from spark_jobs.rules.watermark import Mark, newer, newest_mark, table_key

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)


def rebind(frame: DataFrame, session: SparkSession) -> DataFrame:
    """The same plan as a DataFrame of another session of the same application (its own conf)."""
    from pyspark.sql import DataFrame

    jvm = session._jvm
    assert jvm is not None, "a classic (JVM) Spark session"
    dataset = jvm.org.apache.spark.sql.classic.Dataset
    return DataFrame(dataset.ofRows(session._jsparkSession, frame._jdf.logicalPlan()), session)


class WaitingTables:
    """The parked, deferred and idle tables of one merge query. `merger(topic)`: the table's merger;
    `session(spark)`: the calling thread's own session; `pool`: the query's merge threads."""

    def __init__(
        self,
        options: MergeOptions,
        kafka: KafkaSource,
        *,
        merger: Callable[[str], TableMerger],
        session: Callable[[SparkSession], SparkSession],
        pool: ThreadPoolExecutor,
        changelog_writer: ChangelogWriter | None,
        retry_parked_s: float,
        threads: int,
    ) -> None:
        self.options = options
        self.kafka = kafka
        self.merger = merger
        self.session = session
        self.pool = pool
        self.changelog = changelog_writer
        self.retry_parked_s = retry_parked_s
        self.parked = ParkedLog(options.warehouse)
        self.errors: dict[str, str] = {}
        # Run after a table's commit outside the batches (behind the changelog, a parked replay),
        # with its topic and result, in the thread that merged it.
        self.on_mirror: list[Callable[[str, BatchResult], None]] = []
        # Set before the query is stopped on purpose: a slice interrupted then is not a table's failure.
        self.stopping = threading.Event()
        self.query_id: str | None = None
        self.checkpoint: str | None = None
        self._lock = threading.Lock()
        self._attempted: dict[str, float] = {}
        # Each table's newest idle mark when the query started (read at its first batch).
        self._idle_floors: dict[str, Mark] | None = None
        self.behind = (
            MirrorsBehind(
                self.parked,
                self._merge_deferred,
                budget_s=options.mirror_budget_s,
                max_lag_s=options.mirror_max_lag_s,
                threads=threads,
            )
            if options.mirror_budget_s is not None and changelog_writer is not None
            else None
        )

    def floor(self, path: str) -> Mark | None:
        """The idle floor of the mirror at `path` (None: none, or not read yet)."""
        return None if self._idle_floors is None else self._idle_floors.get(table_key(path))

    # -- a batch's slices ----------------------------------------------------------------------

    def merge_slice(
        self,
        spark: SparkSession,
        records: DataFrame,
        batch_id: int,
        topic: str,
        summary: batch_schema.BatchSummary,
    ) -> BatchResult | None:
        """A table's slice of the batch in this thread's session; parked behind the table's earlier
        slices if it has any parked, parked as failed if it raises."""
        from pyspark.sql import functions as F

        ranges = summary.ranges()
        session = self.session(spark)
        if self.parked.is_parked(topic):
            # Its earlier changes are not merged yet: this slice waits behind them.
            self.parked.park(session, ParkedSlice(topic, batch_id, ranges, "parked behind an earlier slice"))
            return None
        control_topic = self.merger(topic).control_topic
        own = rebind(records.where(F.col("topic").isin(topic, control_topic)), session)
        try:
            return self.merger(topic).process_slice(own, batch_id, summary)
        except Exception as exc:
            if self.stopping.is_set():
                raise
            log.exception("merging %s failed in batch %s: parked with its offsets", topic, batch_id)
            self._park_failed(session, ParkedSlice(topic, batch_id, ranges, f"{topic}: {exc}"))
            return None

    def merge_behind(
        self,
        spark: SparkSession,
        records: DataFrame,
        batch_id: int,
        work: Mapping[str, batch_schema.BatchSummary],
    ) -> dict[str, BatchResult]:
        """With a mirror budget: the batch merges the mirrors that do not exist yet (a read through
        the changelog starts from one), a failed table's slice parks behind its earlier ones, and
        every other slice is deferred in one commit for the mirrors' thread (`mirrors_behind`),
        which merges them from the changelog off the batches."""
        assert self.behind is not None
        session = self.session(spark)
        now = {
            topic: summary
            for topic, summary in work.items()
            if (self.parked.is_parked(topic) and not self.parked.is_deferred(topic))
            or not self.merger(topic).has_mirror(session)
        }
        futures = {
            topic: self.pool.submit(self.merge_slice, spark, records, batch_id, topic, summary)
            for topic, summary in now.items()
        }
        deferred = [
            ParkedSlice(topic, batch_id, ranges, DEFERRED)
            for topic, summary in work.items()
            if topic not in now and (ranges := summary.ranges())
        ]
        results = {t: result for t, f in futures.items() if (result := f.result()) is not None}
        # Before the batch may commit its checkpoint: what waits is recorded.
        self.parked.park_all(spark, deferred)
        self.behind.wake(spark)
        return results

    # -- idle tables ---------------------------------------------------------------------------

    def advance_idle(
        self,
        spark: SparkSession,
        batch_id: int,
        idle: Sequence[str],
        events: Sequence[dict[str, Any]],
    ) -> None:
        """The `idle` tables (selected, nothing in a batch that holds control events, progress
        among them, `events` decoded), parked ones aside (their changes wait): their marks, in one
        idle-marks commit."""
        idle = [topic for topic in idle if not self.parked.is_parked(topic)]
        if not events or self.checkpoint is None or not idle:
            return
        session = self.session(spark)
        # Read once for every table (each table's step is then in memory unless its position moves:
        # an idle source's batches cost no I/O per table).
        ends = watermark_io.end_offsets(session, self.checkpoint, batch_id)
        if ends is None:
            return
        steps = []
        for topic in idle:
            merger = self.merger(topic)
            merger.mark = None  # its newest batch had nothing of it
            if (step := merger.watermark.idle(session, events, ends)) is not None:
                steps.append(step)
        if any(step.moved for step in steps):
            marks = [step.mark for step in steps]
            watermark_io.write_idle_marks(session, self.options.warehouse, batch_id, marks)
        elif steps and self.query_id is not None:
            # The same positions proven later: no Delta commit, the proof time in the query's file.
            proofs = [step.mark for step in steps]
            watermark_io.write_proofs(session, self.options.warehouse, self.query_id, batch_id, proofs)

    def load_idle_floors(self, spark: SparkSession, mergers: Sequence[TableMerger]) -> None:
        """Each table's newest idle mark, once per query: its watermark never goes back behind it."""
        if self._idle_floors is not None:
            return
        idle = watermark_io.idle_marks(spark, self.options.warehouse, watermark_io.RECENT_IDLE_COMMITS)
        floors: dict[str, Mark] = {}
        for table, marks in idle.items():
            if (floor := newest_mark(m.mark for m in marks)) is not None:
                floors[table] = floor
        self._idle_floors = floors
        for merger in mergers:
            floor = floors.get(table_key(merger.path))
            if floor is not None:
                merger.watermark.floor = newer(floor, merger.watermark.floor)

    # -- parked and deferred tables ------------------------------------------------------------

    def finish_behind(self, spark: SparkSession) -> None:
        """A scheduled run's end: the mirrors' thread stopped after its round, and one more round
        for what the last batches deferred (the budget and the maximum lag as in any round)."""
        if self.behind is not None:
            self.behind.stop(cancel=False)
            if self.behind.failure is not None:
                raise RuntimeError(f"merging the mirrors behind the changelog failed: {self.behind.failure}")
            self.behind.round(spark)

    def retry_parked(self, spark: SparkSession, *, force: bool = False, deferred: bool = False) -> None:
        """Replay each parked table's ranges (`_replay_parked`, several tables at once), at most every
        `retry_parked_s` per table unless `force`, and unpark those that merge in one commit. The
        tables deferred by the schedule only with `deferred` (a scheduled run's end), all of them."""
        self.parked.load(spark)
        now, due = time.monotonic(), []
        for topic in self.parked.topics():
            behind = self.parked.is_deferred(topic)
            last = self._attempted.get(topic)
            if (behind and not deferred) or (  # the schedule merges it (`merge_behind`), or the run's end
                not (force or behind) and last is not None and now - last < self.retry_parked_s
            ):
                continue
            self._attempted[topic] = now
            due.append(topic)
        if not due:
            return
        log_, query = self.changelog, self.query_id
        logged = set() if log_ is None or query is None else log_.batches(spark, query)
        futures = {topic: self.pool.submit(self._replay_parked, spark, topic, logged) for topic in due}
        merged = [topic for topic, future in futures.items() if future.result()]
        # A run killed before this commit replays these tables again: harmless, each replay's merge
        # is idempotent (its txn) and newer-wins by (lsn, seq).
        self.parked.resolve_all(spark, merged)
        log.info("%s of %s parked table(s) merged and unparked: %s", len(merged), len(due), ", ".join(merged))

    def _replay_parked(self, spark: SparkSession, topic: str, logged: set[int]) -> bool:
        """One table of `retry_parked`: whether its parked slices merged (else its error is kept). The
        records come from the changelog when it holds every one of the slices' batches (`logged`: the
        query's batches it holds; Kafka's retention may have dropped them since), else from Kafka."""
        session = self.session(spark)
        slices, warehouse = self.parked.slices(topic), self.options.warehouse
        ranges = union(slices)
        try:
            if self.changelog is not None and {s.batch_id for s in slices} <= logged:
                frame = changelog.read_ranges(session, warehouse, ranges)
            else:
                frame = resolve_kept(session, read_ranges(session, self.kafka, ranges), warehouse)
            result = self._process(topic, frame, max(s.batch_id for s in slices))
        except Exception as exc:
            if self.stopping.is_set():
                raise
            error = f"{topic}: {exc}".splitlines()[0]
            with self._lock:
                self.errors[topic] = error
            log.warning("replaying the parked changes of %s failed: %s", topic, error)
            return False
        self._merged(topic, result)
        return True

    def _merge_deferred(self, spark: SparkSession, topic: str, slices: list[ParkedSlice]) -> bool:
        """A table's deferred slices merged from the changelog (`mirrors_behind`'s merge): False when
        it failed, the table then parked as failed (`retry_parked` replays it)."""
        session = self.session(spark)
        batch_id = max(s.batch_id for s in slices)
        try:
            frame = changelog.read_ranges(session, self.options.warehouse, union(slices))
            result = self._process(topic, frame, batch_id)
        except Exception as exc:
            if self.stopping.is_set():
                raise
            log.exception("merging %s from the changelog failed: parked", topic)
            self._park_failed(session, ParkedSlice(topic, batch_id, {}, f"{topic}: {exc}"))
            return False
        self._merged(topic, result)
        return True

    def _process(self, topic: str, frame: DataFrame, batch_id: int) -> BatchResult | None:
        merger = self.merger(topic)
        result = merger.process(frame, batch_id)
        if result is not None:
            merger.results.append(result)
        return result

    def _merged(self, topic: str, result: BatchResult | None) -> None:
        with self._lock:
            self.errors.pop(topic, None)
        if result is not None:
            for hook in self.on_mirror:
                hook(topic, result)

    def _park_failed(self, session: SparkSession, failed: ParkedSlice) -> None:
        """A slice that raised: parked with the error's first line, which the run reports."""
        error = failed.error.splitlines()[0]
        self.parked.park(session, replace(failed, error=error))
        self.errors[failed.topic] = error
        self._attempted[failed.topic] = time.monotonic()
