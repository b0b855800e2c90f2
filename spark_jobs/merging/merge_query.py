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
exist yet and defers the other slices to the mirrors' thread (`mirrors_behind`).

The tables that wait (parked, deferred behind the changelog, idle) are `waiting_tables`' to
coordinate. `on_batch` hooks run after every table of a batch committed, with the batch id and its
end offsets per topic partition (the seam for a cross-table watermark).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kafka_contract import control
from kafka_contract.topics import control_topic_name
from spark_jobs.connections.kafka_source import KafkaSource, client_options
from spark_jobs.merge_options import MergeOptions, decoding_of
from spark_jobs.merging import batch_schema, streamed_commits
from spark_jobs.merging.changelog_writer import ChangelogWriter
from spark_jobs.merging.merge_batch import QUERY_ID_WAIT_S, BatchResult, TableMerger
from spark_jobs.merging.query_checkpoint import batch_ends
from spark_jobs.merging.streamed_commits import StreamedCommits
from spark_jobs.merging.topic_ledger import TopicLedger
from spark_jobs.merging.waiting_tables import WaitingTables
from spark_jobs.options import DEFAULT_MERGE_THREADS
from spark_jobs.rules import layout
from spark_jobs.rules.changelog_commit import query_topics
from spark_jobs.rules.watermark import Mark

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
        self.mergers: dict[str, TableMerger] = {}
        self.on_batch: list[Callable[[BatchCommitted], None]] = []
        self._query_id: str | None = None
        self._bound = threading.Event()
        self._pool = ThreadPoolExecutor(max(1, threads), thread_name_prefix="bw-merge")
        self._sessions = threading.local()
        self._lock = threading.Lock()
        self._control_decoder: control.ControlDecoder | None = None
        # The query's table topics, whose source watermark advances in batches that hold nothing of
        # them (docs/lakehouse.md); the query's checkpoint, where the watermark finds each batch's
        # end offsets.
        self.topics = tuple(topics)
        # Kafka's ids of the topics read: a batch of a topic recreated under its name fails the query.
        self.ledger = ledger
        self._checkpoint: str | None = None
        # Every batch's records in one commit before the mirrors' merges (MergeOptions.changelog).
        self.changelog = (
            ChangelogWriter(options.warehouse, decoding_of(options)) if options.changelog else None
        )
        self.waiting = WaitingTables(
            options,
            kafka,
            merger=self.merger,
            session=self._session,
            pool=self._pool,
            changelog_writer=self.changelog,
            retry_parked_s=retry_parked_s,
            threads=threads,
        )
        # The waiting tables' own, named here as the query's: what the run reports and its hooks.
        self.parked, self.behind, self.errors = self.waiting.parked, self.waiting.behind, self.waiting.errors
        self.on_mirror, self.stopping = self.waiting.on_mirror, self.waiting.stopping
        # The commits of changes produced before them (large transactions under exactly-once).
        self.streamed = StreamedCommits(options.warehouse, self._read_control_past)

    def bind(self, query_id: str, checkpoint: str | None = None) -> None:
        self._query_id = query_id
        self._checkpoint = checkpoint
        self.waiting.query_id, self.waiting.checkpoint = query_id, checkpoint
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
            if topic not in self.mergers:
                merger = TableMerger(
                    layout.location_for_topic(topic, self.options.topic_prefix), self.options
                )
                if self._query_id is not None:
                    merger.bind(self._query_id, self._checkpoint)
                merger.watermark.floor = self.waiting.floor(merger.path)
                self.mergers[topic] = merger
            return self.mergers[topic]

    def marks(self) -> dict[str, Mark | None]:
        """Each table's newest mark (None: no position yet), by topic."""
        with self._lock:
            return {topic: merger.mark for topic, merger in self.mergers.items()}

    def retry_parked(self, spark: SparkSession, *, force: bool = False, deferred: bool = False) -> None:
        """`WaitingTables.retry_parked`: the parked tables replayed, those that merge unparked."""
        self.waiting.retry_parked(spark, force=force, deferred=deferred)

    def finish_behind(self, spark: SparkSession) -> None:
        """`WaitingTables.finish_behind`: a scheduled run's last round of the deferred mirrors."""
        self.waiting.finish_behind(spark)

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
        with self._lock:
            mergers = list(self.mergers.values())
        self.waiting.load_idle_floors(spark, mergers)
        self.retry_parked(spark)
        with batch_schema.read_once(batch) as read:
            records = read
            tables, control_only = batch_schema.summarize_topics(
                records, self.control_topic, self.options.output_format
            )
            # Decoded once: the tables they name and the idle tables' watermarks both read them.
            events = self._control_events(control_only)
            commits = streamed_commits.commits_of(events)
            self.streamed.remember(spark, commits, batch_id)
            early = set().union(*(summary.early_xids for summary in tables.values()))
            if early:
                commits = self.streamed.find(spark, early, commits, batch_id)
                records = streamed_commits.resolve(records, commits)
                for summary in tables.values():
                    summary.resolved(commits)
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
            idle_topics = [t for t in self.topics if t not in work and self.selected(t)]
            idle = self._pool.submit(self.waiting.advance_idle, spark, batch_id, idle_topics, events)
            if self.behind is not None:
                results = self.waiting.merge_behind(spark, records, batch_id, work)
            else:
                futures = {
                    topic: self._pool.submit(
                        self.waiting.merge_slice, spark, records, batch_id, topic, summary
                    )
                    for topic, summary in work.items()
                }
                results = {t: result for t, f in futures.items() if (result := f.result()) is not None}
            idle.result()
        committed = BatchCommitted(batch_id, ends, results)
        for hook in self.on_batch:
            hook(committed)

    def _control_events(self, control_only: batch_schema.BatchSummary) -> list[dict[str, Any]]:
        """The batch's control-topic records, decoded."""
        if not control_only.control_records:
            return []
        if self._control_decoder is None:
            self._control_decoder = self._new_control_decoder()
        decode = self._control_decoder
        return [decode(value) for _, value in control_only.control_records if value is not None]

    def _read_control_past(
        self, spark: SparkSession, xids: set[int], batch_id: int
    ) -> streamed_commits.Commits:
        """`streamed_commits.read_control_past` from this batch's end on the control topic."""
        assert self._checkpoint is not None, "the merge query runs with a checkpoint"
        ends = batch_ends(spark, self._checkpoint, batch_id).get(self.control_topic, {})
        if self._control_decoder is None:
            self._control_decoder = self._new_control_decoder()
        settings = {"bootstrap.servers": self.kafka.bootstrap, **client_options(self.kafka.options)}
        return streamed_commits.read_control_past(
            settings, self.control_topic, ends, decode=self._control_decoder, xids=xids
        )

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
