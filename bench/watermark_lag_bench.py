"""Watermark lag benchmark: how far the lake's common watermark trails the source under the continuous
merge (docs/lakehouse.md, "The lake's consistency across tables"). Prints figures, asserts nothing;
ends with a RESULT line.

    .venv/bin/python bench/watermark_lag_bench.py                     # 180 s at 200 changes/s, trigger 10 s
    .venv/bin/python bench/watermark_lag_bench.py --seconds 60 --warmup-seconds 20

The real worker streams `--rate` changes per second (a transaction every 0.1 s inserting rate/10 rows
spread over `--tables` tables: every transaction touches all of them) and one more table that never
changes; the continuous merge (`--history`: consistent reads under a steady load need it) runs every
`--trigger-interval` seconds. Every 0.5 s the common watermark W is read from the Delta logs the way the
slot page does (`orchestration.lake_freshness.observe`). A sample's lag is how old the oldest
transaction the lake does not hold whole at W is (its Postgres commit time to the sample; 0 when W
covers every transaction committed by then); the commit LSNs and times come from the rows themselves
after the run (`_bw_lsn`, `_bw_commit_ts`). The lag is taken over every table, the idle one too
(whose watermark advances through the warehouse's idle marks, docs/lakehouse.md, "Idle tables"), and
apart over the changing tables alone. Target: p99 <= 2 trigger intervals.

`--changelog` merges behind the lake's changelog (`--mirror-budget`, 5 s by default) and samples the
changelog's proven position too (`lake_freshness.observe_changelog`, what a consistent read through
the changelog serves, docs/lakehouse.md): its lag is the lake's; the mirrors' is how far they trail.
The mirrors are created from the snapshot before the writes start (untimed), and the transactions
are read from the changelog, which holds them all however far the mirrors trail. With more tables
than rows per transaction (`--tables 200`), each transaction inserts into the next tables in turn,
so every table changes at the same rate.
"""

from __future__ import annotations

import argparse
import bisect
import shutil
import statistics
import sys
import tempfile
import threading
import time
from datetime import UTC
from pathlib import Path

import psycopg2
import worker_bench_common as common
from psycopg2 import sql
from pyspark.sql import SparkSession

from kafka_contract.headers import HEADER_COMMIT_TS
from orchestration import lake_freshness
from shared_connections.spark_session import SparkSettings, build_session
from spark_jobs.decoding.spark_envelope import header, headers_map
from spark_jobs.lake import changelog
from spark_jobs.merge import KafkaSource, run_continuous, run_merge
from spark_jobs.merge_options import MergeOptions
from spark_jobs.rules import layout

SAMPLE_S = 0.5
TXN_INTERVAL_S = 0.1


def _write(dsn: str, names: list[str], per_txn: int, stop: threading.Event) -> None:
    """A transaction every TXN_INTERVAL_S, inserting `per_txn` rows spread over `names` (over the
    next `per_txn` of them in turn when there are more tables than rows)."""
    counts = [per_txn // len(names) + (1 if i < per_txn % len(names) else 0) for i in range(len(names))]
    insert = "INSERT INTO {} (note) SELECT 'x' FROM generate_series(1, %s)"
    statements = [
        (sql.SQL(insert).format(sql.Identifier(n)), (c,)) for n, c in zip(names, counts, strict=True) if c
    ]
    rotate = 0 if per_txn >= len(names) else per_txn
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            next_at = time.monotonic()
            while not stop.is_set():
                for statement, params in statements:
                    cur.execute(statement, params)
                statements = statements[rotate:] + statements[:rotate]
                conn.commit()
                next_at += TXN_INTERVAL_S
                stop.wait(max(0.0, next_at - time.monotonic()))
    finally:
        conn.close()


Sample = tuple[float, int | None, int | None, int | None]


def _sample(paths: dict[str, str], names: list[str], changelog_path: str | None, out: list[Sample],
            stop: threading.Event) -> None:  # fmt: skip
    """(time, W over the changing tables `names`, W over every table of `paths`, the changelog's
    position) every SAMPLE_S."""
    busy = {n: paths[n] for n in names}
    while not stop.wait(SAMPLE_S):
        now = time.time()
        over_busy, over_all = lake_freshness.observe(busy), lake_freshness.observe(paths)
        logged = None if changelog_path is None else lake_freshness.observe_changelog(changelog_path)
        busy_w, all_w = over_busy and over_busy.position, over_all and over_all.position
        out.append((now, busy_w, all_w, logged and logged.position))


def _transactions(spark: SparkSession, paths: list[str]) -> list[tuple[int, float]]:
    """Every transaction's (commit LSN, commit time in epoch seconds), from the rows it inserted."""
    from pyspark.sql import functions as F

    frames = [spark.read.format("delta").load(p).select(layout.LSN, layout.COMMIT_TS) for p in paths]
    union = frames[0]
    for frame in frames[1:]:
        union = union.unionByName(frame)
    rows = union.groupBy(layout.LSN).agg(F.min(layout.COMMIT_TS).alias("at")).collect()
    return sorted((int(r[layout.LSN]), r["at"].replace(tzinfo=UTC).timestamp()) for r in rows)


def _logged_transactions(spark: SparkSession, warehouse: str, topics: list[str]) -> list[tuple[int, float]]:
    """`_transactions` from the changelog's records (their `bw.commit_ts` headers)."""
    from pyspark.sql import functions as F

    records = changelog.read(spark, warehouse, topics, extra=(layout.LSN,))
    committed = records.select(layout.LSN, headers_map()).select(
        layout.LSN, header(HEADER_COMMIT_TS).cast("timestamp").alias("at")
    )
    rows = committed.groupBy(layout.LSN).agg(F.min("at").alias("at")).collect()
    return sorted((int(r[layout.LSN]), r["at"].replace(tzinfo=UTC).timestamp()) for r in rows)


def lags(
    samples: list[tuple[float, int | None]], transactions: list[tuple[int, float]], since: float
) -> list[float]:
    """Each sample's lag: its time minus the commit time of the oldest transaction after W that had
    committed by then (0 when none had); samples before `since` are left out."""
    lsns = [lsn for lsn, _ in transactions]
    out = []
    for at, position in samples:
        if at < since:
            continue
        first = 0 if position is None else bisect.bisect_right(lsns, position)
        missing = transactions[first][1] if first < len(transactions) else None
        out.append(0.0 if missing is None or missing > at else at - missing)
    return out


def run(spark: SparkSession, work: Path, *, seconds: float, rate: float, trigger: float, warmup: float,
        tables: int, history: bool, mirror_budget: float | None) -> list[tuple[str, str]]:  # fmt: skip
    prefix, slot = common.unique("wmbench"), common.unique("wmslot")
    names = [f"busy{i}" for i in range(tables)]
    idle = "idle"
    logged = mirror_budget is not None
    options = MergeOptions(
        str(work / "warehouse"), "avro", common.REGISTRY, prefix, history=history, changelog=logged,
        mirror_budget_s=mirror_budget,
    )  # fmt: skip
    paths = {n: str(Path(options.warehouse) / "public" / n) for n in [*names, idle]}
    changelog_path = layout.changelog_path(options.warehouse) if logged else None
    topics = [f"{prefix}.{n}" for n in [*names, idle]]
    per_txn = max(1, round(rate * TXN_INTERVAL_S))
    samples: list[Sample] = []
    with common.scratch_database("wmbench") as dsn:
        common.execute(
            dsn,
            *(sql.SQL("CREATE TABLE {} (id bigserial PRIMARY KEY, note text)").format(sql.Identifier(n))
              for n in [*names, idle]),
            sql.SQL("INSERT INTO {} (note) VALUES ('never changes')").format(sql.Identifier(idle)),
        )  # fmt: skip
        tables_arg = ",".join(f"public.{n}" for n in [*names, idle])
        worker = common.Worker(dsn, slot, prefix, "--tables", tables_arg, "-T", "partitions=2", log_dir=work)
        stop_writing, stop_merging, stop_sampling = threading.Event(), threading.Event(), threading.Event()

        def merge() -> None:
            run_continuous(
                spark, options, KafkaSource(common.BROKER), str(work / "checkpoints"),
                topics=topics, trigger_interval=trigger, stop=stop_merging,
            )  # fmt: skip

        writer = threading.Thread(target=_write, args=(dsn, names, per_txn, stop_writing), daemon=True)
        merger = threading.Thread(target=merge, daemon=True)
        sampler = threading.Thread(
            target=_sample, args=(paths, names, changelog_path, samples, stop_sampling), daemon=True
        )
        try:
            worker.wait_log("snapshot complete", timeout=120)
            if logged:  # the mirrors, created from the snapshot: a deployment's steady state
                created = time.monotonic()
                kafka = KafkaSource(common.BROKER)
                run_merge(spark, options, kafka, str(work / "checkpoints"), topics=topics)
                took = time.monotonic() - created
                print(f"{len(topics)} mirrors created in {took:.1f} s (untimed)", flush=True)
            merger.start()
            started = time.time()
            writer.start()
            sampler.start()
            time.sleep(seconds)
        finally:
            stop_writing.set()
            writer.join(30)
            stop_sampling.set()
            sampler.join(30)
            stop_merging.set()
            merger.join(180)
            worker.stop()
            common.delete_topics(prefix)
    if logged:
        transactions = _logged_transactions(spark, options.warehouse, topics)
    else:
        transactions = _transactions(spark, [paths[n] for n in names])
    cadence = _batch_cadence(spark, changelog_path or paths[names[0]], started + warmup)
    busy = lags([(at, w) for at, w, _, _ in samples], transactions, started + warmup)
    every = lags([(at, w) for at, _, w, _ in samples], transactions, started + warmup)
    if len(every) < 2:
        return [("watermark lag", "no samples after the warm-up")]
    q, qb = statistics.quantiles(every, n=100), statistics.quantiles(busy, n=100)
    lake: list[tuple[str, str]] = []
    if logged:
        head = lags([(at, w) for at, _, _, w in samples], transactions, started + warmup)
        qc = statistics.quantiles(head, n=100)
        common_result.update(
            changelog_lag_p50_s=round(qc[49], 1), changelog_lag_p99_s=round(qc[98], 1),
            changelog_lag_max_s=round(max(head), 1), changelog_p99_intervals=round(qc[98] / trigger, 2),
            mirror_budget_s=mirror_budget,
        )  # fmt: skip
        lake = [
            ("the changelog's position (what a consistent read serves) p50 / p99 / max",
             f"{qc[49]:.1f} / {qc[98]:.1f} / {max(head):.1f} s"),
            ("its p99 in trigger intervals", f"{qc[98] / trigger:.2f} (target <= 2)"),
        ]  # fmt: skip
    common_result.update(
        trigger_s=trigger, rate=rate, tables=tables, samples=len(every),
        lag_p50_s=round(q[49], 1), lag_p99_s=round(q[98], 1), lag_max_s=round(max(every), 1),
        p99_intervals=round(q[98] / trigger, 2), target_p99_s=2 * trigger,
        busy_lag_p50_s=round(qb[49], 1), busy_lag_p99_s=round(qb[98], 1),
        batch_p50_s=cadence[0], batch_max_s=cadence[1],
    )  # fmt: skip
    late = " (above the trigger: batches run late)" if cadence[0] > trigger * 1.1 else ""
    return lake + [
        ("trigger / rate", f"{trigger:.0f} s / {rate:.0f} changes/s ({per_txn} rows per transaction over "
                           f"{tables} tables), {seconds:.0f} s run, {warmup:.0f} s warm-up left out"),
        ("transactions / samples", f"{len(transactions):,} / {len(every):,}"),
        ("the mirrors' common watermark lag, every table (the idle one too) p50 / p99 / max",
         f"{q[49]:.1f} / {q[98]:.1f} / {max(every):.1f} s"),
        ("p99 in trigger intervals", f"{q[98] / trigger:.2f} (target <= 2)"),
        ("over the changing tables alone p50 / p99", f"{qb[49]:.1f} / {qb[98]:.1f} s"),
        ("batches (the changelog's, else a busy table's): time between two, p50 / max",
         f"{cadence[0]:.1f} / {cadence[1]:.1f} s{late}"),
    ]  # fmt: skip


def _batch_cadence(spark: SparkSession, path: str, since: float) -> tuple[float, float]:
    """The time between a table's successive marked commits after `since` (p50, max): how long a
    batch of the continuous merge took when it ran behind its trigger."""
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    rows = (
        DeltaTable.forPath(spark, path).history().where(F.col("userMetadata").isNotNull())
        .select(F.unix_timestamp("timestamp").alias("at")).collect()
    )  # fmt: skip
    times = sorted({int(r["at"]) for r in rows if int(r["at"]) >= since})
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)] or [0]
    return float(statistics.median(gaps)), float(max(gaps))


common_result: dict[str, object] = {}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--seconds", type=float, default=180, help="run length, the warm-up included (default: 180)"
    )
    parser.add_argument("--rate", type=float, default=200, help="changes per second (default: 200)")
    parser.add_argument(
        "--trigger-interval", type=float, default=10, help="the merge's trigger (default: 10)"
    )
    parser.add_argument("--warmup-seconds", type=float, default=30, help="samples left out (default: 30)")
    parser.add_argument("--tables", type=int, default=3, help="changing tables (default: 3)")
    parser.add_argument("--no-history", action="store_true", help="merge without --history")
    parser.add_argument("--changelog", action="store_true", help="merge behind the lake's changelog")
    parser.add_argument(
        "--mirror-budget", type=float, default=5.0, help="with --changelog, the merge's (default: 5)"
    )
    args = parser.parse_args()
    if args.warmup_seconds >= args.seconds:
        parser.error("--warmup-seconds must be shorter than --seconds (the run, the warm-up included)")
    spark = build_session(SparkSettings(app_name="bottledwater-watermark-bench", driver_memory="2g"))
    work = Path(tempfile.mkdtemp(prefix="watermark_bench_"))
    try:
        common.report(
            "common watermark lag (source commit -> lake complete past it), continuous merge",
            run(spark, work, seconds=args.seconds, rate=args.rate, trigger=args.trigger_interval,
                warmup=args.warmup_seconds, tables=args.tables, history=not args.no_history,
                mirror_budget=args.mirror_budget if args.changelog else None),
        )  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)
    common.result("watermark_lag", **common_result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
