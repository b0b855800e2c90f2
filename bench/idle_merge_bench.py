"""Idle merge benchmark: what the continuous merge costs, and what lag the lake reports, while the
source writes nothing (docs/lakehouse.md, "An idle source"). Prints figures, asserts nothing; ends
with a RESULT line.

    .venv/bin/python bench/idle_merge_bench.py                         # 200 tables, 10 idle minutes
    .venv/bin/python bench/idle_merge_bench.py --tables 20 --idle-seconds 120

`--tables` tables of one row each; the real worker snapshots them and streams on (its default
`--idle-progress-interval`, 30 s); the continuous merge runs in this process (`--trigger-interval`,
10 s by default) until the lake holds the snapshot, then the source stays idle for
`--idle-seconds`. Over that window:

- CPU seconds per minute of the merge's JVM and of this process's merge threads (this process's
  own sampling, once a minute, is left out), against the baseline: the same JVM idle with no query,
  measured first for `--baseline-seconds`;
- the lake's lag at the end, read as the slot page reads it (`orchestration.lake_freshness`): now
  minus when the worker last proved the common watermark; its baseline is the worker's idle
  progress interval, about which the lag should stay;
- the merge's batches, its idle-marks commits and the mirrors' commits in the window, and whether the
  cluster's WAL moved (another database's writes move every position, and then marks move too).

Targets: <= 3 CPU seconds a minute over 200 tables; lag <= 60 s after 10 idle minutes.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import worker_bench_common as common
from psycopg2 import sql

from orchestration import lake_freshness
from shared_connections.spark_session import SparkSettings, build_session
from spark_jobs.merge import KafkaSource, run_continuous
from spark_jobs.merge_options import MergeOptions
from spark_jobs.merging.query_checkpoint import query_checkpoint
from spark_jobs.rules import layout

IDLE_PROGRESS_S = 30.0  # the worker's default --idle-progress-interval
SAMPLE_EVERY_S = 60.0


def _jvm_pid() -> int:
    """This process's Spark JVM (the py4j gateway's child)."""
    for child in common._children(os.getpid()):
        if "java" in common._command_line(child):
            return child
    raise RuntimeError("no JVM child: is the SparkSession up?")


def _cpu(jvm: int) -> tuple[float, float]:
    """(JVM, this process) CPU seconds so far."""
    own = os.times()
    return common.tree_cpu_seconds(jvm), own.user + own.system


def _count(directory: Path, suffix: str) -> int:
    """Files of `directory` whose names end with `suffix`, not the hidden checksum files Hadoop's
    local file system writes beside them."""
    if not directory.is_dir():
        return 0
    return sum(1 for p in directory.iterdir() if p.name.endswith(suffix) and not p.name.startswith("."))


def _table_commits(paths: dict[str, str]) -> int:
    return sum(_count(Path(p) / "_delta_log", ".json") for p in paths.values())


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tables", type=int, default=200)
    parser.add_argument("--idle-seconds", type=float, default=600.0)
    parser.add_argument("--baseline-seconds", type=float, default=60.0)
    parser.add_argument("--trigger-interval", type=float, default=10.0)
    parser.add_argument("--catch-up-timeout", type=float, default=1800.0)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bw-idle-"))
    spark = build_session(SparkSettings(app_name="bw-idle-merge-bench"))
    jvm = _jvm_pid()
    start = _cpu(jvm)
    time.sleep(args.baseline_seconds)
    baseline_jvm = (_cpu(jvm)[0] - start[0]) * 60 / args.baseline_seconds

    prefix, slot = common.unique("idlebench"), common.unique("idleslot")
    names = [f"t{i:03d}" for i in range(args.tables)]
    options = MergeOptions(str(work / "warehouse"), "avro", common.REGISTRY, prefix)
    paths = {n: str(Path(options.warehouse) / "public" / n) for n in names}
    checkpoints = str(work / "checkpoints")
    stop = threading.Event()
    figures: dict[str, object] = {}
    try:
        with common.scratch_database("idlebench") as dsn:
            common.execute(
                dsn,
                *(sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, note text)").format(sql.Identifier(n))
                  for n in names),
                *(sql.SQL("INSERT INTO {} VALUES (1, 'idle')").format(sql.Identifier(n)) for n in names),
            )  # fmt: skip
            worker = common.Worker(
                dsn, slot, prefix, "--tables", ",".join(f"public.{n}" for n in names), "-T", "partitions=1",
                log_dir=work,
            )  # fmt: skip

            def merge() -> None:
                run_continuous(
                    spark, options, KafkaSource(common.BROKER), checkpoints,
                    topics=[f"{prefix}.{n}" for n in names], trigger_interval=args.trigger_interval,
                    stop=stop,
                )  # fmt: skip

            merger = threading.Thread(target=merge, daemon=True)
            try:
                worker.wait_log("snapshot complete", timeout=600)
                target = common.confirmed_flush(dsn, slot) - 1
                merger.start()
                loaded = time.monotonic()
                deadline = loaded + args.catch_up_timeout
                while True:
                    lake = lake_freshness.observe(paths)
                    if (
                        lake is not None
                        and lake.position >= target
                        and all((Path(p) / "_delta_log").is_dir() for p in paths.values())
                    ):
                        break
                    if time.monotonic() > deadline or not merger.is_alive():
                        raise RuntimeError("the merge did not take in the snapshot")
                    time.sleep(2)
                load_s = time.monotonic() - loaded
                time.sleep(2 * args.trigger_interval)  # the batch after the catch-up, settled
                batches = Path(query_checkpoint(checkpoints)) / "offsets"
                idle_marks_log = Path(layout.idle_marks_path(options.warehouse)) / "_delta_log"
                before = (_count(batches, ""), _count(idle_marks_log, ".json"), common.current_lsn(dsn),
                          _table_commits(paths))  # fmt: skip
                cpu0, sampling, began = _cpu(jvm), 0.0, time.monotonic()
                lags: list[float] = []
                while (left := began + args.idle_seconds - time.monotonic()) > 0:
                    time.sleep(min(SAMPLE_EVERY_S, left))
                    spent = time.thread_time()
                    lake = lake_freshness.observe(paths)
                    lag = None if lake is None else lake.lag_s(time.time())
                    lags.append(float("nan") if lag is None else lag)
                    sampling += time.thread_time() - spent
                cpu1, minutes = _cpu(jvm), (time.monotonic() - began) / 60
                after = (_count(batches, ""), _count(idle_marks_log, ".json"), common.current_lsn(dsn),
                         _table_commits(paths))  # fmt: skip
            finally:
                stop.set()
                merger.join(120)
                worker.stop()
                common.delete_topics(prefix)
        jvm_per_min = (cpu1[0] - cpu0[0]) / minutes
        python_per_min = (cpu1[1] - cpu0[1] - sampling) / minutes
        figures = {
            "tables": args.tables,
            "trigger_s": args.trigger_interval,
            "idle_s": round(args.idle_seconds),
            "cpu_s_per_min": round(jvm_per_min + python_per_min, 2),
            "jvm_cpu_s_per_min": round(jvm_per_min, 2),
            "python_cpu_s_per_min": round(python_per_min, 2),
            "idle_jvm_cpu_s_per_min": round(baseline_jvm, 2),
            "lag_s": round(lags[-1], 1),
            "lag_max_s": round(max(lags), 1),
            "idle_progress_interval_s": IDLE_PROGRESS_S,
            "batches": after[0] - before[0],
            "idle_mark_commits": after[1] - before[1],
            "table_commits": after[3] - before[3],
            "wal_moved_bytes": after[2] - before[2],
            "load_s": round(load_s, 1),
        }
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    common.report(
        f"Idle continuous merge: {args.tables} tables, trigger {args.trigger_interval:.0f} s, "
        f"{args.idle_seconds:.0f} s idle",
        [
            ("CPU a minute, merge (JVM + Python)", f"{figures['cpu_s_per_min']} s "
             f"(JVM {figures['jvm_cpu_s_per_min']}, Python {figures['python_cpu_s_per_min']}; target <= 3)"),
            ("baseline: the same JVM with no query", f"{figures['idle_jvm_cpu_s_per_min']} s a minute"),
            ("lag at the end / the most seen", f"{figures['lag_s']} / {figures['lag_max_s']} s "
             f"(the worker repeats its progress every {IDLE_PROGRESS_S:.0f} s; target <= 60 s)"),
            ("batches / idle-marks commits / commits to the mirrors", f"{figures['batches']} / "
             f"{figures['idle_mark_commits']} / {figures['table_commits']}"),
            ("WAL written meanwhile (any database)", f"{figures['wal_moved_bytes']} bytes"),
            ("the snapshot's merge before the window", f"{figures['load_s']} s"),
        ],
    )  # fmt: skip
    common.result("idle_merge", **figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
