"""The merge's Kafka source: its settings, the one subscription of every selected table topic and the
control topic, and a bounded read of given offset ranges (a parked table's replay)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from spark_jobs.connections.kafka_client import librdkafka_settings

if TYPE_CHECKING:
    from confluent_kafka.admin import AdminClient
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.readwriter import DataStreamReader

# Kafka's own topics, never a table's (a Java regex too: the subscription excludes them).
INTERNAL_TOPIC = r"(__|_schemas$|_confluent)"
# startingOffsets' spelling of "from the first offset" for one partition.
EARLIEST = -2

# The Kafka source's columns the merge reads and the changelog keeps (not timestamp, timestampType).
RECORD_COLUMNS = ("topic", "partition", "offset", "key", "value", "headers")
# (topic, partition) -> (first offset, last offset), both included.
OffsetRanges = Mapping[tuple[str, int], tuple[int, int]]

# Settings of the Kafka source's consumers unless the user sets them (`--kafka-option`).
# fetch.max.wait.ms: Spark's consumer of a topic partition, after a poll that comes back empty, asks
# the partition's first and last offsets on the same connection behind a fetch the broker holds for
# up to this long when the partition has nothing new (Kafka's default 500 ms). A task reads its
# partitions one after the other, so each cost about 500 ms: a batch over 200 one-partition topics
# took 54 s on 2 cores, 5 s at 10 ms (docs/benchmarks.md, "Many tables"). The merge only ever reads
# offsets it knows exist, so it never needs the broker to wait for new records.
# isolation.level: under the worker's --delivery exactly-once, only what a Kafka transaction
# committed is a change (an aborted transaction is published again, whole, after the restart);
# without transactions every message is committed, so it changes nothing there. Offsets then have
# gaps (commit markers, aborted messages): the merge reads to the checkpoint's planned ends and keeps
# each record's own offset, and assumes nothing of the offsets in between.
CONSUMER_DEFAULTS: Mapping[str, str] = {
    "kafka.fetch.max.wait.ms": "10",
    "kafka.isolation.level": "read_committed",
}


@dataclass(frozen=True)
class KafkaSource:
    """bootstrap: the brokers. options: extra Kafka source options (`kafka.security.protocol` ...).
    max_offsets_per_trigger: cap per micro-batch (None: everything available in one batch).
    fail_on_data_loss: stop when offsets the checkpoint expects were deleted by retention."""

    bootstrap: str
    options: Mapping[str, str] = field(default_factory=dict)
    max_offsets_per_trigger: int | None = None
    fail_on_data_loss: bool = True


def subscription(topics: Sequence[str], pattern: str | None, control: str) -> str:
    """One Java regular expression (Spark's `subscribePattern`, full match) for the named topics, the
    topics matching `pattern` (never Kafka's internal ones) and the control topic. A pattern
    subscription also picks up topics created later, from their first offset."""
    chosen = [re.escape(t) for t in topics]
    if pattern is not None:
        chosen.append(f"(?!{INTERNAL_TOPIC})(?:{pattern})")
    return "^(?:" + "|".join([*chosen, re.escape(control)]) + ")$"


def client_options(options: Mapping[str, str]) -> dict[str, str]:
    """Spark's `kafka.`-prefixed options as librdkafka settings (for listing topics)."""
    return librdkafka_settings(options)


def consumer_options(options: Mapping[str, str]) -> dict[str, str]:
    """The user's Kafka source options over `CONSUMER_DEFAULTS`."""
    return {**CONSUMER_DEFAULTS, **options}


def list_partitions(kafka: KafkaSource) -> dict[str, list[int]]:
    """Every topic of the cluster with its partition ids."""
    admin = admin_client(kafka)
    return {name: sorted(meta.partitions) for name, meta in admin.list_topics(timeout=30).topics.items()}


def admin_client(kafka: KafkaSource) -> AdminClient:
    """An admin client of the source's cluster, with its `--kafka-option`s' security settings."""
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": kafka.bootstrap, **client_options(kafka.options)})


def topic_ids(admin: AdminClient, topics: Sequence[str]) -> dict[str, str]:
    """Kafka's id of each of `topics` that exists (a topic deleted and created again gets a new one);
    a topic that does not exist is left out. One request for all of them."""
    from confluent_kafka import KafkaError, KafkaException, TopicCollection

    if not topics:
        return {}
    found: dict[str, str] = {}
    for topic, future in admin.describe_topics(TopicCollection(list(topics)), request_timeout=30).items():
        try:
            found[topic] = str(future.result().topic_id)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                raise
    return found


def stream_reader(spark: SparkSession, kafka: KafkaSource, pattern: str, starting: str) -> DataStreamReader:
    reader = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", kafka.bootstrap)
        .option("subscribePattern", pattern)
        .option("startingOffsets", starting)
        .option("includeHeaders", "true")
        .option("failOnDataLoss", str(kafka.fail_on_data_loss).lower())
    )
    if kafka.max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(kafka.max_offsets_per_trigger))
    return reader.options(**consumer_options(kafka.options))


def read_ranges(spark: SparkSession, kafka: KafkaSource, ranges: OffsetRanges) -> DataFrame:
    """The records of the given ranges (a batch read, no checkpoint)."""
    assign: dict[str, list[int]] = {}
    starting: dict[str, dict[str, int]] = {}
    ending: dict[str, dict[str, int]] = {}
    for (topic, partition), (first, last) in sorted(ranges.items()):
        assign.setdefault(topic, []).append(partition)
        starting.setdefault(topic, {})[str(partition)] = first
        ending.setdefault(topic, {})[str(partition)] = last + 1  # endingOffsets is exclusive
    reader = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", kafka.bootstrap)
        .option("assign", json.dumps(assign))
        .option("startingOffsets", json.dumps(starting))
        .option("endingOffsets", json.dumps(ending))
        .option("includeHeaders", "true")
        .option("failOnDataLoss", str(kafka.fail_on_data_loss).lower())
    )
    return reader.options(**consumer_options(kafka.options)).load()
