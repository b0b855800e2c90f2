"""(a) Snapshot throughput: an N-row table published to Kafka (every message acknowledged) by the
real worker, once per producer (`--producer native`: the native codec's own librdkafka, whole
batches produced from Rust; `confluent`: one confluent-kafka `produce()` per row), against two
baselines measured in the same run on the same table:

- COPY: `COPY orders TO STDOUT` into /dev/null (what Postgres can hand out);
- the pipe: `COPY orders TO STDOUT | kcat -P` into the same Kafka (a C producer: lz4, linger 20 ms,
  acks=all, one message per row), until kcat exits, i.e. until Kafka acknowledged every message.
  This is the physical limit the worker is measured against.

Run: `make bench-deps` once (Debian's kcat), then
`.venv/bin/python bench/snapshot_bench.py [--rows 1000000] [--format avro|json] [--workers N] [--codec C]
[--producers native,confluent]`.
The worker's time is taken between its own log lines "snapshot of ..." and "snapshot complete",
so process start-up and topic creation are not counted; the baselines' are their whole runs.
Ends with one `RESULT name=value ...` line.
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
import time
from pathlib import Path

from worker_bench_common import (
    BROKER,
    Worker,
    create_topic,
    delete_topics,
    execute,
    log_time,
    report,
    result,
    scratch_database,
    unique,
)

DEFAULT_ROWS = 1_000_000
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


def pipe_seconds(dsn: str, topic: str) -> float:
    """`COPY | kcat -P` into `topic` (4 partitions, like the worker's), until every row is acknowledged."""
    create_topic(topic, partitions=4)
    started = time.monotonic()
    copy = subprocess.Popen(["psql", dsn, "-qAt", "-c", "COPY orders TO STDOUT"], stdout=subprocess.PIPE)
    kcat = ["kcat", "-P", "-b", BROKER, "-t", topic, "-z", "lz4", "-X", "linger.ms=20", "-X", "acks=all"]
    subprocess.run(kcat, stdin=copy.stdout, check=True)
    if copy.wait() != 0:
        raise SystemExit("COPY for the pipe baseline failed")
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=DEFAULT_ROWS)
    parser.add_argument("--format", choices=("avro", "json"), default="avro")
    parser.add_argument("--workers", type=int, default=None, help="--snapshot-workers (default: cores)")
    parser.add_argument(
        "--codec", choices=("auto", "native", "python"), default="auto", help="the worker's --codec"
    )
    parser.add_argument(
        "--producers", default="native,confluent", help="the worker's --producer values to run, in order"
    )
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="LABEL=K=V[,K=V...]",
        help="one more native-producer run with these -C settings, reported under LABEL (repeatable)",
    )
    args = parser.parse_args()
    producers = args.producers.split(",")
    variants = [parse_variant(v) for v in args.variant]

    prefix = unique("bench")
    with scratch_database() as dsn, tempfile.TemporaryDirectory() as log_dir:
        print(f"filling {args.rows:,} rows ...", flush=True)
        execute(dsn, TABLE_DDL, (FILL, (args.rows,)), "VACUUM ANALYZE orders")
        copy_s = copy_seconds(dsn)
        pipe_s = pipe_seconds(dsn, f"{prefix}.pipe")
        extra = ["-f", args.format, "-T", "partitions=4", "--codec", args.codec]
        if args.workers:
            extra += ["--snapshot-workers", str(args.workers)]
        runs = {}
        try:
            for producer in producers:
                runs[producer] = run_worker(dsn, prefix, [*extra, "--producer", producer], Path(log_dir))
            for label, settings in variants:
                config = [arg for setting in settings for arg in ("-C", setting)]
                native = [*extra, "--producer", "native", *config]
                runs[label] = run_worker(dsn, prefix, native, Path(log_dir))
        finally:
            delete_topics(prefix)
    copy_rate, pipe_rate = args.rows / copy_s, args.rows / pipe_s
    lines = [
        ("COPY TO STDOUT > /dev/null", f"{copy_s:8.2f} s  {copy_rate:12,.0f} rows/s  (baseline)"),
        ("COPY | kcat -P, acked (the pipe)", f"{pipe_s:8.2f} s  {pipe_rate:12,.0f} rows/s  (baseline)"),
    ]
    figures: dict[str, object] = {"copy_rows_s": round(copy_rate), "pipe_rows_s": round(pipe_rate)}
    for producer, (worker_s, cpu, peak) in runs.items():
        worker_rate = args.rows / worker_s
        cpu_us = cpu / args.rows * 1e6
        lines += [
            (
                f"worker snapshot, {producer}, acked",
                f"{worker_s:8.2f} s  {worker_rate:12,.0f} rows/s",
            ),
            ("  ratio worker / pipe", f"{worker_rate / pipe_rate:8.3f}x  (target >= 0.5x)"),
            ("  ratio worker / COPY", f"{worker_rate / copy_rate:8.3f}x"),
            ("  worker CPU (all processes)", f"{cpu:8.2f} s  ({cpu_us:.2f} us per row)"),
            ("  worker peak RSS, main process", f"{peak:8.0f} MB"),
        ]
        figures |= {
            f"{producer}_rows_s": round(worker_rate), f"{producer}_vs_pipe": worker_rate / pipe_rate,
            f"{producer}_vs_copy": worker_rate / copy_rate, f"{producer}_cpu_us_per_row": cpu_us,
            f"{producer}_peak_rss_mb": round(peak),
        }  # fmt: skip
    report(f"(a) snapshot of {args.rows:,} rows, {args.format}, codec {args.codec}", lines)
    result("snapshot", format=args.format, codec=args.codec, rows=args.rows, **figures)


def parse_variant(text: str) -> tuple[str, list[str]]:
    label, _, settings = text.partition("=")
    if not label or "=" not in settings:
        raise SystemExit(f"--variant {text!r}: expected LABEL=key=value[,key=value...]")
    return label, settings.split(",")


def run_worker(dsn: str, prefix: str, extra: list[str], log_dir: Path) -> tuple[float, float, float]:
    """One worker's snapshot of the table into fresh topics: (seconds, CPU seconds, peak RSS MB)."""
    run_prefix = unique(prefix)
    worker = Worker(dsn, unique("snap"), run_prefix, *extra, log_dir=log_dir)
    try:
        begin = log_time(worker.wait_log("snapshot of "))
        cpu_before = worker.cpu_seconds()
        end = log_time(worker.wait_log("snapshot complete"))
        cpu = worker.cpu_seconds() - cpu_before
        peak = worker.peak_rss_mb()
    finally:
        worker.stop()
        delete_topics(run_prefix)
    return (end - begin).total_seconds(), cpu, peak


if __name__ == "__main__":
    main()
