"""The per-table floor of a merge: Spark jobs and seconds of one small table's batch (a 1-row change
into a 100-row mirror), with the session as the merge builds it and with each Spark or Delta setting
that could lower the floor, and the baseline: the same Kafka range appended raw to a plain Delta
table (one commit, no MERGE), measured in the same run and interleaved round by round (load on a
shared machine slows every lever alike). Prints each lever's median seconds and jobs per batch and
its ratio to the session's own (and the append's rate over the merge's as `session_vs_append`),
asserts nothing, ends with one `RESULT bench=table_floor ...` line.

    .venv/bin/python bench/table_floor_bench.py [--rounds 12] [--rows 100] [--history]
    TZ=Europe/Paris .venv/bin/python bench/table_floor_bench.py   # a JVM not on UTC

Jobs are counted from the SparkContext's job ids (one probe job before and after each batch), so
they include the Kafka read, the decode, the MERGE and every commit of the batch. `--history` also
keeps the SCD type 2 table (a busy table with history). Steady state: a warm-up of `--warmup`
batches runs before the rounds.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import worker_bench_common as common
from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from merge_bench import (
    BASE_LSN,
    PARTITIONS,
    _kafka_range,
    end_offsets,
    produce,
    row,
    snapshot_events,
    table_schema,
)
from pyspark.sql import SparkSession

from cdc_worker.core.encoding.avro_serializer import AvroEventSerializer
from cdc_worker.core.model import ChangeEvent, Op
from shared_connections.spark_session import SparkSettings, build_session
from spark_jobs.merge_options import MergeOptions
from spark_jobs.merging.merge_batch import TableMerger
from spark_jobs.rules.layout import location_for_topic

# Each lever: the SQL settings it changes for its rounds (runtime settings, set and reset per batch).
LEVERS: dict[str, dict[str, str]] = {
    "session": {},
    "snapshot_partitions_1": {"spark.databricks.delta.snapshotPartitions": "1"},
    "aqe_off": {"spark.sql.adaptive.enabled": "false"},
    "shuffle_1": {"spark.sql.shuffle.partitions": "1"},
    "no_stats": {"spark.databricks.delta.stats.collect": "false"},
    "no_checksum": {"spark.databricks.delta.writeChecksumFile.enabled": "false"},
}


# The baseline: the same Kafka range appended raw to a plain Delta table (the lake pipe's floor).
APPEND = "plain_append"


class JobCounter:
    """Spark jobs run between two probes: job ids are handed out in order by the SparkContext."""

    def __init__(self, spark: SparkSession) -> None:
        self.spark = spark
        self.probes = 0

    def probe(self) -> int:
        context = self.spark.sparkContext
        self.probes += 1
        group = f"floor-probe-{self.probes}"
        context.setJobGroup(group, "probe")
        context.parallelize([1], 1).count()
        context.setJobGroup("", "")
        (job,) = context.statusTracker().getJobIdsForGroup(group)
        return int(job)

    def jobs_of(self, action: Callable[[], None]) -> tuple[int, float]:
        before = self.probe()
        started = time.monotonic()
        action()
        seconds = time.monotonic() - started
        return self.probe() - before - 1, seconds


def one_change(schema_name: str, key: int, version: int) -> ChangeEvent:
    schema = table_schema(schema_name)
    at = datetime(2024, 1, 2, tzinfo=UTC)
    return ChangeEvent(
        Op.UPDATE, schema, (str(key),), row(key, version), (), BASE_LSN + version, 0, version, at
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--history", action="store_true", help="keep the SCD type 2 table too")
    args = parser.parse_args()

    prefix = common.unique("floor")
    name = "floor"
    topic = f"{prefix}.{name}"
    common.create_topic(topic, PARTITIONS)
    serializer = AvroEventSerializer(SchemaRegistryClient({"url": common.REGISTRY}), {}, topic_prefix=prefix)
    producer = Producer({"bootstrap.servers": common.BROKER, "linger.ms": "5"})
    spark = build_session(SparkSettings(app_name="table-floor-bench"))
    counter = JobCounter(spark)
    jvm_zone = spark.sparkContext._jvm.java.util.TimeZone.getDefault().getID()  # type: ignore[union-attr]
    figures: dict[str, list[tuple[int, float]]] = {lever: [] for lever in [*LEVERS, APPEND]}
    version = 1
    with tempfile.TemporaryDirectory(prefix="floor-") as work:
        options = MergeOptions(
            str(Path(work) / "warehouse"), "avro", common.REGISTRY, prefix, history=args.history
        )
        merger = TableMerger(location_for_topic(topic, prefix), options)
        merger.bind("floor-bench")
        schema = table_schema(name)
        produce(producer, serializer, snapshot_events(schema, args.rows))
        position = end_offsets(topic)
        merger(_kafka_range(spark, topic, None, position), 0)

        appended = str(Path(work) / "appended")

        def batch(settings: dict[str, str] | None) -> tuple[int, float]:
            """One change merged under `settings`, or with None appended raw (the baseline)."""
            nonlocal version, position
            version += 1
            produce(producer, serializer, [one_change(name, version % args.rows, version)])
            end = end_offsets(topic)
            frame = _kafka_range(spark, topic, position, end)
            if settings is None:
                position = end
                return counter.jobs_of(lambda: frame.write.format("delta").mode("append").save(appended))
            previous = {key: spark.conf.get(key, None) for key in settings}
            for key, value in settings.items():
                spark.conf.set(key, value)
            try:
                measured = counter.jobs_of(lambda: merger(frame, version))
            finally:
                for key, value in previous.items():
                    if value is None:
                        spark.conf.unset(key)
                    else:
                        spark.conf.set(key, value)
            position = end
            return measured

        for _ in range(args.warmup):
            batch({})
        for _ in range(args.rounds):
            for lever, settings in [*LEVERS.items(), (APPEND, None)]:
                figures[lever].append(batch(settings))
    spark.stop()
    common.delete_topics(prefix)

    session_s = statistics.median(s for _, s in figures["session"])
    lines = []
    result: dict[str, object] = {"rows": args.rows, "history": int(args.history), "jvm_timezone": jvm_zone}
    for lever, measured in figures.items():
        jobs = statistics.median(j for j, _ in measured)
        seconds = statistics.median(s for _, s in measured)
        lines.append(
            (lever, f"{jobs:5.1f} jobs  {seconds:6.3f} s  ({seconds / session_s:4.2f}x the session's)")
        )
        result[f"{lever}_jobs"] = jobs
        result[f"{lever}_s"] = seconds
    result["session_vs_append"] = statistics.median(s for _, s in figures[APPEND]) / session_s
    common.report(
        f"one table's batch: 1-row change into a {args.rows}-row mirror"
        f"{' with history' if args.history else ''}, median of {args.rounds} (JVM zone {jvm_zone})",
        lines,
    )
    common.result("table_floor", **result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
