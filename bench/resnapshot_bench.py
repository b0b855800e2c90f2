"""(f) Re-snapshot while streaming: an N-row table published again by the running worker
(`bottledwater resnapshot`, chunks between watermarks), against `COPY ... TO STDOUT` of the same
table into /dev/null and the worker's first snapshot of it with one reader, all in the same run.

Run: `.venv/bin/python bench/resnapshot_bench.py [--rows 1000000] [--chunk-rows 4096] [--format avro|json]`.
Times are taken between the worker's own log lines ("snapshot of" / "snapshot complete", and
"re-snapshot of ... starts" / "re-snapshot of ...: N rows, done"): the second one is the time until
the last chunk's rows were handed to the producer.

Ends with one `RESULT bench=resnapshot name=value ... load1=...` line (`worker_bench_common.result`).
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
from pathlib import Path

from snapshot_bench import FILL, TABLE_DDL, copy_seconds
from worker_bench_common import (
    BOTTLEDWATER,
    Worker,
    delete_topics,
    execute,
    log_time,
    report,
    result,
    scratch_database,
    unique,
)

DEFAULT_ROWS = 1_000_000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=DEFAULT_ROWS)
    parser.add_argument("--chunk-rows", type=int, default=4096)
    parser.add_argument("--format", choices=("avro", "json"), default="avro")
    args = parser.parse_args()

    prefix, slot = unique("bench"), unique("resnap")
    with scratch_database() as dsn, tempfile.TemporaryDirectory() as log_dir:
        print(f"filling {args.rows:,} rows ...", flush=True)
        execute(dsn, TABLE_DDL, (FILL, (args.rows,)), "VACUUM ANALYZE orders")
        copy_s = copy_seconds(dsn)
        extra = ["-f", args.format, "-T", "partitions=4", "--snapshot-workers", "1"]
        extra += ["--resnapshot-chunk-rows", str(args.chunk_rows)]
        worker = Worker(dsn, slot, prefix, *extra, log_dir=Path(log_dir))
        try:
            first = (
                log_time(worker.wait_log("snapshot complete")) - log_time(worker.wait_log("snapshot of "))
            ).total_seconds()
            worker.wait_log("streaming slot")
            cpu_before = worker.cpu_seconds()
            subprocess.run(
                [BOTTLEDWATER, "-d", dsn, "-s", slot, "-p", prefix, "resnapshot", "public.orders"],
                check=True,
                capture_output=True,
            )
            begin = log_time(worker.wait_log("re-snapshot of public.orders starts"))
            end = log_time(worker.wait_log(f"re-snapshot of public.orders: {args.rows} rows, done"))
            cpu = worker.cpu_seconds() - cpu_before
            peak = worker.peak_rss_mb()
        finally:
            worker.stop()
            delete_topics(prefix)
    again = (end - begin).total_seconds()
    copy_rate, first_rate, again_rate = args.rows / copy_s, args.rows / first, args.rows / again
    report(
        f"(f) re-snapshot while streaming, {args.rows:,} rows, {args.format}, chunks of {args.chunk_rows}",
        [
            ("COPY TO STDOUT > /dev/null", f"{copy_s:8.2f} s  {copy_rate:12,.0f} rows/s  (baseline)"),
            ("first snapshot, 1 reader", f"{first:8.2f} s  {first_rate:12,.0f} rows/s"),
            ("re-snapshot while streaming", f"{again:8.2f} s  {again_rate:12,.0f} rows/s"),
            ("ratio re-snapshot / COPY", f"{again_rate / copy_rate:8.3f}x"),
            ("ratio re-snapshot / first snapshot", f"{again_rate / first_rate:8.3f}x"),
            (
                "worker CPU during the re-snapshot",
                f"{cpu:8.2f} s  ({args.rows / cpu:,.0f} rows per CPU-second)",
            ),
            ("worker peak RSS", f"{peak:8.0f} MB"),
        ],
    )

    result(
        "resnapshot", format=args.format, rows=args.rows, chunk_rows=args.chunk_rows,
        copy_rows_s=round(copy_rate), first_snapshot_rows_s=round(first_rate),
        resnapshot_rows_s=round(again_rate), resnapshot_vs_copy=again_rate / copy_rate,
        resnapshot_vs_first=again_rate / first_rate, cpu_us_per_row=cpu / args.rows * 1e6,
        peak_rss_mb=round(peak),
    )  # fmt: skip


if __name__ == "__main__":
    main()
