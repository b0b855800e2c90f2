"""Merge job: every table topic's changelog -> its Delta mirror, exactly once, in LSN order.

One Structured Streaming query for every selected table topic and the control topic (for TRUNCATEs
and DDL), `trigger(availableNow=True)` (read what is there, merge it, stop: a scheduler runs this
every minute or hour) or, with `--continuous`, a processing-time trigger (a micro-batch every
`--trigger-interval` seconds until stopped), one checkpoint (`<checkpoints>/_bw_merge`), and
`merge_query.AllTablesMerger` as the `foreachBatch`: it merges each table's slice of the batch with
its `TableMerger`. Topics matching `--topic-pattern` later join without a restart. See
docs/lakehouse.md for the semantics, the exactly-once argument and a table that fails.

    spark-submit --packages ... --py-files bottledwater.zip spark_jobs/merge.py --broker kafka:9092 \\
        --schema-registry http://registry:8081 --warehouse s3a://lake/bw --checkpoints s3a://lake/_cp \\
        --topic-pattern 'app\\..*'
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kafka_contract.redaction import redact_text
from kafka_contract.topics import control_topic_name
from shared_connections.spark_session import build_session
from spark_jobs import option_parser, options
from spark_jobs.connections import dsn, postgres_connect
from spark_jobs.connections.kafka_source import (
    INTERNAL_TOPIC,
    KafkaSource,
    list_partitions,
    stream_reader,
    subscription,
)
from spark_jobs.errors import ConfigurationError
from spark_jobs.job_main import exit_on_error
from spark_jobs.lake import changelog
from spark_jobs.merge_options import MergeOptions, options_from_args
from spark_jobs.merging.commit_report import CommitReport
from spark_jobs.merging.merge_batch import BatchResult
from spark_jobs.merging.merge_query import AllTablesMerger
from spark_jobs.merging.query_checkpoint import committed_offsets, query_checkpoint, starting_offsets
from spark_jobs.merging.topic_ledger import TopicLedger
from spark_jobs.options import DEFAULT_MERGE_THREADS
from spark_jobs.rules import layout

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

log = logging.getLogger(__name__)
_INTERNAL = re.compile(INTERNAL_TOPIC)
POLL_INTERVAL_S = 1.0
QUERY_NAME = "bottledwater-merge"

__all__ = [
    "ChangelogRequired",
    "KafkaSource",
    "MergeOptions",
    "TableRun",
    "main",
    "resolve_topics",
    "run_continuous",
    "run_merge",
    "start_query",
]


class ChangelogRequired(ConfigurationError):
    """The warehouse keeps a changelog and the merge was started without it."""


@dataclass
class TableRun:
    topic: str
    path: str
    batches: list[BatchResult]
    error: str | None = None
    # Left behind the changelog by --mirror-budget with --no-catch-up: its changes wait there.
    deferred: bool = False

    @property
    def messages(self) -> int:
        return sum(b.messages for b in self.batches)


def _subscribed(topics: Sequence[str], pattern: str | None, control: str) -> Callable[[str], bool]:
    """`kafka_source.subscription` in Python: whether the query reads a topic."""
    regex = None if pattern is None else re.compile(pattern)
    named = set(topics)

    def reads(topic: str) -> bool:
        if topic == control or topic in named:
            return True
        return regex is not None and not _INTERNAL.match(topic) and regex.fullmatch(topic) is not None

    return reads


def table_selector(topics: Sequence[str], pattern: str | None, prefix: str | None) -> Callable[[str], bool]:
    """Whether a topic is a table topic to merge: subscribed, not the control topic, and named as
    `[prefix.][schema.]table` (any other topic the pattern matches is not a table's)."""
    control = control_topic_name(prefix)
    reads = _subscribed(topics, pattern, control)

    def selected(topic: str) -> bool:
        return topic != control and reads(topic) and layout.is_table_topic(topic, prefix)

    return selected


def resolve_topics(
    kafka: KafkaSource, topics: Sequence[str] = (), pattern: str | None = None, prefix: str | None = None
) -> list[str]:
    """The table topics to merge that exist now: the list as given, and every topic matching
    `pattern` (full match), never the control topic or Kafka's internal ones."""
    selected = table_selector(topics, pattern, prefix)
    existing = list_partitions(kafka) if pattern is not None else {}
    return [t for t in dict.fromkeys([*topics, *sorted(existing)]) if selected(t)]


def start_query(
    spark: SparkSession,
    options: MergeOptions,
    kafka: KafkaSource,
    checkpoint_root: str,
    *,
    topics: Sequence[str] = (),
    pattern: str | None = None,
    trigger_interval: float | None = None,
    threads: int = DEFAULT_MERGE_THREADS,
) -> tuple[StreamingQuery, AllTablesMerger]:
    """Start the one merge query: `availableNow` (None), or a micro-batch every `trigger_interval`
    seconds until stopped. A first start next to per-table checkpoints resumes from them
    (`query_checkpoint.starting_offsets`). The topics its checkpoint holds are merged too, selected
    or not (a topic the checkpoint holds and Kafka no longer does fails the query as data loss,
    unless `fail_on_data_loss` is off: reset the checkpoint after deleting topics). A topic the query
    or the changelog read before and Kafka has since recreated under its name is refused
    (`TopicRecreated`), before anything is read."""
    if options.postgres:  # a wrong CA, host or password stops the merge here, in one line
        postgres_connect.check(options.postgres)
    if options.mirror_budget_s is not None and not options.changelog:
        raise ChangelogRequired(
            "--mirror-budget merges the mirrors behind the lake's changelog: keep the changelog (--changelog)"
        )
    if not options.changelog and changelog.exists(spark, options.warehouse):
        # A batch merged without it would be missing from it for good, unseen by its readers.
        raise ChangelogRequired(
            f"{layout.changelog_path(options.warehouse)} holds this warehouse's changelog: merge with "
            "it (drop --no-changelog), or delete that directory to stop keeping one"
        )
    control = control_topic_name(options.topic_prefix)
    # A topic the checkpoint holds stays in the query even when no longer selected: Spark takes a
    # partition that leaves the subscription for one deleted, and fails on the data loss.
    held = committed_offsets(spark, query_checkpoint(checkpoint_root)) or {}
    topics = [*topics, *(t for t in sorted(held) if t != control and t not in topics)]
    reads = _subscribed(topics, pattern, control)
    partitions = {t: p for t, p in list_partitions(kafka).items() if reads(t)}
    starting = starting_offsets(spark, checkpoint_root, partitions, control, options.topic_prefix)
    ledger = TopicLedger(kafka, query_checkpoint(checkpoint_root))
    head = changelog.newest(spark, options.warehouse) if options.changelog else None
    ledger.open(spark, partitions, {} if head is None else head.topic_ids)
    merger = AllTablesMerger(
        options,
        kafka,
        table_selector(topics, pattern, options.topic_prefix),
        threads=threads,
        topics=sorted(partitions),
        ledger=ledger,
    )
    writer = (
        stream_reader(spark, kafka, subscription(topics, pattern, control), starting)
        .load()
        .writeStream.queryName(QUERY_NAME)
        .option("checkpointLocation", query_checkpoint(checkpoint_root))
    )
    if trigger_interval is None:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=f"{trigger_interval} seconds")
    query = writer.foreachBatch(merger).start()
    merger.bind(str(query.id), query_checkpoint(checkpoint_root))
    return query, merger


def run_continuous(
    spark: SparkSession,
    options: MergeOptions,
    kafka: KafkaSource,
    checkpoint_root: str,
    *,
    topics: Sequence[str] = (),
    pattern: str | None = None,
    trigger_interval: float = options.DEFAULT_TRIGGER_INTERVAL_S,
    threads: int = DEFAULT_MERGE_THREADS,
    stop: threading.Event | None = None,
) -> None:
    """Merge continuously: the one query runs a micro-batch every `trigger_interval` seconds; topics
    that start matching `pattern` later join it. Returns when `stop` is set (the query stopped at a
    batch boundary). Raises when the query fails (a table's failure parks the table instead): a
    supervisor (Dagster's `continuous_merge_supervisor`) restarts the job, and the checkpoint resumes
    it exactly where the commits left off."""
    stop = stop or threading.Event()
    query, merger = start_query(
        spark,
        options,
        kafka,
        checkpoint_root,
        topics=topics,
        pattern=pattern,
        trigger_interval=trigger_interval,
        threads=threads,
    )
    log.info("continuous merge of %s every %s s", pattern or list(topics), trigger_interval)
    report = _report_commits(merger, options)
    try:
        while not stop.is_set():
            failure = query.exception()
            if failure is not None or not query.isActive:
                raise RuntimeError(f"the continuous merge stopped: {failure or 'no error'}")
            report.flush(time.time())
            stop.wait(POLL_INTERVAL_S)
    finally:
        merger.stopping.set()
        query.stop()
        merger.close()
        # What the last window held back: the supervisor's view ends on the lake's last commits.
        report.flush(time.time(), force=True)


def _report_commits(merger: AllTablesMerger, options: MergeOptions) -> CommitReport:
    """The continuous merge's commits as `commit_report` lines (Dagster's materializations)."""
    report = CommitReport(options.warehouse, options.topic_prefix)
    writer = merger.changelog
    merger.on_batch.append(
        lambda batch: report.batch(
            batch, None if writer is None else writer.head, merger.marks(), time.time()
        )
    )
    marks = merger.marks
    merger.on_mirror.append(
        lambda topic, result: report.mirror(topic, result, marks().get(topic), time.time())
    )
    return report


def run_merge(
    spark: SparkSession,
    options: MergeOptions,
    kafka: KafkaSource,
    checkpoint_root: str,
    *,
    topics: Sequence[str] = (),
    pattern: str | None = None,
    threads: int = DEFAULT_MERGE_THREADS,
    catch_up: bool = True,
) -> list[TableRun]:
    """Merge what every selected topic holds now, in one query; a failing table does not stop the
    others: it is parked (replayed by the next run) and its error returned (the CLI exits non-zero).
    With `MergeOptions.mirror_budget_s`, the mirrors the budget left behind the changelog are merged
    before it returns, unless not `catch_up`."""
    query, merger = start_query(
        spark, options, kafka, checkpoint_root, topics=topics, pattern=pattern, threads=threads
    )
    try:
        query.awaitTermination()
        merger.finish_behind(spark)
        # Tables parked by an earlier run, when this one had no batch to replay them in.
        merger.retry_parked(spark, deferred=catch_up)
    finally:
        merger.close()
    names = {*resolve_topics(kafka, topics, pattern, options.topic_prefix), *merger.mergers}
    runs = []
    for topic in sorted(names | set(merger.parked.topics())):
        location = layout.location_for_topic(topic, options.topic_prefix)
        merger_of = merger.mergers.get(topic)
        batches = merger_of.results if merger_of is not None else []
        deferred = merger.parked.is_deferred(topic)
        runs.append(
            TableRun(topic, location.path(options.warehouse), batches, merger.errors.get(topic), deferred)
        )
    return runs


DESCRIPTION = (
    "Merge Bottled Water Kafka changelogs into Delta tables (one per Postgres table), exactly once and "
    "in LSN order; reads what is available now and stops (or, with --continuous, keeps merging)."
)


@exit_on_error
def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    dsn.redact_logs()
    args = option_parser.build_parser("merge", DESCRIPTION).parse_args(argv)
    postgres_types, warning = dsn.merge_dsn(args.postgres_types, args.postgres_file, os.environ)
    if warning:
        log.warning(warning)
    if not args.topic and not args.topic_pattern:
        raise ConfigurationError("name the topics: --topic (repeatable) or --topic-pattern")
    if args.output_format == "avro" and not args.schema_registry:
        raise ConfigurationError("--schema-registry is required for avro topics")
    kafka_options = option_parser.kafka_options(args.kafka_option, os.environ)
    if postgres_types:  # before Spark starts: a wrong CA, host or password in one line, at once
        postgres_connect.check(postgres_types)
    spark = build_session(option_parser.spark_settings(args, "bottledwater-merge"))
    merge_options = options_from_args(args, postgres=postgres_types)
    kafka = KafkaSource(args.broker, kafka_options, args.max_offsets_per_trigger, not args.allow_data_loss)
    return _run(spark, args, merge_options, kafka)


def _run(
    spark: SparkSession, args: argparse.Namespace, merge_options: MergeOptions, kafka: KafkaSource
) -> int:
    if args.continuous:
        stop = threading.Event()
        # SIGTERM (Dagster terminating the run, a pod stopping) ends the queries at a batch boundary.
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        run_continuous(
            spark,
            merge_options,
            kafka,
            args.checkpoints,
            topics=args.topic,
            pattern=args.topic_pattern,
            trigger_interval=args.trigger_interval,
            threads=args.merge_threads,
            stop=stop,
        )
        return 0
    runs = run_merge(
        spark,
        merge_options,
        kafka,
        args.checkpoints,
        topics=args.topic,
        pattern=args.topic_pattern,
        threads=args.merge_threads,
        catch_up=not args.no_catch_up,
    )
    for run in runs:
        status = (
            f"FAILED: {run.error}" if run.error else f"{len(run.batches)} batches, {run.messages} messages"
        )
        if run.deferred:
            status += "; more waiting in the changelog (merged behind it by a later run)"
        print(redact_text(f"{run.topic} -> {run.path}: {status}"))
    if not runs:
        print("no topics matched", file=sys.stderr)
    return 1 if any(r.error for r in runs) or not runs else 0


if __name__ == "__main__":
    sys.exit(main())
