"""(e) Worker memory through one large transaction: peak RSS (VmHWM) of the worker while it streams
a single N-row INSERT (default 2M rows) into Kafka, against its RSS once streaming and idle (the
baseline, measured in the same run).

Run: `.venv/bin/python bench/rss_bench.py [--rows 2000000] [--format avro|json]`.
With the default settings (Postgres 14+) the transaction is streamed before its commit into the
worker's spool (`--spool-memory-mb`, the rest to a file) and produced at the commit; with
`--no-stream-in-progress` it comes at the commit, all at once. Either way the worker must stream it
through (the spool's budget, the producer's bounded queue), never hold it.

Ends with one `RESULT bench=rss name=value ... load1=...` line (`worker_bench_common.result`).
"""

from __future__ import annotations

import argparse
import re
import tempfile
import time
from pathlib import Path

from worker_bench_common import (
    Worker,
    delete_topics,
    execute,
    report,
    result,
    scratch_database,
    unique,
    wait_caught_up,
)

DEFAULT_ROWS = 2_000_000


def rss_mb(worker: Worker) -> float:
    status = Path(f"/proc/{worker.process.pid}/status").read_text()
    match = re.search(r"VmRSS:\s+(\d+) kB", status)
    return int(match.group(1)) / 1024 if match else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=DEFAULT_ROWS)
    parser.add_argument("--format", choices=("avro", "json"), default="avro")
    args = parser.parse_args()

    prefix, slot = unique("bench"), unique("rss")
    with scratch_database() as dsn, tempfile.TemporaryDirectory() as log_dir:
        execute(dsn, "CREATE TABLE big (id bigint PRIMARY KEY, note text, amount numeric(12, 2))")
        # A spool directory of its own: a worker starting elsewhere on this machine cleans the
        # shared default one (/tmp/bottledwater-spool), spool files of live workers included.
        spool_dir = str(Path(log_dir) / "spool")
        worker = Worker(
            dsn, slot, prefix, "-x", "-f", args.format, "-T", "partitions=4", "--spool-dir", spool_dir,
            log_dir=Path(log_dir),
        )  # fmt: skip
        try:
            worker.wait_log("streaming slot")
            time.sleep(1)
            idle = rss_mb(worker)
            started = time.monotonic()
            execute(
                dsn,
                (
                    "INSERT INTO big SELECT g, 'row ' || g, g / 100.0 FROM generate_series(1, %s) g",
                    (args.rows,),
                ),
            )
            committed = time.monotonic()
            wait_caught_up(dsn, slot)
            done = time.monotonic()
            peak = worker.peak_rss_mb()
        finally:
            worker.stop()
            delete_topics(prefix)
    report(
        f"(e) worker memory through one {args.rows:,}-row transaction, {args.format}",
        [
            ("RSS streaming, idle", f"{idle:8.0f} MB  (baseline)"),
            ("peak RSS (VmHWM)", f"{peak:8.0f} MB  (target < 300 MB)"),
            ("ratio peak / idle", f"{peak / idle:8.2f}x"),
            ("INSERT ... commit", f"{committed - started:8.1f} s"),
            (
                "commit -> all acknowledged",
                f"{done - committed:8.1f} s  ({args.rows / (done - committed):,.0f} rows/s)",
            ),
        ],
    )

    result(
        "rss", format=args.format, rows=args.rows, idle_rss_mb=round(idle), peak_rss_mb=round(peak),
        peak_vs_idle=peak / idle, commit_to_acked_s=done - committed,
    )  # fmt: skip


if __name__ == "__main__":
    main()
