"""Merge benchmark: Kafka changelog -> Delta MERGE throughput, against a plain Delta append of the
same decoded rows in the same run, and end-to-end freshness (Postgres commit -> visible in Delta)
at a fixed merge cadence. Prints figures and ratios, asserts nothing.

    .venv/bin/python bench/merge_bench.py                      # 1M-row table, 1M changes, 5 min freshness
    .venv/bin/python bench/merge_bench.py --rows 20000 --freshness-seconds 60 --cadence-seconds 15
    .venv/bin/python bench/merge_bench.py --skip-throughput --freshness-seconds 0   # continuous only

Throughput: N snapshot rows are merged into an empty mirror (the initial load), then N changes
(60 % inserts of new keys, 30 % updates, 10 % deletes of existing keys) are merged into it, and into
a copy of it populated to --large-rows keys (5M by default; the updates and deletes hit keys both
mirrors hold, the inserts keys neither does), with deletion vectors (the default) and copy-on-write,
each twice from a fresh copy, alternated (the medians are reported).
The baseline is the lake's own pipe: the same Kafka records read by Spark and appended raw (key,
value, headers) to a Delta table, in the same run. Against it: the Kafka read alone (the same offset
range with its headers, written nowhere), the merge's decoding plus an append (one Kafka read kept
for the batch summary and the decoding with Spark's `from_avro`, then the append), and the MERGEs; the
former baseline (a Delta append of the changes already decoded, read from a Parquet copy) is kept
beside it. Ratios are rates relative to the pipe (1.0 = as fast as it). The fixed start-up (JVM,
SparkSession, Delta's classes) is timed apart and in no ratio.
The messages are encoded by the worker's own `AvroEventSerializer`, so no Postgres is needed for it.

Freshness: the real worker streams a table that receives one insert every `--insert-interval`
seconds; the merge runs every `--cadence-seconds`; each row's freshness is the end of the merge run
that made it visible minus its commit timestamp (`_bw_commit_ts`).

Continuous freshness: the continuous merge (`--continuous`, a micro-batch every `--trigger-interval`
seconds, 10 by default) runs while the worker streams `--continuous-rate` inserts per second (200 by
default); each row's freshness is the commit time of the first Delta version holding it minus its
Postgres commit time (the target: p99 <= 20 s at 200 changes/s with the default trigger).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg2
import worker_bench_common as common
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from confluent_kafka.schema_registry import SchemaRegistryClient
from delta.tables import DeltaTable
from psycopg2 import sql
from pyspark.sql import DataFrame, SparkSession

from cdc_worker.core.encoding.avro_serializer import AvroEventSerializer
from cdc_worker.core.model import ChangeEvent, Column, Op, TableSchema
from cdc_worker.core.pgtypes.oids import PgType
from shared_connections.spark_session import SparkSettings, build_session
from spark_jobs.merge import KafkaSource, run_continuous, run_merge
from spark_jobs.merge_options import MergeOptions
from spark_jobs.merging import batch_schema
from spark_jobs.merging.merge_batch import TableMerger
from spark_jobs.rules.layout import location_for_topic

PARTITIONS = 2
TRANSACTION_SIZE = 1000
# Each MERGE into the large mirror, with deletion vectors and copy-on-write, runs this many times.
LARGE_ROUNDS = 2
INSERT_SHARE, UPDATE_SHARE = 0.6, 0.3
BASE_LSN = 1 << 32
NUMERIC_12_2 = (12 << 16 | 2) + 4
# Every figure of the run, printed last as one `RESULT name=value ...` line for scripts.
RESULT: dict[str, object] = {}


def table_schema(name: str) -> TableSchema:
    columns = (
        Column("id", PgType.INT8, -1),
        Column("name", PgType.TEXT, -1),
        Column("amount", PgType.NUMERIC, NUMERIC_12_2),
        Column("updated_at", PgType.TIMESTAMPTZ, -1),
        Column("note", PgType.TEXT, -1),
    )
    return TableSchema(1, "public", name, columns, key_columns=("id",))


def row(key: int, version: int) -> tuple[str, ...]:
    return (str(key), f"name {key} v{version}", f"{key % 100000}.{version % 100:02d}",
            "2024-01-01 00:00:00+00", "x" * 40)  # fmt: skip


def produce(producer: Producer, serializer: AvroEventSerializer, events: list[ChangeEvent]) -> None:
    for event in events:
        message = serializer(event)
        if message is not None:
            producer.produce(message.topic, message.value, message.key, headers=message.headers)
            producer.poll(0)
    if producer.flush(300) != 0:
        raise RuntimeError("Kafka did not acknowledge every message")


def snapshot_events(schema: TableSchema, rows: int) -> list[ChangeEvent]:
    at = datetime(2024, 1, 1, tzinfo=UTC)
    return [ChangeEvent(Op.READ, schema, (str(k),), row(k, 0), (), BASE_LSN, k, 1, at) for k in range(rows)]


def change_events(
    schema: TableSchema, rows: int, changes: int, insert_from: int, seed: int = 7
) -> list[ChangeEvent]:
    """Updates and deletes of keys below `rows`, inserts of new keys from `insert_from` on."""
    rng = random.Random(seed)
    inserts, updates = int(changes * INSERT_SHARE), int(changes * UPDATE_SHARE)
    deletes = changes - inserts - updates
    existing = rng.sample(range(rows), updates + deletes)
    plan = [(Op.INSERT, insert_from + i) for i in range(inserts)]
    plan += [(Op.UPDATE, k) for k in existing[:updates]] + [(Op.DELETE, k) for k in existing[updates:]]
    rng.shuffle(plan)
    events = []
    for position, (op, key) in enumerate(plan):
        txn, seq = divmod(position, TRANSACTION_SIZE)
        lsn = BASE_LSN + 1 + txn
        values = None if op == Op.DELETE else row(key, 1)
        at = datetime(2024, 1, 2, tzinfo=UTC) + timedelta(seconds=txn)
        events.append(ChangeEvent(op, schema, (str(key),), values, (), lsn, seq, txn + 2, at))
    return events


def end_offsets(topic: str) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": common.BROKER, "group.id": common.unique("bench")})
    try:
        return {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
            for p in range(PARTITIONS)
        }
    finally:
        consumer.close()


def throughput(spark: SparkSession, rows: int, large_rows: int, work: Path) -> list[tuple[str, str]]:
    prefix = common.unique("mbench")
    name = "merge_bench"
    schema = table_schema(name)
    topic = f"{prefix}.{name}"
    admin = AdminClient({"bootstrap.servers": common.BROKER})
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(60)
    serializer = AvroEventSerializer(SchemaRegistryClient({"url": common.REGISTRY}), {}, topic_prefix=prefix)
    producer = Producer({"bootstrap.servers": common.BROKER, "linger.ms": 50, "batch.num.messages": 10000,
                         "compression.codec": "lz4"})  # fmt: skip
    options = MergeOptions(str(work / "warehouse"), "avro", common.REGISTRY, prefix)
    large = MergeOptions(str(work / "warehouse_large"), "avro", common.REGISTRY, prefix)
    try:
        started = time.monotonic()
        produce(producer, serializer, snapshot_events(schema, rows))
        snapshot_end = end_offsets(topic)
        # Inserts above both mirrors' keys; updates and deletes of keys both mirrors hold.
        changes = change_events(schema, rows, rows, insert_from=max(rows, large_rows))
        produce(producer, serializer, changes)
        change_end = end_offsets(topic)
        produced = time.monotonic() - started

        # Each phase is one foreachBatch call over an exact offset range: what one availableNow
        # micro-batch of the merge job does, without the stream's own bookkeeping.
        changes_range = (snapshot_end, change_end)
        load_s = _timed(lambda: _merge_range(spark, options, topic, None, snapshot_end))
        # The lake's own pipe: the same records read by Spark and appended raw to Delta.
        pipe_s = _timed(
            lambda: _kafka_range(spark, topic, *changes_range).select("key", "value", "headers")
            .write.format("delta").save(str(work / "pipe"))
        )  # fmt: skip
        parquet = work / "decoded_changes.parquet"
        _decoded(spark, options, topic, changes_range).write.parquet(str(parquet))
        baseline_s = _timed(
            lambda: spark.read.parquet(str(parquet)).write.format("delta").save(str(work / "base"))
        )
        kafka_s = _timed(
            lambda: _kafka_range(spark, topic, *changes_range).write.format("noop").mode("overwrite").save()
        )
        native_s = _timed(
            lambda: _native_decode_append(spark, options, topic, changes_range, str(work / "native_append"))
        )
        # The large mirror: a copy of the loaded one, populated up to `large_rows` keys.
        table = f"public/{name}"
        populate_s = _timed(
            lambda: _populate(spark, (options.warehouse, large.warehouse), table, rows, large_rows)
        )
        # The same MERGE into fresh copies of it with deletion vectors (the default) and without
        # (copy-on-write), alternated, so that neither side alone pays the session's warm-up.
        large_s: dict[str, list[float]] = {"vectors": [], "copy": []}
        metrics_of: dict[str, dict[str, int]] = {}
        for _ in range(LARGE_ROUNDS):
            for mode, seconds in large_s.items():
                target = MergeOptions(str(work / f"warehouse_{mode}"), "avro", common.REGISTRY, prefix)
                shutil.copytree(large.warehouse, target.warehouse)
                if mode == "copy":
                    spark.sql(
                        f"ALTER TABLE delta.`{target.warehouse}/{table}` "
                        "SET TBLPROPERTIES ('delta.enableDeletionVectors' = 'false')"
                    )
                merged = _timed(lambda t=target: _merge_range(spark, t, topic, snapshot_end, change_end))
                seconds.append(merged)
                metrics_of[mode] = _last_commit_metrics(spark, f"{target.warehouse}/{table}")
                final_large = spark.read.format("delta").load(f"{target.warehouse}/{table}").count()
                shutil.rmtree(target.warehouse)
        merge_large_s, merge_cow_s = (statistics.median(large_s[m]) for m in ("vectors", "copy"))
        large_metrics, cow_metrics = metrics_of["vectors"], metrics_of["copy"]
        merge_s = _timed(lambda: _merge_range(spark, options, topic, snapshot_end, change_end))
        final = spark.read.format("delta").load(f"{options.warehouse}/{table}").count()
        # Delta's own account of that MERGE (its commit's operationMetrics): how much of the batch's
        # time is the MERGE command, and of it the scan for touched files and their rewrite.
        merge_metrics = _last_commit_metrics(spark, f"{options.warehouse}/{table}")
    finally:
        common.delete_topics(prefix)
    deletes = rows - int(rows * INSERT_SHARE) - int(rows * UPDATE_SHARE)
    expected, expected_large = (
        rows + int(rows * INSERT_SHARE) - deletes,
        large_rows + int(rows * INSERT_SHARE) - deletes,
    )
    rates = {
        "pipe_rows_s": rows / pipe_s,
        "baseline_rows_s": rows / baseline_s,
        "pipe_vs_baseline": baseline_s / pipe_s,
        "kafka_read_rows_s": rows / kafka_s,
        "kafka_read_vs_pipe": pipe_s / kafka_s,
        "native_decode_append_rows_s": rows / native_s,
        "decode_append_vs_pipe": pipe_s / native_s,
        "native_decode_append_ratio": baseline_s / native_s,
        "merge_rows_s": rows / merge_s,
        "merge_vs_pipe": pipe_s / merge_s,
        "merge_ratio": baseline_s / merge_s,
        "merge_large_rows_s": rows / merge_large_s,
        "merge_large_vs_pipe": pipe_s / merge_large_s,
        "merge_large_cow_rows_s": rows / merge_cow_s,
        "merge_large_cow_vs_pipe": pipe_s / merge_cow_s,
        "load_rows_s": rows / load_s,
    }
    RESULT.update({k: round(v, 2) for k, v in rates.items()}, large_rows=large_rows)
    RESULT.update({f"merge_{m}": merge_metrics.get(m, 0) for m in _MERGE_PHASES})
    RESULT.update({f"merge_large_{m}": large_metrics.get(m, 0) for m in _MERGE_PHASES})
    RESULT.update({f"merge_large_cow_{m}": cow_metrics.get(m, 0) for m in _MERGE_PHASES})

    def rate(seconds: float) -> str:
        return f"{rows / seconds:,.0f} rows/s ({seconds:.1f} s), {pipe_s / seconds:.2f}x the lake pipe"

    def breakdown(metrics: dict[str, int]) -> list[tuple[str, str]]:
        return [
            (
                "  of it Delta's MERGE command: total / scan / rewrite",
                " / ".join(f"{metrics.get(m, 0) / 1000:.1f} s" for m in _MERGE_PHASES),
            ),
            (
                "  files removed / added / deletion vectors added / rows copied",
                " / ".join(f"{metrics.get(m, 0):,}" for m in _MERGE_FILES),
            ),
        ]

    return [
        ("rows in table / changes", f"{rows:,} / {len(changes):,} (60% ins, 30% upd, 10% del)"),
        ("produce (serializer + Kafka)", f"{2 * rows / produced:,.0f} msg/s"),
        ("initial load (append into the new mirror)", rate(load_s)),
        ("the lake pipe: Kafka records appended raw to Delta", rate(pipe_s)),
        ("former baseline: Delta append of the decoded rows (Parquet)", rate(baseline_s)),
        ("ceiling: Kafka read alone (headers, to noop)", rate(kafka_s)),
        ("merge's decode: 1 Kafka read, summary, from_avro + append", rate(native_s)),
        (f"MERGE of the changes into the {rows:,}-row mirror", rate(merge_s)),
        *breakdown(merge_metrics),
        (f"populate the {large_rows:,}-row mirror (not timed in any ratio)", f"{populate_s:.1f} s"),
        (f"MERGE of the changes into the {large_rows:,}-row mirror", rate(merge_large_s)),
        *breakdown(large_metrics),
        ("  the same, copy-on-write (deletion vectors off)", rate(merge_cow_s)),
        *breakdown(cow_metrics),
        (
            f"  each run, {LARGE_ROUNDS} of each, alternated: vectors / copy",
            f"{common.each_run(large_s['vectors'])} / {common.each_run(large_s['copy'])}",
        ),
        ("rows after merge (expected)", f"{final:,} ({expected:,}); {final_large:,} ({expected_large:,})"),
    ]


def _populate(spark: SparkSession, copy: tuple[str, str], table: str, rows: int, large_rows: int) -> None:
    """A copy of the loaded mirror with the keys `rows`..`large_rows` - 1 appended as the snapshot
    would have written them, in files of about 250,000 rows sorted by key."""
    from pyspark.sql import functions as F

    source, target = copy
    shutil.copytree(source, target)
    path = f"{target}/{table}"
    stored = spark.read.format("delta").load(path).schema
    key = F.col("id")
    values = {
        "name": F.concat(F.lit("name "), key.cast("string"), F.lit(" v0")),
        "amount": (key % 100000).cast("decimal(12,2)"),
        "updated_at": F.lit(datetime(2024, 1, 1, tzinfo=UTC)),
        "note": F.lit("x" * 40),
        "_bw_lsn": F.lit(BASE_LSN),
        "_bw_seq": key,
        "_bw_op": F.lit("r"),
        "_bw_commit_ts": F.lit(datetime(2024, 1, 1, tzinfo=UTC)),
    }
    extra = large_rows - rows
    if extra <= 0:
        return
    frame = (
        spark.range(rows, large_rows)
        .repartitionByRange(max(1, extra // 250_000), "id")
        .sortWithinPartitions("id")
    )
    frame.select(
        *[
            values.get(f.name, key if f.name == "id" else F.lit(None)).cast(f.dataType).alias(f.name)
            for f in stored.fields
        ]
    ).write.format("delta").mode("append").save(path)


_MERGE_PHASES = ("executionTimeMs", "scanTimeMs", "rewriteTimeMs")
_MERGE_FILES = (
    "numTargetFilesRemoved",
    "numTargetFilesAdded",
    "numTargetDeletionVectorsAdded",
    "numTargetRowsCopied",
)


def _last_commit_metrics(spark: SparkSession, path: str) -> dict[str, int]:
    row = spark.sql(f"DESCRIBE HISTORY delta.`{path}` LIMIT 1").select("operationMetrics").head()
    return {k: int(v) for k, v in (row[0] or {}).items()} if row is not None else {}


def _timed(action: object) -> float:
    started = time.monotonic()
    action()  # type: ignore[operator]
    return time.monotonic() - started


def _kafka_range(
    spark: SparkSession, topic: str, start: dict[int, int] | None, end: dict[int, int]
) -> DataFrame:
    reader = (spark.read.format("kafka").option("kafka.bootstrap.servers", common.BROKER)
              .option("subscribe", topic).option("includeHeaders", "true")
              .option("endingOffsets", json.dumps({topic: {str(p): o for p, o in end.items()}})))  # fmt: skip
    if start is not None:
        reader = reader.option("startingOffsets", json.dumps({topic: {str(p): o for p, o in start.items()}}))
    return reader.load()


def _merge_range(
    spark: SparkSession, options: MergeOptions, topic: str, start: dict[int, int] | None, end: dict[int, int]
) -> None:
    """One foreachBatch call over an exact offset range: the merge job's work, minus the stream."""
    merger = TableMerger(location_for_topic(topic, options.topic_prefix), options)
    merger.bind("bench")
    merger(_kafka_range(spark, topic, start, end), int(time.time()))


def _native_decode_append(
    spark: SparkSession,
    options: MergeOptions,
    topic: str,
    ranges: tuple[dict[int, int], dict[int, int]],
    path: str,
) -> None:
    """What the merge does to a batch before its MERGE (`TableMerger.process`): the records read
    from Kafka once and kept (`read_once`), summarized, decoded natively; then appended to Delta."""
    merger = TableMerger(location_for_topic(topic, options.topic_prefix), options)
    with batch_schema.read_once(_kafka_range(spark, topic, *ranges)) as batch:
        summary = batch_schema.summarize(batch, merger.control_topic, "avro")
        merger.decode(batch, summary, {}).frame.write.format("delta").save(path)


def _decoded(
    spark: SparkSession, options: MergeOptions, topic: str, ranges: tuple[dict[int, int], dict[int, int]]
) -> DataFrame:
    """The range's records decoded as the merge decodes them (for the former, decoded baseline)."""
    start, end = ranges
    merger = TableMerger(location_for_topic(topic, options.topic_prefix), options)
    batch = _kafka_range(spark, topic, start, end)
    summary = batch_schema.summarize(batch, merger.control_topic, "avro")
    return merger.decode(batch, summary, {}).frame


def freshness(
    spark: SparkSession, seconds: float, cadence: float, interval: float, work: Path
) -> list[tuple[str, str]]:
    prefix, slot, name = common.unique("fbench"), common.unique("fslot"), "fresh"
    latencies: list[float] = []
    runs: list[float] = []
    with common.scratch_database("fbench") as dsn:
        common.execute(
            dsn, sql.SQL("CREATE TABLE {} (id bigserial PRIMARY KEY, note text)").format(sql.Identifier(name))
        )
        worker = common.Worker(
            dsn, slot, prefix, "--tables", f"public.{name}", "-T", "partitions=2", log_dir=work
        )
        stop = threading.Event()

        def write() -> None:
            while not stop.is_set():
                common.execute(
                    dsn, sql.SQL("INSERT INTO {} (note) VALUES ('x')").format(sql.Identifier(name))
                )
                stop.wait(interval)

        writer = threading.Thread(target=write, daemon=True)
        try:
            worker.wait_log("snapshot complete", timeout=120)
            writer.start()
            options = MergeOptions(str(work / "fwarehouse"), "avro", common.REGISTRY, prefix)
            path = f"{options.warehouse}/public/{name}"
            seen = 0
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                time.sleep(cadence)
                started = time.monotonic()
                run_merge(
                    spark, options, KafkaSource(common.BROKER), str(work / "fcp"), topics=[f"{prefix}.{name}"]
                )
                finished = datetime.now(UTC)
                runs.append(time.monotonic() - started)
                fresh = (
                    spark.read.format("delta")
                    .load(path)
                    .where(f"id > {seen}")
                    .select("id", "_bw_commit_ts")
                    .collect()
                )
                for r in fresh:
                    latencies.append((finished - r["_bw_commit_ts"].replace(tzinfo=UTC)).total_seconds())
                    seen = max(seen, r["id"])
        finally:
            stop.set()
            worker.stop()
            common.delete_topics(prefix)
    if not latencies:
        return [("freshness", "no rows became visible")]
    quantiles = statistics.quantiles(latencies, n=100)
    RESULT.update(
        freshness_p50_s=round(quantiles[49], 1),
        freshness_p99_s=round(quantiles[98], 1),
        freshness_cadence_s=cadence,
    )
    return [
        ("cadence / insert interval", f"{cadence:.0f} s / {interval:.2f} s, {seconds:.0f} s run"),
        ("rows measured", f"{len(latencies):,}"),
        ("freshness p50", f"{quantiles[49]:.1f} s"),
        ("freshness p99", f"{quantiles[98]:.1f} s"),
        ("merge run (median)", f"{statistics.median(runs):.1f} s"),
        ("ideal p50 (cadence / 2 + run)", f"{cadence / 2 + statistics.median(runs):.1f} s"),
    ]


def _commit_times(table: Path) -> dict[int, datetime]:
    """Each Delta version of a local table -> its commit time (commitInfo.timestamp)."""
    times = {}
    for path in sorted((table / "_delta_log").glob("*.json")):
        for line in path.read_text().splitlines():
            entry = json.loads(line)
            if "commitInfo" in entry:
                times[int(path.stem)] = datetime.fromtimestamp(entry["commitInfo"]["timestamp"] / 1000, UTC)
    return times


def continuous_freshness(
    spark: SparkSession, work: Path, *, seconds: float, rate: float, trigger: float, warmup: float
) -> list[tuple[str, str]]:
    """The continuous merge (`run_continuous`, processing-time trigger) while the real worker streams
    `rate` inserts per second (a transaction of rate/10 rows every 0.1 s). A row's freshness is the
    commit time of the first Delta version that holds it minus its Postgres commit time; the rows
    committed in the first `warmup` seconds (the stream's start, the table's creation) are left out."""
    prefix, slot, name = common.unique("cbench"), common.unique("cslot"), "fresh"
    per_txn = max(1, round(rate / 10))
    options = MergeOptions(str(work / "cwarehouse"), "avro", common.REGISTRY, prefix)
    table = Path(options.warehouse) / "public" / name
    with common.scratch_database("cbench") as dsn:
        common.execute(
            dsn, sql.SQL("CREATE TABLE {} (id bigserial PRIMARY KEY, note text)").format(sql.Identifier(name))
        )
        worker = common.Worker(
            dsn, slot, prefix, "--tables", f"public.{name}", "-T", "partitions=2", log_dir=work
        )
        stop_writing, stop_merging = threading.Event(), threading.Event()
        insert = sql.SQL("INSERT INTO {} (note) SELECT 'x' FROM generate_series(1, %s)").format(
            sql.Identifier(name)
        )

        def write() -> None:
            conn = psycopg2.connect(dsn)
            conn.autocommit = True
            try:
                with conn.cursor() as cur:
                    next_at = time.monotonic()
                    while not stop_writing.is_set():
                        cur.execute(insert, (per_txn,))
                        next_at += 0.1
                        stop_writing.wait(max(0.0, next_at - time.monotonic()))
            finally:
                conn.close()

        def merge() -> None:
            run_continuous(
                spark, options, KafkaSource(common.BROKER), str(work / "ccp"),
                topics=[f"{prefix}.{name}"], trigger_interval=trigger, stop=stop_merging,
            )  # fmt: skip

        writer = threading.Thread(target=write, daemon=True)
        merger = threading.Thread(target=merge, daemon=True)
        try:
            worker.wait_log("snapshot complete", timeout=120)
            merger.start()
            started = datetime.now(UTC)
            writer.start()
            time.sleep(seconds)
            stop_writing.set()
            writer.join(30)
            written = common.scalar(dsn, sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(name)))
            # Let the merge catch up with the last rows, then stop it at a batch boundary.
            deadline = time.monotonic() + 6 * trigger
            while time.monotonic() < deadline and _rows_in(spark, table) < written:
                time.sleep(1)
        finally:
            stop_writing.set()
            stop_merging.set()
            merger.join(120)
            worker.stop()
            common.delete_topics(prefix)
    latencies = []
    seen = 0
    for version, committed in sorted(_commit_times(table).items()):
        rows = (
            spark.read.format("delta").option("versionAsOf", version).load(str(table))
            .where(f"id > {seen}").select("id", "_bw_commit_ts").collect()
        )  # fmt: skip
        for r in rows:
            at = r["_bw_commit_ts"].replace(tzinfo=UTC)
            if (at - started).total_seconds() >= warmup:
                latencies.append((committed - at).total_seconds())
            seen = max(seen, r["id"])
    if len(latencies) < 2:
        return [("continuous freshness", "no rows became visible")]
    quantiles = statistics.quantiles(latencies, n=100)
    RESULT.update(
        continuous_p50_s=round(quantiles[49], 1),
        continuous_p99_s=round(quantiles[98], 1),
        continuous_max_s=round(max(latencies), 1),
        continuous_trigger_s=trigger,
        continuous_rate=rate,
    )
    return [
        (
            "trigger / rate",
            f"{trigger:.0f} s / {rate:.0f} inserts/s ({per_txn} per transaction), {seconds:.0f} s run",
        ),
        (
            "rows measured (after warm-up)",
            f"{len(latencies):,} of {written:,} ({warmup:.0f} s warm-up left out)",
        ),
        ("freshness p50", f"{quantiles[49]:.1f} s"),
        ("freshness p99", f"{quantiles[98]:.1f} s"),
        ("freshness max", f"{max(latencies):.1f} s"),
    ]


def _rows_in(spark: SparkSession, table: Path) -> int:
    if not (table / "_delta_log").is_dir():
        return 0
    return spark.read.format("delta").load(str(table)).count()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--rows", type=int, default=1_000_000, help="table rows and changes (default: 1,000,000)"
    )
    parser.add_argument(
        "--freshness-seconds", type=float, default=300, help="freshness run length; 0 skips (default: 300)"
    )
    parser.add_argument("--cadence-seconds", type=float, default=60, help="merge cadence (default: 60)")
    parser.add_argument(
        "--insert-interval", type=float, default=0.2, help="seconds between inserts (default: 0.2)"
    )
    parser.add_argument(
        "--large-rows", type=int, default=5_000_000, help="the larger mirror's rows (default: 5,000,000)"
    )
    parser.add_argument("--skip-throughput", action="store_true", help="only the freshness measurement")
    parser.add_argument(
        "--continuous-seconds",
        type=float,
        default=180,
        help="continuous merge freshness run length; 0 skips (default: 180)",
    )
    parser.add_argument(
        "--continuous-rate", type=float, default=200, help="inserts per second during it (default: 200)"
    )
    parser.add_argument(
        "--trigger-interval", type=float, default=10, help="the continuous merge's trigger (default: 10)"
    )
    parser.add_argument(
        "--warmup-seconds", type=float, default=30, help="rows of the first seconds left out (default: 30)"
    )
    args = parser.parse_args()
    started = time.monotonic()
    spark = build_session(SparkSettings(app_name="bottledwater-merge-bench", driver_memory="4g"))
    work = Path(tempfile.mkdtemp(prefix="merge_bench_"))
    DeltaTable.isDeltaTable(spark, str(work))  # Delta's classes loaded: what every merge run pays first
    RESULT["startup_s"] = round(time.monotonic() - started, 1)
    try:
        if not args.skip_throughput:
            figures = throughput(spark, args.rows, args.large_rows, work)
            figures.insert(0, ("start-up: JVM, SparkSession, Delta (apart)", f"{RESULT['startup_s']} s"))
            common.report("merge throughput (Kafka -> Delta)", figures)
        if args.freshness_seconds > 0:
            common.report(
                "end-to-end freshness (Postgres commit -> visible in Delta)",
                freshness(spark, args.freshness_seconds, args.cadence_seconds, args.insert_interval, work),
            )
        if args.continuous_seconds > 0:
            common.report(
                "continuous merge freshness (Postgres commit -> Delta commit holding the row)",
                continuous_freshness(
                    spark,
                    work,
                    seconds=args.continuous_seconds,
                    rate=args.continuous_rate,
                    trigger=args.trigger_interval,
                    warmup=args.warmup_seconds,
                ),
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    common.result("merge", **({} if args.skip_throughput else {"rows": args.rows}), **RESULT)
    return 0


if __name__ == "__main__":
    sys.exit(main())
