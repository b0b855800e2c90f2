"""Many tables benchmark: one merge query for hundreds of small tables, against a query per table
(what the merge did before) measured in the same run. Prints figures and ratios, asserts nothing,
and ends with one `RESULT bench=many_tables …` line.

    .venv/bin/python bench/many_tables_bench.py                   # 200 tables x 100 rows
    .venv/bin/python bench/many_tables_bench.py --tables 50 --legacy-tables 10

N topics of one partition each receive `--rows` snapshot rows, then one transaction that updates
one row of every table (the worker's own `AvroEventSerializer`, no Postgres needed). Then, in one
Spark session:

- start-up: the JVM and the SparkSession with Delta (what every scheduled run pays first);
- the one query (`run_merge` with a topic pattern): the snapshot (N new mirrors), then the
  transaction touching every table (with Delta's cache of table logs cleared first, so that every
  mirror's log is replayed as in a new process), then an idle run (nothing new): wall time and
  seconds per table;
- the baseline: one availableNow query per table over `--legacy-tables` of them (the former
  `run_merge`: each its own checkpoint, batch and Delta commits), its seconds per table and the
  ratio to the one query's.

Targets: <= 0.1 s per table start-up included (<= 20 s for 200), an idle run <= 15 s.

With `--changelog --mirror-budget S` the transaction's run merges the mirrors behind the changelog
(S seconds of mirror merges per batch, the rest left behind: `--no-catch-up`), after the worker's
progress event for it (made here, offsets = the topics' ends); then a consistent read of every table
through the changelog (each mirror plus its tail) is timed in the warm session (the median of
`READS` reads one after another, each printed), and a run that catches every mirror up.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import tempfile
import time
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import worker_bench_common as common
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from confluent_kafka.schema_registry import SchemaRegistryClient
from pyspark.sql import SparkSession

from cdc_worker.core.encoding.avro_serializer import AvroEventSerializer
from cdc_worker.core.model import ChangeEvent, Op, TableSchema
from kafka_contract.topics import control_topic_name
from shared_connections.spark_session import SparkSettings, build_session
from spark_jobs.connections.kafka_source import KafkaSource, stream_reader
from spark_jobs.merge import run_merge
from spark_jobs.merge_options import MergeOptions
from spark_jobs.merging.merge_batch import TableMerger
from spark_jobs.options import DEFAULT_MIRROR_BUDGET_S
from spark_jobs.rules import layout
from spark_jobs.rules.layout import location_for_topic

BASE_LSN = 1 << 32
# Consistent reads timed one after another in the warm session; the median is the figure (a
# session's JIT keeps compiling the analyzer's paths over its first reads).
READS = 3


def _schema(index: int, name: str) -> TableSchema:
    from merge_bench import table_schema

    base = table_schema(name)
    return TableSchema(1000 + index, "public", name, base.columns, key_columns=("id",))


def _produce(prefix: str, tables: int, rows: int) -> list[str]:
    """Every table's snapshot, then one transaction updating one row of each. Returns the topics."""
    from merge_bench import produce, row

    names = [f"t{i:04d}" for i in range(tables)]
    topics = [f"{prefix}.{n}" for n in names]
    admin = AdminClient({"bootstrap.servers": common.BROKER})
    # The control topic too: the stack's Kafka creates no topic on a first write.
    created = [NewTopic(t, 1, 1) for t in [*topics, control_topic_name(prefix)]]
    for future in admin.create_topics(created).values():
        future.result(120)
    serializer = AvroEventSerializer(SchemaRegistryClient({"url": common.REGISTRY}), {}, topic_prefix=prefix)
    producer = Producer({"bootstrap.servers": common.BROKER, "linger.ms": 50})
    at = datetime(2024, 1, 1, tzinfo=UTC)
    events = []
    for index, name in enumerate(names):
        schema = _schema(index, name)
        events += [
            ChangeEvent(Op.READ, schema, (str(k),), row(k, 0), (), BASE_LSN, k, 1, at) for k in range(rows)
        ]
    produce(producer, serializer, events)
    txn = [
        ChangeEvent(Op.UPDATE, _schema(i, n), ("0",), row(0, 1), (), BASE_LSN + 1, i, 2, at)
        for i, n in enumerate(names)
    ]
    produce(producer, serializer, txn)
    return topics


def _legacy(spark: SparkSession, options: MergeOptions, topics: list[str], checkpoints: str) -> None:
    """What `run_merge` was: one availableNow query per table topic, one after the other."""
    control = control_topic_name(options.topic_prefix)
    for topic in topics:
        merger = TableMerger(location_for_topic(topic, options.topic_prefix), options)
        query = (
            stream_reader(
                spark, KafkaSource(common.BROKER), f"^({re.escape(topic)}|{re.escape(control)})$", "earliest"
            )
            .load()
            .writeStream.option("checkpointLocation", merger.location.checkpoint(checkpoints))
            .trigger(availableNow=True)
            .foreachBatch(merger)
            .start()
        )
        merger.bind(str(query.id))
        query.awaitTermination()


def _changelog_commit_time(spark: SparkSession, warehouse: str) -> float:
    """Epoch seconds of the changelog's newest batch commit."""
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    from spark_jobs.lake import changelog

    version = changelog.commits(spark, warehouse, changelog.RECENT_COMMITS)[-1][0]
    history = DeltaTable.forPath(spark, layout.changelog_path(warehouse)).history()
    return float(history.where(F.col("version") == version).select("timestamp").head()[0].timestamp())


def _progress(prefix: str, topics: list[str], lsn: int, serializer: AvroEventSerializer) -> None:
    """The worker's progress event: every transaction up to `lsn` lies below the topics' ends."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": common.BROKER, "group.id": common.unique("ends")})
    try:
        ends = {(t, 0): consumer.get_watermark_offsets(TopicPartition(t, 0), 30)[1] for t in topics}
    finally:
        consumer.close()
    message = serializer.progress(lsn, datetime.now(UTC), ends)
    producer = Producer({"bootstrap.servers": common.BROKER})
    failures: list[object] = []
    producer.produce(
        message.topic,
        message.value,
        message.key,
        headers=message.headers,
        # flush() counts what is still queued, not what failed: a delivery error shows only here.
        on_delivery=lambda error, _: failures.append(error) if error else None,
    )
    if producer.flush(60) != 0 or failures:
        raise RuntimeError(f"Kafka did not acknowledge the progress event: {failures}")
    assert message.topic == control_topic_name(prefix)


def _timed(action: object) -> float:
    started = time.monotonic()
    action()  # type: ignore[operator]
    return time.monotonic() - started


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tables", type=int, default=200, help="tables (default: 200)")
    parser.add_argument("--rows", type=int, default=100, help="snapshot rows per table (default: 100)")
    parser.add_argument(
        "--legacy-tables", type=int, default=20, help="tables of the per-table baseline (default: 20)"
    )
    parser.add_argument("--merge-threads", type=int, default=2, help="tables merged at once (default: 2)")
    parser.add_argument(
        "--changelog",
        action="store_true",
        help="merge with the lake's changelog, and time when it held the transaction",
    )
    parser.add_argument(
        "--mirror-budget",
        type=float,
        help="with --changelog: the transaction's run merges mirrors behind the changelog within S s",
    )
    parser.add_argument(
        "--no-lake-flags",
        action="store_true",
        help="the merge as `spark_jobs.merge` runs it given no lake flags: the changelog, and the "
        "default mirror budget; the read given nothing but the warehouse and the names",
    )
    args = parser.parse_args()
    if args.no_lake_flags:
        args.changelog, args.mirror_budget = True, DEFAULT_MIRROR_BUDGET_S
    if args.mirror_budget is not None and not args.changelog:
        parser.error("--mirror-budget needs --changelog")
    load_before = " ".join(f"{x:.2f}" for x in os.getloadavg())
    started = time.monotonic()
    spark = build_session(SparkSettings(app_name="bottledwater-many-tables-bench", driver_memory="2g"))
    spark.range(1).count()
    startup_s = time.monotonic() - started
    work = Path(tempfile.mkdtemp(prefix="many_tables_bench_"))
    prefix = common.unique("mtbench")
    n_tables = args.tables
    try:
        topics = _produce(prefix, args.tables, args.rows)
        options = MergeOptions(
            str(work / "warehouse"), "avro", common.REGISTRY, prefix, changelog=args.changelog
        )
        kafka = KafkaSource(common.BROKER)
        pattern = re.escape(prefix) + r"\..*"

        behind = replace(options, mirror_budget_s=args.mirror_budget)

        def merge(opts: MergeOptions = options, catch_up: bool = True) -> None:
            runs = run_merge(
                spark,
                opts,
                kafka,
                str(work / "cp"),
                pattern=pattern,
                threads=args.merge_threads,
                catch_up=catch_up,
            )
            failed = [r.topic for r in runs if r.error]
            if failed:
                raise RuntimeError(f"the merge failed for {failed}")

        serializer = AvroEventSerializer(
            SchemaRegistryClient({"url": common.REGISTRY}), {}, topic_prefix=prefix
        )
        # As the worker would after them: the snapshot and the first transaction proven, so that every
        # mirror's first version has a watermark, as with the real worker.
        _progress(prefix, topics, BASE_LSN + 1, serializer)
        # The snapshot and the transaction arrive together here: the first run creates every mirror
        # and merges both; a second producer round then gives the run with one change per table.
        first_s = _timed(merge)
        from merge_bench import produce, row

        producer = Producer({"bootstrap.servers": common.BROKER, "linger.ms": 50})
        at = datetime(2024, 1, 2, tzinfo=UTC)
        second = [
            ChangeEvent(
                Op.UPDATE, _schema(i, topic.split(".")[-1]), ("1",), row(1, 2), (), BASE_LSN + 2, i, 3, at
            )
            for i, topic in enumerate(topics)
        ]
        produce(producer, serializer, second)
        _progress(prefix, topics, BASE_LSN + 2, serializer)
        # As a scheduled run in a new process would: every mirror's Delta log replayed, none cached.
        spark._jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()  # type: ignore[union-attr]
        txn_started = time.time()
        txn_s = _timed(lambda: merge(behind, catch_up=args.mirror_budget is None))
        # The changelog's commit of the transaction (its newest batch commit): when it was in the lake.
        in_lake_s = _changelog_commit_time(spark, options.warehouse) - txn_started if args.changelog else None
        read_s = caught_up_s = None
        if args.mirror_budget is not None:
            from spark_jobs.reading.consistent import NoCommonWatermark, read_consistent

            names = [f"public.{t.split('.')[-1]}" for t in topics]
            try:
                reads = []
                for _ in range(READS):
                    began = time.monotonic()
                    # Nothing but the warehouse and the names: the changelog records its decoding.
                    read = read_consistent(spark, options.warehouse, names)
                    reads.append(time.monotonic() - began)
            except NoCommonWatermark as exc:
                # A run without any proven position would land here: reported, not measured.
                print(f"no consistent read through the changelog: {str(exc)[:200]}")
            else:
                read_s = statistics.median(reads)
                tails = sum(1 for t in read.tables.values() if t.tail_after is not None)
                print(f"read at {read.position} (txn at {BASE_LSN + 2}): {tails} of {n_tables} with a tail")
                print("reads, one after another: " + ", ".join(f"{r:.2f} s" for r in reads))
            caught_up_s = _timed(merge)
        idle_s = _timed(merge)
        legacy = topics[: args.legacy_tables]
        legacy_options = MergeOptions(str(work / "legacy_warehouse"), "avro", common.REGISTRY, prefix)
        legacy_s = _timed(lambda: _legacy(spark, legacy_options, legacy, str(work / "legacy_cp")))
    finally:
        common.delete_topics(prefix)
        shutil.rmtree(work, ignore_errors=True)
    n = n_tables
    legacy_per_table = legacy_s / max(1, len(legacy))
    rows = [
        ("tables x rows", f"{n} x {args.rows}, merge threads {args.merge_threads}"),
        ("start-up (JVM + SparkSession)", f"{startup_s:.1f} s"),
        ("one query: snapshot + txn (creates mirrors)", f"{first_s:.1f} s, {first_s / n:.3f} s/table"),
        ("one query: one txn touching every table", f"{txn_s:.1f} s, {txn_s / n:.3f} s/table"),
        ("one query: with start-up", f"{(txn_s + startup_s) / n:.3f} s/table (target <= 0.1)"),
        ("one query: idle run", f"{idle_s:.1f} s (target <= 15)"),
        (
            "one txn: in the changelog after (run start to its commit)",
            "not measured (--changelog)"
            if in_lake_s is None
            else f"{in_lake_s:.1f} s, {in_lake_s / n:.3f} s/table",
        ),
        (
            f"mirror budget {args.mirror_budget} s: consistent read of every table (mirror + tail)",
            "not measured (--mirror-budget)"
            if read_s is None
            else f"{read_s:.1f} s, median of {READS} (target <= 5)",
        ),
        (
            "mirror budget: the run catching every mirror up",
            "not measured" if caught_up_s is None else f"{caught_up_s:.1f} s, {caught_up_s / n:.3f} s/table",
        ),
        (
            "baseline: a query per table (snapshot + txn)",
            f"{legacy_per_table:.3f} s/table over {len(legacy)} tables",
        ),
        ("ratio baseline / one query (first run, per table)", f"{legacy_per_table / (first_s / n):.1f}x"),
        ("load average before (1, 5, 15 min)", load_before),
    ]
    common.report("many tables: one merge query", rows)
    common.result(
        "many_tables",
        tables=n,
        rows=args.rows,
        startup_s=startup_s,
        first_s=first_s,
        first_s_per_table=first_s / n,
        txn_s=txn_s,
        txn_s_per_table=txn_s / n,
        idle_s=idle_s,
        **({} if in_lake_s is None else {"txn_in_changelog_s": in_lake_s}),
        **({} if read_s is None else {"consistent_read_s": read_s}),
        **({} if caught_up_s is None else {"mirrors_caught_up_s": caught_up_s}),
        # In the lake, then read: from the run's start to the transaction read consistently.
        **({} if in_lake_s is None or read_s is None else {"txn_readable_s": in_lake_s + read_s}),
        legacy_s_per_table=legacy_per_table,
        speedup=legacy_per_table / (first_s / n),
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
