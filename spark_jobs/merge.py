"""Merge job: every table topic's changelog -> its Delta mirror, exactly once, in LSN order.

One Structured Streaming query per table topic (subscribed together with the control topic, for
TRUNCATEs), `trigger(availableNow=True)` (read what is there, merge it, stop: a scheduler runs this
every minute or hour) or, with `--continuous`, a processing-time trigger (a micro-batch every
`--trigger-interval` seconds, the queries of all tables side by side, until stopped), a
checkpoint per table under `--checkpoints`, and `TableMerger` as the
`foreachBatch`. See docs/lakehouse.md for the semantics and the exactly-once argument.

    spark-submit --packages ... --py-files bottledwater.zip spark_jobs/merge.py --broker kafka:9092 \\
        --schema-registry http://registry:8081 --warehouse s3a://lake/bw --checkpoints s3a://lake/_cp \\
        --topic-pattern 'app\\..*'
"""

from __future__ import annotations

import logging
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kafka_contract.redaction import redact_text
from kafka_contract.topics import control_topic_name
from spark_jobs import dsn, layout, options
from spark_jobs.kafka_client import librdkafka_settings
from spark_jobs.merge_batch import BatchResult, MergeOptions, TableMerger
from spark_jobs.session import build_session

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

log = logging.getLogger(__name__)
# Kafka's own topics, never a table's.
_INTERNAL_TOPIC = re.compile(r"^(__|_schemas$|_confluent)")
# How often a continuous merge looks for new topics matching --topic-pattern, and for failed queries.
DISCOVERY_INTERVAL_S = 60.0
POLL_INTERVAL_S = 1.0


@dataclass(frozen=True)
class KafkaSource:
    """bootstrap: the brokers. options: extra Kafka source options (`kafka.security.protocol` ...).
    max_offsets_per_trigger: cap per micro-batch (None: everything available in one batch).
    fail_on_data_loss: stop when offsets the checkpoint expects were deleted by retention."""

    bootstrap: str
    options: Mapping[str, str] = field(default_factory=dict)
    max_offsets_per_trigger: int | None = None
    fail_on_data_loss: bool = True


@dataclass
class TableRun:
    topic: str
    path: str
    batches: list[BatchResult]
    error: str | None = None

    @property
    def messages(self) -> int:
        return sum(b.messages for b in self.batches)


def resolve_topics(
    kafka: KafkaSource, topics: Sequence[str] = (), pattern: str | None = None, prefix: str | None = None
) -> list[str]:
    """The table topics to merge: the list as given, or every topic matching `pattern` (full match),
    never the control topic or Kafka's internal ones."""
    chosen = list(topics)
    if pattern is not None:
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": kafka.bootstrap, **_client_options(kafka.options)})
        names = admin.list_topics(timeout=30).topics
        regex = re.compile(pattern)
        chosen += sorted(t for t in names if regex.fullmatch(t))
    control = control_topic_name(prefix)
    return [t for t in dict.fromkeys(chosen) if t != control and not _INTERNAL_TOPIC.match(t)]


def _client_options(options: Mapping[str, str]) -> dict[str, str]:
    """Spark's `kafka.`-prefixed options as librdkafka settings (for listing topics)."""
    return librdkafka_settings(options)


def start_topic(
    spark: SparkSession,
    topic: str,
    options: MergeOptions,
    kafka: KafkaSource,
    checkpoint_root: str,
    *,
    trigger_interval: float | None = None,
) -> tuple[StreamingQuery, TableMerger]:
    """Start one table's stream: `availableNow` (None), or a micro-batch every `trigger_interval`
    seconds until stopped. Each query runs its batches in a clone of the session (Spark's own
    per-query session), so the txnAppId/txnVersion that a batch sets stay its own while other
    tables' queries run beside it."""
    location = layout.location_for_topic(topic, options.topic_prefix)
    merger = TableMerger(location, options)
    control = control_topic_name(options.topic_prefix)
    reader = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", kafka.bootstrap)
        # The control topic may not exist yet (no TRUNCATE so far): a pattern subscription tolerates
        # that and picks it up, from its first offset, once the worker creates it.
        .option("subscribePattern", f"^({re.escape(topic)}|{re.escape(control)})$")
        .option("startingOffsets", "earliest")
        .option("includeHeaders", "true")
        .option("failOnDataLoss", str(kafka.fail_on_data_loss).lower())
    )
    if kafka.max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(kafka.max_offsets_per_trigger))
    for key, value in kafka.options.items():
        reader = reader.option(key, value)
    writer = (
        reader.load()
        .writeStream.queryName(f"bottledwater-merge-{location.schema}.{location.table}")
        .option("checkpointLocation", location.checkpoint(checkpoint_root))
    )
    if trigger_interval is None:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=f"{trigger_interval} seconds")
    query = writer.foreachBatch(merger).start()
    merger.bind(str(query.id))
    return query, merger


def merge_topic(
    spark: SparkSession, topic: str, options: MergeOptions, kafka: KafkaSource, checkpoint_root: str
) -> TableRun:
    """Run one table's stream until everything available now is merged."""
    query, merger = start_topic(spark, topic, options, kafka, checkpoint_root)
    query.awaitTermination()
    return TableRun(topic, merger.path, merger.results)


def run_continuous(
    spark: SparkSession,
    options: MergeOptions,
    kafka: KafkaSource,
    checkpoint_root: str,
    *,
    topics: Sequence[str] = (),
    pattern: str | None = None,
    trigger_interval: float = options.DEFAULT_TRIGGER_INTERVAL_S,
    discovery_interval: float = DISCOVERY_INTERVAL_S,
    stop: threading.Event | None = None,
) -> None:
    """Merge continuously: every selected table's query runs side by side, a micro-batch every
    `trigger_interval` seconds; topics that start matching `pattern` later are picked up (checked
    every `discovery_interval`). Returns when `stop` is set (every query stopped cleanly, each at a
    batch boundary). Raises as soon as one query fails, after stopping the others: a supervisor
    (Dagster's `continuous_merge_supervisor`) restarts the job, and the checkpoints resume it exactly
    where the commits left off."""
    stop = stop or threading.Event()
    running: dict[str, StreamingQuery] = {}
    next_discovery = 0.0
    try:
        while not stop.is_set():
            if time.monotonic() >= next_discovery:
                for topic in resolve_topics(kafka, topics, pattern, options.topic_prefix):
                    if topic not in running:
                        log.info("continuous merge of %s every %s s", topic, trigger_interval)
                        running[topic], _ = start_topic(
                            spark, topic, options, kafka, checkpoint_root, trigger_interval=trigger_interval
                        )
                next_discovery = time.monotonic() + discovery_interval
            for topic, query in running.items():
                failure = query.exception()
                if failure is not None or not query.isActive:
                    raise RuntimeError(f"the continuous merge of {topic} stopped: {failure or 'no error'}")
            stop.wait(POLL_INTERVAL_S)
    finally:
        for query in running.values():
            query.stop()


def run_merge(
    spark: SparkSession,
    options: MergeOptions,
    kafka: KafkaSource,
    checkpoint_root: str,
    *,
    topics: Sequence[str] = (),
    pattern: str | None = None,
) -> list[TableRun]:
    """Merge every selected topic, one after the other; a failing table does not stop the others,
    and its error is returned (the CLI exits non-zero)."""
    runs = []
    for topic in resolve_topics(kafka, topics, pattern, options.topic_prefix):
        try:
            runs.append(merge_topic(spark, topic, options, kafka, checkpoint_root))
        except Exception as exc:  # reported per table, and re-raised by the CLI's exit status
            log.exception("merging %s failed", topic)
            runs.append(
                TableRun(
                    topic,
                    layout.location_for_topic(topic, options.topic_prefix).path(options.warehouse),
                    [],
                    str(exc),
                )
            )
    return runs


DESCRIPTION = (
    "Merge Bottled Water Kafka changelogs into Delta tables (one per Postgres table), exactly once and "
    "in LSN order; reads what is available now and stops (or, with --continuous, keeps merging)."
)


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    dsn.redact_logs()
    args = options.build_parser("merge", DESCRIPTION).parse_args(argv)
    postgres_types, warning = dsn.merge_dsn(args.postgres_types, args.postgres_file, os.environ)
    if warning:
        log.warning(warning)
    if not args.topic and not args.topic_pattern:
        raise SystemExit("name the topics: --topic (repeatable) or --topic-pattern")
    if args.output_format == "avro" and not args.schema_registry:
        raise SystemExit("--schema-registry is required for avro topics")
    kafka_options = options.kafka_options(args.kafka_option, os.environ)
    spark = build_session(options.spark_settings(args, "bottledwater-merge"))
    merge_options = MergeOptions(
        args.warehouse,
        args.output_format,
        args.schema_registry,
        args.topic_prefix or None,
        postgres_types,
        args.history,
    )
    kafka = KafkaSource(args.broker, kafka_options, args.max_offsets_per_trigger, not args.allow_data_loss)
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
            stop=stop,
        )
        return 0
    runs = run_merge(
        spark, merge_options, kafka, args.checkpoints, topics=args.topic, pattern=args.topic_pattern
    )
    for run in runs:
        status = (
            f"FAILED: {run.error}" if run.error else f"{len(run.batches)} batches, {run.messages} messages"
        )
        print(redact_text(f"{run.topic} -> {run.path}: {status}"))
    if not runs:
        print("no topics matched", file=sys.stderr)
    return 1 if any(r.error for r in runs) or not runs else 0


if __name__ == "__main__":
    sys.exit(main())
