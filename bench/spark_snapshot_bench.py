"""The initial load on Spark (`--snapshot-engine spark`) against the worker's own snapshot and the
pipe (`COPY | kcat -P`), on the same N-row table (bench/snapshot_bench.py's `orders`) and machine.

Each engine's time is taken between its own log lines: "snapshot of"/"snapshot complete" for the
worker, "spark snapshot of"/"spark snapshot complete" for Spark (the Spark driver's start-up, about
5 s, is outside both; the job's task scheduling and every task's connection and producer are in).
Rows per executor-core-second = rows / (Spark time x the master's cores): what one core of a
cluster adds (docs/benchmarks.md, "Spark snapshot"). No assertions.

Run: `.venv/bin/python bench/spark_snapshot_bench.py [--rows 1000000] [--master local[2,4]]`.
Ends with one `RESULT name=value ...` line.
"""

from __future__ import annotations

import argparse
import os
import re
import tempfile
from pathlib import Path

from snapshot_bench import FILL, TABLE_DDL, copy_seconds, pipe_seconds
from worker_bench_common import Worker, delete_topics, execute, log_time, report, scratch_database, unique

# The engine's start line: "... on local[2,4] (default parallelism 2)", the executor cores.
CORES = re.compile(r"\(default parallelism (\d+)\)")


def engine_seconds(
    dsn: str, prefix: str, log_dir: Path, start: str, end: str, *extra: str
) -> tuple[float, str]:
    worker = Worker(dsn, unique("snap"), prefix, "-T", "partitions=4", *extra, log_dir=log_dir)
    try:
        first = worker.wait_log(start)
        last = worker.wait_log(end)
    finally:
        worker.stop()
    return (log_time(last) - log_time(first)).total_seconds(), first


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--master", default="local[2,4]")
    args = parser.parse_args()
    with scratch_database() as dsn, tempfile.TemporaryDirectory() as log_dir:
        print(f"filling {args.rows:,} rows ...", flush=True)
        execute(dsn, TABLE_DDL, (FILL, (args.rows,)), "VACUUM ANALYZE orders")
        copy_s = copy_seconds(dsn)
        prefix = unique("bench")
        try:
            pipe_s, _ = pipe_seconds(dsn, f"{prefix}.pipe")
            worker_s, _ = engine_seconds(
                dsn, f"{prefix}w", Path(log_dir), "snapshot of ", "snapshot complete"
            )
            spark_s, line = engine_seconds(
                dsn, f"{prefix}s", Path(log_dir), "spark snapshot of ", "spark snapshot complete",
                "--snapshot-engine", "spark", "--spark-master", args.master,
            )  # fmt: skip
        finally:
            for name in (prefix, f"{prefix}w", f"{prefix}s"):
                delete_topics(name)
    found = CORES.search(line)
    cores = int(found.group(1)) if found else 1
    rows = args.rows
    spark_rate, worker_rate, pipe_rate = rows / spark_s, rows / worker_s, rows / pipe_s
    per_core = spark_rate / cores
    report(
        f"initial load of {rows:,} rows, avro, Spark {args.master} vs the worker vs the pipe",
        [
            ("COPY TO STDOUT > /dev/null", f"{copy_s:8.2f} s  {rows / copy_s:12,.0f} rows/s  (baseline)"),
            ("COPY | kcat -P, acked (the pipe)", f"{pipe_s:8.2f} s  {pipe_rate:12,.0f} rows/s  (baseline)"),
            ("worker snapshot, acked", f"{worker_s:8.2f} s  {worker_rate:12,.0f} rows/s"),
            ("Spark snapshot, acked", f"{spark_s:8.2f} s  {spark_rate:12,.0f} rows/s"),
            ("Spark rows per executor-core-second", f"{per_core:12,.0f}  ({cores} cores)"),
            ("ratio Spark / worker", f"{spark_rate / worker_rate:8.3f}x"),
            ("ratio Spark / pipe", f"{spark_rate / pipe_rate:8.3f}x"),
        ],
    )
    print(
        f"RESULT bench=spark_snapshot rows={rows} master={args.master} cores={cores} "
        f"copy_rows_s={rows / copy_s:.0f} pipe_rows_s={pipe_rate:.0f} worker_rows_s={worker_rate:.0f} "
        f"spark_rows_s={spark_rate:.0f} spark_rows_per_core_s={per_core:.0f} "
        f"spark_vs_worker={spark_rate / worker_rate:.3f} spark_vs_pipe={spark_rate / pipe_rate:.3f} "
        f"load1={os.getloadavg()[0]:.2f}"
    )


if __name__ == "__main__":
    main()
