"""Merge job: every table topic's changelog -> its Delta mirror, exactly once, in LSN order.

One Structured Streaming query per table topic (subscribed together with the control topic, for
TRUNCATEs), `trigger(availableNow=True)` (read what is there, merge it, stop: a scheduler runs this
every minute or hour), a checkpoint per table under `--checkpoints`, and `TableMerger` as the
`foreachBatch`. See docs/lakehouse.md for the semantics and the exactly-once argument.

    spark-submit --packages ... --py-files bottledwater.zip spark_jobs/merge.py --broker kafka:9092 \\
        --schema-registry http://registry:8081 --warehouse s3a://lake/bw --checkpoints s3a://lake/_cp \\
        --topic-pattern 'app\\..*'
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kafka_contract.topics import control_topic_name
from spark_jobs import layout, options
from spark_jobs.merge_batch import BatchResult, MergeOptions, TableMerger
from spark_jobs.session import build_session

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)
# Kafka's own topics, never a table's.
_INTERNAL_TOPIC = re.compile(r"^(__|_schemas$|_confluent)")


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
    return {k.removeprefix("kafka."): v for k, v in options.items() if k.startswith("kafka.")}


def merge_topic(
    spark: SparkSession, topic: str, options: MergeOptions, kafka: KafkaSource, checkpoint_root: str
) -> TableRun:
    """Run one table's stream until everything available now is merged."""
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
    query = (
        reader.load()
        .writeStream.queryName(f"bottledwater-merge-{location.schema}.{location.table}")
        .option("checkpointLocation", location.checkpoint(checkpoint_root))
        .trigger(availableNow=True)
        .foreachBatch(merger)
        .start()
    )
    merger.bind(str(query.id))
    query.awaitTermination()
    return TableRun(topic, merger.path, merger.results)


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
    "in LSN order; reads what is available now and stops."
)


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = options.build_parser("merge", DESCRIPTION).parse_args(argv)
    if not args.topic and not args.topic_pattern:
        raise SystemExit("name the topics: --topic (repeatable) or --topic-pattern")
    if args.output_format == "avro" and not args.schema_registry:
        raise SystemExit("--schema-registry is required for avro topics")
    kafka_options = options.key_values(args.kafka_option, "--kafka-option")
    spark = build_session(options.spark_settings(args, "bottledwater-merge"))
    merge_options = MergeOptions(
        args.warehouse,
        args.output_format,
        args.schema_registry,
        args.topic_prefix or None,
        args.postgres_types,
        args.history,
    )
    kafka = KafkaSource(args.broker, kafka_options, args.max_offsets_per_trigger, not args.allow_data_loss)
    runs = run_merge(
        spark, merge_options, kafka, args.checkpoints, topics=args.topic, pattern=args.topic_pattern
    )
    for run in runs:
        status = (
            f"FAILED: {run.error}" if run.error else f"{len(run.batches)} batches, {run.messages} messages"
        )
        print(f"{run.topic} -> {run.path}: {status}")
    if not runs:
        print("no topics matched", file=sys.stderr)
    return 1 if any(r.error for r in runs) or not runs else 0


if __name__ == "__main__":
    sys.exit(main())
