"""The `foreachBatch` of the one query that merges every selected table (docs/lakehouse.md).

Per batch: the records (every table topic and the control topic) are read once and summarized in one
aggregate; with `MergeOptions.changelog` they are first appended to the lake's changelog in one
commit for every table (`changelog_writer`); the tables with records, or named by a control event
(TRUNCATE, DDL), are merged, several at once on a small thread pool (a table named by a control
event even when it is not selected: the control topic moves on for all), each by its `TableMerger`
from its own slice (its topic and the control topic) with its own commits, idempotent under its own
`txnAppId` (query id + the digest of its slice's end offsets) and `txnVersion` (the batch id), as
when every table had its own query. Each thread works in its own session (a `newSession()` of the
query's), so the txn settings that one table's commit sets are never read by another's.
With a mirror budget (`MergeOptions.mirror_budget_s`) the batch merges only the mirrors that do not
exist yet and defers the other slices to the mirrors' thread (`mirrors_behind`), which merges them
from the changelog off the batches.

A table whose slice fails is parked (`parked`) with its offset ranges and the others go on; parked
tables are replayed at the next batch (every `retry_parked_s` at most) or at the end of a scheduled
run, several at once. `on_batch` hooks run after every table of a batch committed, with the batch
id and its end offsets per topic partition (the seam for a cross-table watermark).

The query's tables with nothing in a batch that holds control events (progress among them) advance
their source watermark without a commit of their own: one commit of the batch's idle marks for all
of them (`watermark_io.write_idle_marks`, docs/lakehouse.md), in parallel with the tables' slices.
A batch whose progress events move no position (an idle source) writes no commit: the newer proof
time goes to the query's proof file (`watermark_io.write_proofs`), and no table is read.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from kafka_contract import control
from kafka_contract.topics import control_topic_name
from spark_jobs.connections.kafka_source import KafkaSource, read_ranges
from spark_jobs.lake import changelog, watermark_io
from spark_jobs.lake.watermark_io import IdleStep
from spark_jobs.merge_options import MergeOptions, decoding_of
from spark_jobs.merging import batch_schema
from spark_jobs.merging.changelog_writer import ChangelogWriter
from spark_jobs.merging.merge_batch import QUERY_ID_WAIT_S, BatchResult, TableMerger
from spark_jobs.merging.mirrors_behind import MirrorsBehind
from spark_jobs.merging.parked import DEFERRED, ParkedLog, ParkedSlice, union
from spark_jobs.merging.topic_ledger import TopicLedger
from spark_jobs.options import DEFAULT_MERGE_THREADS
from spark_jobs.rules import layout
from spark_jobs.rules.changelog_commit import query_topics
from spark_jobs.rules.watermark import Mark, Offsets, newer, newest_mark, table_key

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)
PARKED_RETRY_S = 60.0


@dataclass(frozen=True)
class BatchCommitted:
    """What a batch of the one query merged: its id, the highest offset read per topic partition
    (tables and control), each merged table's result."""

    batch_id: int
    end_offsets: dict[tuple[str, int], int]
    results: dict[str, BatchResult]


def rebind(frame: DataFrame, session: SparkSession) -> DataFrame:
    """The same plan as a DataFrame of another session of the same application (its own conf)."""
    from pyspark.sql import DataFrame

    jvm = session._jvm
    assert jvm is not None, "a classic (JVM) Spark session"
    dataset = jvm.org.apache.spark.sql.classic.Dataset
    return DataFrame(dataset.ofRows(session._jsparkSession, frame._jdf.logicalPlan()), session)


def _named_by(events: Sequence[dict[str, Any]]) -> set[str]:
    """The table topics a TRUNCATE or DDL event names (a table may have no record in the batch, or no
    topic yet)."""
    named = (e for e in events if e.get("op") in (control.TRUNCATE, control.DDL))
    return {str(e["topic"]) for e in named if e.get("topic")}


class AllTablesMerger:
    """The foreachBatch function of the one merge query. `selected(topic)`: whether a table topic is
    merged (the query's subscription, and control events naming topics outside it)."""

    def __init__(
        self,
        options: MergeOptions,
        kafka: KafkaSource,
        selected: Callable[[str], bool],
        *,
        threads: int = DEFAULT_MERGE_THREADS,
        retry_parked_s: float = PARKED_RETRY_S,
        topics: Sequence[str] = (),
        ledger: TopicLedger | None = None,
    ) -> None:
        self.options = options
        self.kafka = kafka
        self.selected = selected
        self.control_topic = control_topic_name(options.topic_prefix)
        self.retry_parked_s = retry_parked_s
        self.mergers: dict[str, TableMerger] = {}
        self.errors: dict[str, str] = {}
        self.parked = ParkedLog(options.warehouse)
        self.on_batch: list[Callable[[BatchCommitted], None]] = []
        # Run after a table's commit outside the batches (behind the changelog, a parked replay),
        # with its topic and result, in the thread that merged it.
        self.on_mirror: list[Callable[[str, BatchResult], None]] = []
        # Set before the query is stopped on purpose: a slice interrupted then is not a table's failure.
        self.stopping = threading.Event()
        self._query_id: str | None = None
        self._bound = threading.Event()
        self._pool = ThreadPoolExecutor(max(1, threads), thread_name_prefix="bw-merge")
        self._sessions = threading.local()
        self._lock = threading.Lock()
        self._attempted: dict[str, float] = {}
        self._control_decoder: control.ControlDecoder | None = None
        # The query's table topics, whose source watermark advances in batches that hold nothing of
        # them (docs/lakehouse.md); the query's checkpoint, where the watermark finds each batch's
        # end offsets; each table's newest idle mark when the query started (read at its first batch).
        self.topics = tuple(topics)
        # Kafka's ids of the topics read: a batch of a topic recreated under its name fails the query.
        self.ledger = ledger
        self._checkpoint: str | None = None
        self._idle_floors: dict[str, Mark] | None = None
        # Every batch's records in one commit before the mirrors' merges (MergeOptions.changelog).
        self.changelog = (
            ChangelogWriter(options.warehouse, decoding_of(options)) if options.changelog else None
        )
        self.behind = (
            MirrorsBehind(
                self.parked,
                self._merge_deferred,
                budget_s=options.mirror_budget_s,
                max_lag_s=options.mirror_max_lag_s,
                threads=threads,
            )
            if options.mirror_budget_s is not None and self.changelog is not None
            else None
        )

    def bind(self, query_id: str, checkpoint: str | None = None) -> None:
        self._query_id = query_id
        self._checkpoint = checkpoint
        for merger in self.mergers.values():
            merger.bind(query_id, checkpoint)
        self._bound.set()

    def close(self) -> None:
        if self.behind is not None:
            # Its round's cancelled MERGEs are the stop's, not the tables' failures.
            self.stopping.set()
            self.behind.close()
        self._pool.shutdown(wait=True)
        if self.ledger is not None:
            self.ledger.close()

    def merger(self, topic: str) -> TableMerger:
        with self._lock:
            return self._merger(topic)

    def marks(self) -> dict[str, Mark | None]:
        """Each table's newest mark (None: no position yet), by topic."""
        with self._lock:
            return {topic: merger.mark for topic, merger in self.mergers.items()}

    def _mirror_committed(self, topic: str, result: BatchResult | None) -> None:
        if result is not None:
            for hook in self.on_mirror:
                hook(topic, result)

    def _merger(self, topic: str) -> TableMerger:
        if topic not in self.mergers:
            merger = TableMerger(layout.location_for_topic(topic, self.options.topic_prefix), self.options)
            if self._query_id is not None:
                merger.bind(self._query_id, self._checkpoint)
            if self._idle_floors is not None:
                merger.watermark.floor = self._idle_floors.get(table_key(merger.path))
            self.mergers[topic] = merger
        return self.mergers[topic]

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        if not self._bound.wait(QUERY_ID_WAIT_S):
            raise RuntimeError("the merge query's id was never bound: call bind() after start()")
        if self.behind is not None and self.behind.failure is not None:
            raise RuntimeError(f"merging the mirrors behind the changelog failed: {self.behind.failure}")
        with nullcontext() if self.behind is None else self.behind.batch_running():
            self._merge_batch(batch, batch_id)

    def _merge_batch(self, batch: DataFrame, batch_id: int) -> None:
        spark, prefix = batch.sparkSession, self.options.topic_prefix
        self.parked.load(spark)
        self._load_idle_floors(spark)
        self.retry_parked(spark)
        with batch_schema.read_once(batch) as records:
            tables, control_only = batch_schema.summarize_topics(
                records, self.control_topic, self.options.output_format
            )
            # Decoded once: the tables they name and the idle tables' watermarks both read them.
            events = self._control_events(control_only)
            ends: dict[tuple[str, int], int] = dict(control_only.offsets)
            for summary in tables.values():
                ends.update(summary.offsets)
            topic_ids = {} if self.ledger is None else self.ledger.check(spark, query_topics(ends))
            if self.changelog is not None:
                assert self._query_id is not None
                self.changelog.write(
                    spark,
                    records,
                    query_id=self._query_id,
                    checkpoint=self._checkpoint,
                    batch_id=batch_id,
                    ends=ends,
                    events=events,
                    table_records=any(s.table_messages for s in tables.values()),
                    topic_ids=topic_ids,
                )
            named = _named_by(events)
            work = {t: summary for t, summary in sorted(tables.items()) if self.selected(t)}
            # A control event is applied to the table it names whether or not the table is selected:
            # the control topic's offsets move on, and a table selected later must not miss it.
            work.update(
                {t: tables.get(t, control_only) for t in sorted(named) if layout.is_table_topic(t, prefix)}
            )
            idle = self._pool.submit(self._advance_idle, spark, batch_id, work, events)
            if self.behind is not None:
                results = self._merge_behind(spark, records, batch_id, work)
            else:
                futures = {
                    topic: self._pool.submit(self._merge_slice, spark, records, batch_id, topic, summary)
                    for topic, summary in work.items()
                }
                results = {t: result for t, f in futures.items() if (result := f.result()) is not None}
            idle.result()
        committed = BatchCommitted(batch_id, ends, results)
        for hook in self.on_batch:
            hook(committed)

    def _advance_idle(
        self,
        spark: SparkSession,
        batch_id: int,
        work: Mapping[str, object],
        events: Sequence[dict[str, Any]],
    ) -> None:
        """The selected tables with nothing in a batch that holds control events (progress among
        them, `events` decoded), parked ones aside (their changes wait): their marks, in one
        idle-marks commit."""
        if not events or self._checkpoint is None:
            return
        idle = [t for t in self.topics if t not in work and self.selected(t) and not self.parked.is_parked(t)]
        if not idle:
            return
        session = self._session(spark)
        # Read once for every table (each table's step is then in memory unless its position moves:
        # an idle source's batches cost no I/O per table).
        ends = watermark_io.end_offsets(session, self._checkpoint, batch_id)
        if ends is None:
            return
        stepped = (self._idle_step(session, topic, events, ends) for topic in idle)
        steps = [step for step in stepped if step is not None]
        if any(step.moved for step in steps):
            marks = [step.mark for step in steps]
            watermark_io.write_idle_marks(session, self.options.warehouse, batch_id, marks)
        elif steps and self._query_id is not None:
            # The same positions proven later: no Delta commit, the proof time in the query's file.
            proofs = [step.mark for step in steps]
            watermark_io.write_proofs(session, self.options.warehouse, self._query_id, batch_id, proofs)

    def _idle_step(
        self, session: SparkSession, topic: str, events: Sequence[dict[str, Any]], ends: Offsets
    ) -> IdleStep | None:
        merger = self.merger(topic)
        merger.mark = None  # its newest batch had nothing of it
        return merger.watermark.idle(session, events, ends)

    def _load_idle_floors(self, spark: SparkSession) -> None:
        """Each table's newest idle mark, once per query: its watermark never goes back behind it."""
        if self._idle_floors is not None:
            return
        idle = watermark_io.idle_marks(spark, self.options.warehouse, watermark_io.RECENT_IDLE_COMMITS)
        floors: dict[str, Mark] = {}
        for table, marks in idle.items():
            if (floor := newest_mark(m.mark for m in marks)) is not None:
                floors[table] = floor
        self._idle_floors = floors
        for merger in self.mergers.values():
            floor = floors.get(table_key(merger.path))
            if floor is not None:
                merger.watermark.floor = newer(floor, merger.watermark.floor)

    def _control_events(self, control_only: batch_schema.BatchSummary) -> list[dict[str, Any]]:
        """The batch's control-topic records, decoded."""
        if not control_only.control_records:
            return []
        if self._control_decoder is None:
            self._control_decoder = self._new_control_decoder()
        decode = self._control_decoder
        return [decode(value) for _, value in control_only.control_records if value is not None]

    def _new_control_decoder(self) -> control.ControlDecoder:
        schemas = None
        if self.options.schema_registry:
            from spark_jobs.connections.registry import WriterSchemas

            schemas = WriterSchemas(self.options.schema_registry, self.options.registry_config)
        return control.ControlDecoder(self.options.output_format, None if schemas is None else schemas.get)

    def _session(self, spark: SparkSession) -> SparkSession:
        """This thread's session: a new session of the application (shared tables and caches, its own
        conf), made the thread's active one."""
        session = getattr(self._sessions, "spark", None)
        if session is None:
            session = spark.newSession()
            self._sessions.spark = session
        jvm = session._jvm
        assert jvm is not None, "a classic (JVM) Spark session"
        jvm.org.apache.spark.sql.SparkSession.setActiveSession(session._jsparkSession)
        return session

    def _merge_slice(
        self,
        spark: SparkSession,
        records: DataFrame,
        batch_id: int,
        topic: str,
        summary: batch_schema.BatchSummary,
    ) -> BatchResult | None:
        from pyspark.sql import functions as F

        ranges = summary.ranges()
        session = self._session(spark)
        if self.parked.is_parked(topic):
            # Its earlier changes are not merged yet: this slice waits behind them.
            self.parked.park(session, ParkedSlice(topic, batch_id, ranges, "parked behind an earlier slice"))
            return None
        own = rebind(records.where(F.col("topic").isin(topic, self.control_topic)), session)
        try:
            return self.merger(topic).process_slice(own, batch_id, summary)
        except Exception as exc:
            if self.stopping.is_set():
                raise
            log.exception("merging %s failed in batch %s: parked with its offsets", topic, batch_id)
            self._park_failed(session, ParkedSlice(topic, batch_id, ranges, f"{topic}: {exc}"))
            return None

    def _park_failed(self, session: SparkSession, failed: ParkedSlice) -> None:
        """A slice that raised: parked with the error's first line, which the run reports."""
        error = failed.error.splitlines()[0]
        self.parked.park(session, replace(failed, error=error))
        self.errors[failed.topic] = error
        self._attempted[failed.topic] = time.monotonic()

    def _merge_behind(
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
        session = self._session(spark)
        now = {
            topic: summary
            for topic, summary in work.items()
            if (self.parked.is_parked(topic) and not self.parked.is_deferred(topic))
            or not self.merger(topic).has_mirror(session)
        }
        futures = {
            topic: self._pool.submit(self._merge_slice, spark, records, batch_id, topic, summary)
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

    def _merge_deferred(self, spark: SparkSession, topic: str, slices: list[ParkedSlice]) -> bool:
        """A table's deferred slices merged from the changelog (`mirrors_behind`'s merge): False when
        it failed, the table then parked as failed (`retry_parked` replays it)."""
        session = self._session(spark)
        batch_id = max(s.batch_id for s in slices)
        try:
            frame = changelog.read_ranges(session, self.options.warehouse, union(slices))
            merger = self.merger(topic)
            result = merger.process(frame, batch_id)
            if result is not None:
                merger.results.append(result)
        except Exception as exc:
            if self.stopping.is_set():
                raise
            log.exception("merging %s from the changelog failed: parked", topic)
            self._park_failed(session, ParkedSlice(topic, batch_id, {}, f"{topic}: {exc}"))
            return False
        with self._lock:
            self.errors.pop(topic, None)
        self._mirror_committed(topic, result)
        return True

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
            if (behind and not deferred) or (  # the schedule merges it (`_merge_behind`), or the run's end
                not (force or behind) and last is not None and now - last < self.retry_parked_s
            ):
                continue
            self._attempted[topic] = now
            due.append(topic)
        if not due:
            return
        log_, query = self.changelog, self._query_id
        logged = set() if log_ is None or query is None else log_.batches(spark, query)
        futures = {topic: self._pool.submit(self._replay_parked, spark, topic, logged) for topic in due}
        merged = [topic for topic, future in futures.items() if future.result()]
        # A run killed before this commit replays these tables again: harmless, each replay's merge
        # is idempotent (its txn) and newer-wins by (lsn, seq).
        self.parked.resolve_all(spark, merged)
        log.info("%s of %s parked table(s) merged and unparked: %s", len(merged), len(due), ", ".join(merged))

    def _replay_parked(self, spark: SparkSession, topic: str, logged: set[int]) -> bool:
        """One table of `retry_parked`: whether its parked slices merged (else its error is kept). The
        records come from the changelog when it holds every one of the slices' batches (`logged`: the
        query's batches it holds; Kafka's retention may have dropped them since), else from Kafka."""
        session = self._session(spark)
        slices, warehouse = self.parked.slices(topic), self.options.warehouse
        ranges = union(slices)
        try:
            if self.changelog is not None and {s.batch_id for s in slices} <= logged:
                frame = changelog.read_ranges(session, warehouse, ranges)
            else:
                frame = read_ranges(session, self.kafka, ranges)
            merger = self.merger(topic)
            result = merger.process(frame, max(s.batch_id for s in slices))
            if result is not None:
                merger.results.append(result)
        except Exception as exc:
            if self.stopping.is_set():
                raise
            error = f"{topic}: {exc}".splitlines()[0]
            with self._lock:
                self.errors[topic] = error
            log.warning("replaying the parked changes of %s failed: %s", topic, error)
            return False
        with self._lock:
            self.errors.pop(topic, None)
        self._mirror_committed(topic, result)
        return True
