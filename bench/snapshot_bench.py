"""(a) Snapshot throughput: an N-row table published to Kafka (every message acknowledged) by the
real worker, once per producer (`--producer native`: the native codec's own librdkafka, whole
batches produced from Rust; `confluent`: one confluent-kafka `produce()` per row), against two
baselines measured in the same run on the same table:

- COPY: `COPY orders TO STDOUT` into /dev/null (what Postgres can hand out);
- the pipe: `COPY orders TO STDOUT | kcat -P` into the same Kafka (a C producer: lz4, linger 20 ms,
  acks=all, one message per row), until kcat exits, i.e. until Kafka acknowledged every message.
  This is the physical limit the worker is measured against;
- the keyed pipe, the pipe with the contract's message shape: `COPY (SELECT id, orders.*) | kcat -P
  -K <tab>` (each row keyed by its id) with the five `bw.*` headers of a snapshot read (`-H`), and the
  worker's own producer settings (those of `bottledwater` plus any `-C` of the run): what a C producer
  costs doing what the worker must do, short of encoding. Each `--variant` gets its own keyed pipe
  with its settings, so worker and pipe are compared on equal terms. Debian's kcat 1.7 links its own
  librdkafka (2.0), the worker's native producer 2.12.

Both pipes also print their CPU per row (psql and kcat together, from the children's rusage).

Run: `make bench-deps` once (Debian's kcat), then
`.venv/bin/python bench/snapshot_bench.py [--rows 1000000] [--format avro|json] [--workers N] [--codec C]
[--producers native,confluent] [--variant LABEL=key=value[,key=value...]]`.
The worker's time is taken between its own log lines "snapshot of ..." and "snapshot complete",
so process start-up and topic creation are not counted; the baselines' are their whole runs.
Ends with one `RESULT name=value ...` line.
"""

from __future__ import annotations

import argparse
import resource
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

from cdc_worker.shell.kafka_publisher import producer_settings

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


def pipe_seconds(dsn: str, topic: str) -> tuple[float, float]:
    """`COPY | kcat -P` into `topic` (4 partitions, like the worker's), until every row is acknowledged:
    (seconds, CPU seconds of psql and kcat)."""
    kcat = ["kcat", "-P", "-b", BROKER, "-t", topic, "-z", "lz4", "-X", "linger.ms=20", "-X", "acks=all"]
    return run_pipe(dsn, topic, "COPY orders TO STDOUT", kcat)


def run_pipe(dsn: str, topic: str, query: str, kcat: list[str]) -> tuple[float, float]:
    create_topic(topic, partitions=4)
    started, cpu_before = time.monotonic(), children_cpu_seconds()
    copy = subprocess.Popen(["psql", dsn, "-qAt", "-c", query], stdout=subprocess.PIPE)
    subprocess.run(kcat, stdin=copy.stdout, check=True)
    if copy.wait() != 0:
        raise SystemExit(f"COPY for the pipe into {topic} failed")
    return time.monotonic() - started, children_cpu_seconds() - cpu_before


def children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


# A snapshot read's headers as the worker writes them (DESIGN.md): the same for every row of a table.
SNAPSHOT_HEADERS = {
    "bw.op": "r",
    "bw.lsn": "4127293520",
    "bw.seq": "0",
    "bw.xid": "918273",
    "bw.commit_ts": "2026-11-24T07:02:16.123456+00:00",
}


def keyed_pipe_seconds(dsn: str, topic: str, overrides: dict[str, str]) -> tuple[float, float]:
    """`COPY | kcat -P -K` into `topic` (4 partitions), every row keyed by its id and carrying the
    five snapshot headers, with the worker's producer settings updated by `overrides`: (seconds,
    CPU seconds of psql and kcat)."""
    settings = producer_settings(BROKER, overrides, "bench-keyed-pipe")
    del settings["bootstrap.servers"]
    kcat = ["kcat", "-P", "-b", BROKER, "-t", topic, "-K", "\t"]
    kcat += [arg for name, value in SNAPSHOT_HEADERS.items() for arg in ("-H", f"{name}={value}")]
    kcat += [arg for name, value in settings.items() for arg in ("-X", f"{name}={value}")]
    # The id twice: the first column up to the tab is the key, the whole row after it the value.
    return run_pipe(dsn, topic, "COPY (SELECT id, orders.* FROM orders) TO STDOUT", kcat)


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
        pipe_s, pipe_cpu = pipe_seconds(dsn, f"{prefix}.pipe")
        keyed_s = {"": keyed_pipe_seconds(dsn, f"{prefix}.keyed", {})}
        extra = ["-f", args.format, "-T", "partitions=4", "--codec", args.codec]
        if args.workers:
            extra += ["--snapshot-workers", str(args.workers)]
        runs = {}
        try:
            for producer in producers:
                runs[producer] = run_worker(dsn, prefix, [*extra, "--producer", producer], Path(log_dir))
            for label, settings in variants:
                overrides = dict(setting.split("=", 1) for setting in settings)
                keyed_s[label] = keyed_pipe_seconds(dsn, f"{prefix}.keyed-{label}", overrides)
                config = [arg for setting in settings for arg in ("-C", setting)]
                native = [*extra, "--producer", "native", *config]
                runs[label] = run_worker(dsn, prefix, native, Path(log_dir))
        finally:
            delete_topics(prefix)
    copy_rate, pipe_rate = args.rows / copy_s, args.rows / pipe_s
    keyed_rate = {label: args.rows / seconds for label, (seconds, _) in keyed_s.items()}
    keyed_us = {label: cpu / args.rows * 1e6 for label, (_, cpu) in keyed_s.items()}
    pipe_us = pipe_cpu / args.rows * 1e6
    lines = [
        ("COPY TO STDOUT > /dev/null", f"{copy_s:8.2f} s  {copy_rate:12,.0f} rows/s  (baseline)"),
        ("COPY | kcat -P, acked (the pipe)", f"{pipe_s:8.2f} s  {pipe_rate:12,.0f} rows/s  (baseline)"),
        ("  pipe CPU (psql and kcat)", f"{pipe_cpu:8.2f} s  ({pipe_us:.2f} us per row)"),
    ]
    figures: dict[str, object] = {
        "copy_rows_s": round(copy_rate), "pipe_rows_s": round(pipe_rate), "pipe_cpu_us_per_row": pipe_us,
    }  # fmt: skip
    for label, (seconds, cpu) in keyed_s.items():
        name, key = (
            (f"keyed pipe, {label}'s settings", f"{label}_keyed_pipe")
            if label
            else ("keyed pipe", "keyed_pipe")
        )
        lines += [
            (
                f"COPY | kcat -P -K -H x5, acked ({name})",
                f"{seconds:8.2f} s  {keyed_rate[label]:12,.0f} rows/s",
            ),
            ("  keyed pipe CPU (psql and kcat)", f"{cpu:8.2f} s  ({keyed_us[label]:.2f} us per row)"),
        ]
        figures |= {f"{key}_rows_s": round(keyed_rate[label]), f"{key}_cpu_us_per_row": keyed_us[label]}
    for producer, (worker_s, cpu, peak) in runs.items():
        worker_rate = args.rows / worker_s
        cpu_us = cpu / args.rows * 1e6
        # A variant is compared with the keyed pipe run with its own settings.
        keyed = keyed_rate.get(producer, keyed_rate[""])
        lines += [
            (
                f"worker snapshot, {producer}, acked",
                f"{worker_s:8.2f} s  {worker_rate:12,.0f} rows/s",
            ),
            ("  ratio worker / pipe", f"{worker_rate / pipe_rate:8.3f}x  (target >= 0.5x)"),
            ("  ratio worker / keyed pipe", f"{worker_rate / keyed:8.3f}x"),
            ("  ratio worker / COPY", f"{worker_rate / copy_rate:8.3f}x"),
            ("  worker CPU (all processes)", f"{cpu:8.2f} s  ({cpu_us:.2f} us per row)"),
            ("  worker peak RSS, main process", f"{peak:8.0f} MB"),
        ]
        figures |= {
            f"{producer}_rows_s": round(worker_rate), f"{producer}_vs_pipe": worker_rate / pipe_rate,
            f"{producer}_vs_keyed_pipe": worker_rate / keyed,
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
