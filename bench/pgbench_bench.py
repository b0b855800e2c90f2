"""(d) The worker's cost to the database: pgbench TPS (TPC-B-like) with no slot, then with the
worker streaming every pgbench table, then with no slot again (the baseline is the mean of the two
runs without, so that cache warm-up does not favour either side).

Run: `.venv/bin/python bench/pgbench_bench.py [--seconds 20] [--clients 4] [--scale 5]`.
`pgbench_history` has no primary key, so the worker runs with `-u` (its inserts are captured).

Ends with one `RESULT bench=pgbench name=value ... load1=...` line (`worker_bench_common.result`).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import tempfile
from pathlib import Path

from worker_bench_common import Worker, delete_topics, report, result, scratch_database, unique

_TPS = re.compile(r"tps = ([\d.]+) \(without initial connection time\)")


def pgbench_tps(dsn: str, seconds: int, clients: int) -> float:
    result = subprocess.run(
        ["pgbench", "-n", "-T", str(seconds), "-c", str(clients), "-j", str(min(clients, 2)), dsn],
        capture_output=True,
        text=True,
        check=True,
    )
    match = _TPS.search(result.stdout)
    if match is None:
        raise RuntimeError(f"no TPS in pgbench's output:\n{result.stdout}")
    return float(match.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=int, default=20)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--scale", type=int, default=5)
    parser.add_argument("--format", choices=("avro", "json"), default="avro")
    args = parser.parse_args()

    prefix = unique("bench")
    with scratch_database() as dsn, tempfile.TemporaryDirectory() as log_dir:
        subprocess.run(["pgbench", "-i", "-q", "-s", str(args.scale), dsn], check=True, capture_output=True)
        before = pgbench_tps(dsn, args.seconds, args.clients)
        worker = Worker(dsn, unique("pgb"), prefix, "-x", "-u", "-f", args.format, log_dir=Path(log_dir))
        try:
            worker.wait_log("streaming slot")
            cpu_before = worker.cpu_seconds()
            during = pgbench_tps(dsn, args.seconds, args.clients)
            cpu = worker.cpu_seconds() - cpu_before
        finally:
            worker.stop()
            delete_topics(prefix)
        after = pgbench_tps(dsn, args.seconds, args.clients)
    baseline = (before + after) / 2
    report(
        f"(d) pgbench, scale {args.scale}, {args.clients} clients, {args.seconds}s per run, {args.format}",
        [
            ("TPS without a slot (before, after)", f"{before:9,.0f}, {after:,.0f}  (baseline: mean)"),
            ("TPS with the worker streaming", f"{during:9,.0f}"),
            ("ratio with / without", f"{during / baseline:9.3f}x  (target: drop < 10%, i.e. >= 0.9x)"),
            ("worker CPU during the run", f"{cpu:9.1f} s  ({cpu / args.seconds:.0%} of one core)"),
        ],
    )

    result(
        "pgbench", format=args.format, scale=args.scale, clients=args.clients, tps_before=before,
        tps_after=after, tps_with_worker=during, with_vs_without=during / baseline,
        worker_cpu_share=cpu / args.seconds,
    )  # fmt: skip


if __name__ == "__main__":
    main()
