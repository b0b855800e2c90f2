"""Changelog benchmark: the merge's one commit per batch for every table (`spark_jobs.lake.changelog`)
against the lake's raw pipe, the same Kafka records read by Spark and appended to a plain Delta table,
in the same run. Prints figures and ratios, asserts nothing, ends with one `RESULT bench=changelog …`
line.

    .venv/bin/python bench/changelog_bench.py                          # 1M changes over 10 topics
    .venv/bin/python bench/changelog_bench.py --changes 200000 --topics 50 --runs 5

`--changes` Avro messages (the worker's own `AvroEventSerializer`, no Postgres needed) spread over
`--topics` topics of two partitions. Then, `--warmup-runs` (in no figure: the session's first runs
of each are slower, JIT and caches) and `--runs` times in turn so that load drifts hit both
alike: the pipe (Kafka read, `key, value, headers` appended raw to a new Delta table) and the
changelog append (the same read, the changelog's rows: the record plus `_bw_batch`, `_bw_lsn`,
`_bw_seq`, `_bw_op`, `_bw_written`, clustered by topic, one idempotent commit with its user
metadata) into a new warehouse's changelog, created first and untimed (once per warehouse, not a
batch's cost) with the merge's table properties. The medians are compared (target: the changelog
>= 0.9x the pipe). The JVM and SparkSession start-up is timed apart and in no figure.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import worker_bench_common as common
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from confluent_kafka.schema_registry import SchemaRegistryClient
from merge_bench import PARTITIONS, produce, snapshot_events, table_schema
from pyspark.sql import DataFrame, SparkSession

from cdc_worker.core.encoding.avro_serializer import AvroEventSerializer
from shared_connections.spark_session import SparkSettings, build_session
from spark_jobs.connections.kafka_source import RECORD_COLUMNS, consumer_options
from spark_jobs.lake import changelog, delta_tables
from spark_jobs.rules.changelog_commit import ChangelogCommit


def _produce(prefix: str, topics: int, changes: int) -> list[str]:
    names = [f"t{i:03d}" for i in range(topics)]
    created = [f"{prefix}.{n}" for n in names]
    admin = AdminClient({"bootstrap.servers": common.BROKER})
    for future in admin.create_topics([NewTopic(t, PARTITIONS, 1) for t in created]).values():
        future.result(120)
    serializer = AvroEventSerializer(SchemaRegistryClient({"url": common.REGISTRY}), {}, topic_prefix=prefix)
    producer = Producer({"bootstrap.servers": common.BROKER, "linger.ms": 50, "batch.num.messages": 10000,
                         "compression.codec": "lz4"})  # fmt: skip
    for name in names:
        produce(producer, serializer, snapshot_events(table_schema(name), changes // topics))
    return created


def _records(spark: SparkSession, topics: list[str]) -> DataFrame:
    """Both sides read Kafka with the merge's consumer settings (`consumer_options`)."""
    return (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", common.BROKER)
        .option("subscribe", ",".join(topics))
        .option("includeHeaders", "true")
        .options(**consumer_options({}))
        .load()
    )


def _pipe(spark: SparkSession, topics: list[str], path: str) -> None:
    _records(spark, topics).select("key", "value", "headers").write.format("delta").save(path)


def _changelog(spark: SparkSession, topics: list[str], warehouse: str, run: int) -> None:
    commit = ChangelogCommit("bench", run, {(t, p): 0 for t in topics for p in range(PARTITIONS)})
    txn = delta_tables.Txn(f"bottledwater-changelog-bench-{run}", run)
    records = _records(spark, topics).select(*RECORD_COLUMNS)
    changelog.append(spark, warehouse, records, commit=commit, txn=txn, written=datetime.now(UTC))


def _create_changelog(spark: SparkSession, topics: list[str], warehouse: str) -> None:
    """The changelog as the merge finds it after its first batch: the table exists (its creation,
    once per warehouse, is not a batch's cost)."""
    empty = _records(spark, topics).select(*RECORD_COLUMNS).limit(0)
    txn = delta_tables.Txn("bottledwater-changelog-bench-create", 0)
    changelog.append(
        spark, warehouse, empty, commit=ChangelogCommit("bench", -1, {}), txn=txn, written=datetime.now(UTC)
    )


def _timed(action: object) -> float:
    started = time.monotonic()
    action()  # type: ignore[operator]
    return time.monotonic() - started


def _figure(messages: int, runs: list[float]) -> str:
    median = statistics.median(runs)
    return f"median {median:.1f} s ({messages / median:,.0f} rows/s); runs {common.each_run(runs)}"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--changes", type=int, default=1_000_000, help="messages (default: 1,000,000)")
    parser.add_argument("--topics", type=int, default=10, help="topics they spread over (default: 10)")
    parser.add_argument("--runs", type=int, default=3, help="timed runs of each (default: 3)")
    parser.add_argument(
        "--warmup-runs", type=int, default=1, help="first runs of each, shown apart (default: 1)"
    )
    args = parser.parse_args()
    load_before = " ".join(f"{x:.2f}" for x in os.getloadavg())
    started = time.monotonic()
    spark = build_session(SparkSettings(app_name="bottledwater-changelog-bench", driver_memory="2g"))
    spark.range(1).count()
    startup_s = time.monotonic() - started
    work = Path(tempfile.mkdtemp(prefix="changelog_bench_"))
    prefix = common.unique("clbench")
    pipe_runs: list[float] = []
    log_runs: list[float] = []
    warmup = args.warmup_runs
    try:
        topics = _produce(prefix, args.topics, args.changes)
        messages = _records(spark, topics).count()  # also warms the Kafka source's classes
        for run in range(warmup + args.runs):
            pipe_runs.append(_timed(lambda: _pipe(spark, topics, str(work / "pipe"))))
            _create_changelog(spark, topics, str(work / "warehouse"))
            log_runs.append(_timed(lambda: _changelog(spark, topics, str(work / "warehouse"), run)))  # noqa: B023
            shutil.rmtree(work / "pipe", ignore_errors=True)
            shutil.rmtree(work / "warehouse", ignore_errors=True)
    finally:
        common.delete_topics(prefix)
        shutil.rmtree(work, ignore_errors=True)
    (pipe_warmup, pipe_runs), (log_warmup, log_runs) = (
        (runs[:warmup], runs[warmup:]) for runs in (pipe_runs, log_runs)
    )
    pipe_s, log_s = statistics.median(pipe_runs), statistics.median(log_runs)
    ratio = pipe_s / log_s
    rows = [
        ("messages x topics", f"{messages:,} over {args.topics} topics of {PARTITIONS} partitions"),
        ("start-up (JVM + SparkSession), apart", f"{startup_s:.1f} s"),
        ("the lake pipe (Kafka read + raw Delta append)", _figure(messages, pipe_runs)),
        ("the changelog append (one commit)", _figure(messages, log_runs)),
        ("changelog / pipe (rate)", f"{ratio:.2f}x (target >= 0.9x)"),
        (
            f"warm-up, {warmup} of each first (apart): pipe / changelog",
            f"{common.each_run(pipe_warmup)} / {common.each_run(log_warmup)}",
        ),
        ("load average before (1, 5, 15 min)", load_before),
    ]  # fmt: skip
    common.report("changelog: one commit per batch for every table", rows)
    common.result(
        "changelog",
        messages=messages,
        topics=args.topics,
        startup_s=startup_s,
        pipe_s=pipe_s,
        changelog_s=log_s,
        changelog_vs_pipe=ratio,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
