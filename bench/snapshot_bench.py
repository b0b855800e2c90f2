"""(a) Snapshot throughput: an N-row table published to Kafka (every message acknowledged) by the
real worker, against `COPY ... TO STDOUT` of the same table into /dev/null in the same run.

Run: `.venv/bin/python bench/snapshot_bench.py [--rows 5000000] [--format avro|json] [--workers N]`.
The worker's time is taken between its own log lines "snapshot of ..." and "snapshot complete",
so process start-up and topic creation are not counted; COPY's is the whole `psql` run.
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
import time
from pathlib import Path

from worker_bench_common import (
    Worker,
    delete_topics,
    execute,
    log_time,
    report,
    scratch_database,
    unique,
)

DEFAULT_ROWS = 5_000_000
TABLE_DDL = """
CREATE TABLE orders (
    id bigint PRIMARY KEY, customer_id int NOT NULL, status text NOT NULL, amount numeric(12, 2),
    created_at timestamptz NOT NULL, shipped boolean, note text
)"""
FILL = """
INSERT INTO orders
SELECT g, g %% 10007, (ARRAY['new', 'paid', 'shipped'])[1 + g %% 3], (g %% 100000) / 100.0,
       timestamptz '2024-01-01 00:00:00+00' + g * interval '1 second', g %% 2 = 0,
       CASE WHEN g %% 5 = 0 THEN NULL ELSE 'note ' || g END
  FROM generate_series(1, %s) g"""


def copy_seconds(dsn: str) -> float:
    started = time.monotonic()
    with open("/dev/null", "wb") as sink:
        subprocess.run(["psql", dsn, "-qAt", "-c", "COPY orders TO STDOUT"], stdout=sink, check=True)
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=DEFAULT_ROWS)
    parser.add_argument("--format", choices=("avro", "json"), default="avro")
    parser.add_argument("--workers", type=int, default=None, help="--snapshot-workers (default: cores)")
    args = parser.parse_args()

    prefix = unique("bench")
    with scratch_database() as dsn, tempfile.TemporaryDirectory() as log_dir:
        print(f"filling {args.rows:,} rows ...", flush=True)
        execute(dsn, TABLE_DDL, (FILL, (args.rows,)), "VACUUM ANALYZE orders")
        copy_s = copy_seconds(dsn)
        extra = ["-f", args.format, "-T", "partitions=4"]
        if args.workers:
            extra += ["--snapshot-workers", str(args.workers)]
        worker = Worker(dsn, unique("snap"), prefix, *extra, log_dir=Path(log_dir))
        try:
            begin = log_time(worker.wait_log("snapshot of "))
            cpu_before = worker.cpu_seconds()
            end = log_time(worker.wait_log("snapshot complete"))
            cpu = worker.cpu_seconds() - cpu_before
            peak = worker.peak_rss_mb()
        finally:
            worker.stop()
            delete_topics(prefix)
    worker_s = (end - begin).total_seconds()
    copy_rate, worker_rate = args.rows / copy_s, args.rows / worker_s
    report(
        f"(a) snapshot of {args.rows:,} rows, {args.format}",
        [
            ("COPY TO STDOUT > /dev/null", f"{copy_s:8.2f} s  {copy_rate:12,.0f} rows/s  (baseline)"),
            ("worker snapshot, acked", f"{worker_s:8.2f} s  {worker_rate:12,.0f} rows/s"),
            ("ratio worker / COPY", f"{worker_rate / copy_rate:8.3f}x  (target >= 0.5x)"),
            ("worker CPU (all processes)", f"{cpu:8.2f} s  ({args.rows / cpu:,.0f} rows per CPU-second)"),
            ("worker peak RSS, main process", f"{peak:8.0f} MB"),
        ],
    )


if __name__ == "__main__":
    main()
