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

Where the machine's cores go: the worker, Postgres and the Kafka broker share them, so for each pipe
and each worker run the bench also reads, in the same window, Postgres' CPU (every backend: the
COPY's, or the worker's snapshot readers) and the broker's (its JVM) per row (`StackCpu`; the local
stack only). With `w` the worker's CPU per row (all its processes), `p` Postgres' and `k` the
broker's during its run, the cores (`cores`, 2 here) can carry at most `cores / (w + p + k)` rows/s,
however the work is scheduled (a pipe's bound likewise, with psql and kcat for `w`); and the worker
CPU per row that 0.5x the pipe would leave is `cores / (0.5 * pipe_rate) - p - k` (negative: out of
reach even with a worker that costs nothing). RESULT fields: `pipe_postgres_us_per_row`,
`pipe_broker_us_per_row`, `pipe_two_core_bound_rows_s` (and the same three with `keyed_pipe_` and
`<label>_keyed_pipe_`), `cores`, and per worker run `<producer>_postgres_us_per_row`,
`<producer>_broker_us_per_row`, `<producer>_two_core_bound_rows_s`, `<producer>_two_core_bound_vs_pipe`
and `<producer>_us_left_at_target`. The table is vacuumed and a CHECKPOINT follows the fill, so
neither autovacuum nor a checkpoint of the fill lands in a window.

Run: `make bench-deps` once (Debian's kcat), then
`.venv/bin/python bench/snapshot_bench.py [--rows 1000000] [--format avro|json] [--workers N] [--codec C]
[--producers native,confluent] [--variant LABEL=key=value[,key=value...]]`.
The worker's time is taken between its own log lines "snapshot of ..." and "snapshot complete",
so process start-up and topic creation are not counted; the baselines' are their whole runs.
`<producer>_from_start_s` and `<producer>_from_start_cpu_s` are the worker's wall and CPU seconds
from its launch to "snapshot complete", start-up included (work moved ahead of the window, such as
the readers' fork server, shows there).
Ends with one `RESULT name=value ...` line.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from worker_bench_common import (
    BROKER,
    CpuSample,
    StackCpu,
    Worker,
    core_bound,
    create_topic,
    delete_topics,
    execute,
    log_time,
    report,
    result,
    scratch_database,
    unique,
    us_left_at,
)

from cdc_worker.shell.kafka_settings import producer_settings

DEFAULT_ROWS = 1_000_000
# The target: the worker at >= 0.5x the pipe's rows/s.
TARGET_VS_PIPE = 0.5
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


@dataclass(frozen=True)
class PipeRun:
    """One pipe's run: its seconds, the CPU seconds of psql and kcat, and what Postgres and the
    broker spent meanwhile (None when not asked)."""

    seconds: float
    cpu: float
    stack: CpuSample | None


def pipe_seconds(dsn: str, topic: str) -> tuple[float, float]:
    """`COPY | kcat -P` into `topic` (4 partitions, like the worker's), until every row is acknowledged:
    (seconds, CPU seconds of psql and kcat)."""
    run = pipe_run(dsn, topic, None)
    return run.seconds, run.cpu


def pipe_run(dsn: str, topic: str, stack_cpu: StackCpu | None) -> PipeRun:
    """`pipe_seconds`, with Postgres' and the broker's CPU in the same window if `stack_cpu`."""
    kcat = ["kcat", "-P", "-b", BROKER, "-t", topic, "-z", "lz4", "-X", "linger.ms=20", "-X", "acks=all"]
    return run_pipe(dsn, topic, "COPY orders TO STDOUT", kcat, stack_cpu)


def run_pipe(dsn: str, topic: str, query: str, kcat: list[str], stack_cpu: StackCpu | None) -> PipeRun:
    create_topic(topic, partitions=4)
    stack_before = None if stack_cpu is None else stack_cpu.sample()
    started, cpu_before = time.monotonic(), children_cpu_seconds()
    copy = subprocess.Popen(["psql", dsn, "-qAt", "-c", query], stdout=subprocess.PIPE)
    subprocess.run(kcat, stdin=copy.stdout, check=True)
    if copy.wait() != 0:
        raise SystemExit(f"COPY for the pipe into {topic} failed")
    seconds, cpu = time.monotonic() - started, children_cpu_seconds() - cpu_before
    # The COPY's backend, whether it has ended yet or not, is in the sample (StackCpu).
    stack = None if stack_cpu is None or stack_before is None else stack_cpu.sample() - stack_before
    return PipeRun(seconds, cpu, stack)


def children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


# A snapshot read's headers as the worker writes them (kafka_contract.headers): the same for every
# row of a table.
SNAPSHOT_HEADERS = {
    "bw.op": "r",
    "bw.lsn": "4127293520",
    "bw.seq": "0",
    "bw.xid": "918273",
    "bw.commit_ts": "2026-11-24T07:02:16.123456+00:00",
}


def keyed_pipe_run(dsn: str, topic: str, overrides: dict[str, str], stack_cpu: StackCpu | None) -> PipeRun:
    """`COPY | kcat -P -K` into `topic` (4 partitions), every row keyed by its id and carrying the
    five snapshot headers, with the worker's producer settings updated by `overrides`."""
    settings = producer_settings(BROKER, overrides, "bench-keyed-pipe")
    del settings["bootstrap.servers"]
    kcat = ["kcat", "-P", "-b", BROKER, "-t", topic, "-K", "\t"]
    kcat += [arg for name, value in SNAPSHOT_HEADERS.items() for arg in ("-H", f"{name}={value}")]
    kcat += [arg for name, value in settings.items() for arg in ("-X", f"{name}={value}")]
    # The id twice: the first column up to the tab is the key, the whole row after it the value.
    return run_pipe(dsn, topic, "COPY (SELECT id, orders.* FROM orders) TO STDOUT", kcat, stack_cpu)


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
        # The fill's dirty pages written now, not by a checkpoint inside a window.
        execute(dsn, TABLE_DDL, (FILL, (args.rows,)), "VACUUM ANALYZE orders", "CHECKPOINT")
        stack_cpu = StackCpu.locate(dsn)
        copy_s = copy_seconds(dsn)
        pipe = pipe_run(dsn, f"{prefix}.pipe", stack_cpu)
        keyed = {"": keyed_pipe_run(dsn, f"{prefix}.keyed", {}, stack_cpu)}
        extra = ["-f", args.format, "-T", "partitions=4", "--codec", args.codec]
        if args.workers:
            extra += ["--snapshot-workers", str(args.workers)]
        runs = {}
        try:
            for producer in producers:
                runs[producer] = run_worker(
                    dsn, prefix, [*extra, "--producer", producer], Path(log_dir), stack_cpu
                )
            for label, settings in variants:
                overrides = dict(setting.split("=", 1) for setting in settings)
                keyed[label] = keyed_pipe_run(dsn, f"{prefix}.keyed-{label}", overrides, stack_cpu)
                config = [arg for setting in settings for arg in ("-C", setting)]
                native = [*extra, "--producer", "native", *config]
                runs[label] = run_worker(dsn, prefix, native, Path(log_dir), stack_cpu)
        finally:
            delete_topics(prefix)
    rows, cores = args.rows, os.cpu_count() or 1
    copy_rate, pipe_rate = rows / copy_s, rows / pipe.seconds
    target = TARGET_VS_PIPE * pipe_rate
    lines = [
        ("COPY TO STDOUT > /dev/null", f"{copy_s:8.2f} s  {copy_rate:12,.0f} rows/s  (baseline)"),
        ("COPY | kcat -P, acked (the pipe)", f"{pipe.seconds:8.2f} s  {pipe_rate:12,.0f} rows/s  (baseline)"),
    ]
    figures: dict[str, object] = {"copy_rows_s": round(copy_rate), "pipe_rows_s": round(pipe_rate)}
    pipe_lines, pipe_figures = pipe_accounting("pipe", pipe, rows, cores)
    lines += pipe_lines
    figures |= pipe_figures
    for label, run in keyed.items():
        name, key = (
            (f"keyed pipe, {label}'s settings", f"{label}_keyed_pipe")
            if label
            else ("keyed pipe", "keyed_pipe")
        )
        lines.append(
            (
                f"COPY | kcat -P -K -H x5, acked ({name})",
                f"{run.seconds:8.2f} s  {rows / run.seconds:12,.0f} rows/s",
            )
        )
        keyed_lines, keyed_figures = pipe_accounting(key, run, rows, cores)
        lines += keyed_lines
        figures |= {f"{key}_rows_s": round(rows / run.seconds)} | keyed_figures
    for producer, worker in runs.items():
        worker_rate = rows / worker.seconds
        cpu_us = worker.cpu / rows * 1e6
        postgres_us, broker_us = worker.stack.postgres / rows * 1e6, worker.stack.broker / rows * 1e6
        bound = core_bound(cores, cpu_us, postgres_us, broker_us)
        left_us = us_left_at(cores, target, postgres_us, broker_us)
        # A variant is compared with the keyed pipe run with its own settings.
        keyed_rate = rows / keyed.get(producer, keyed[""]).seconds
        lines += [
            (
                f"worker snapshot, {producer}, acked",
                f"{worker.seconds:8.2f} s  {worker_rate:12,.0f} rows/s",
            ),
            ("  ratio worker / pipe", f"{worker_rate / pipe_rate:8.3f}x  (target >= {TARGET_VS_PIPE}x)"),
            ("  ratio worker / keyed pipe", f"{worker_rate / keyed_rate:8.3f}x"),
            ("  ratio worker / COPY", f"{worker_rate / copy_rate:8.3f}x"),
            ("  worker CPU (all processes)", f"{worker.cpu:8.2f} s  ({cpu_us:.2f} us per row)"),
            ("  Postgres CPU meanwhile", f"{worker.stack.postgres:8.2f} s  ({postgres_us:.2f} us per row)"),
            ("  broker CPU meanwhile", f"{worker.stack.broker:8.2f} s  ({broker_us:.2f} us per row)"),
            (
                f"  {cores}-core bound, worker",
                f"{bound:21,.0f} rows/s  ({bound / pipe_rate:.3f}x the pipe; "
                f"{cores} / {cpu_us + postgres_us + broker_us:.2f} us)",
            ),
            (
                f"  worker CPU left at {TARGET_VS_PIPE}x the pipe",
                f"{left_us:8.2f} us per row  ({cores} / {target:,.0f} rows/s - Postgres - broker)",
            ),
            ("  worker peak RSS, main process", f"{worker.peak_rss_mb:8.0f} MB"),
            (
                "  from the worker's start, start-up included",
                f"{worker.from_start_seconds:8.2f} s  ({worker.from_start_cpu:.2f} s of CPU)",
            ),
        ]
        figures |= {
            f"{producer}_rows_s": round(worker_rate), f"{producer}_vs_pipe": worker_rate / pipe_rate,
            f"{producer}_vs_keyed_pipe": worker_rate / keyed_rate,
            f"{producer}_vs_copy": worker_rate / copy_rate, f"{producer}_cpu_us_per_row": cpu_us,
            f"{producer}_postgres_us_per_row": postgres_us, f"{producer}_broker_us_per_row": broker_us,
            f"{producer}_two_core_bound_rows_s": round(bound),
            f"{producer}_two_core_bound_vs_pipe": bound / pipe_rate,
            f"{producer}_us_left_at_target": left_us, f"{producer}_peak_rss_mb": round(worker.peak_rss_mb),
            f"{producer}_from_start_s": worker.from_start_seconds,
            f"{producer}_from_start_cpu_s": worker.from_start_cpu,
        }  # fmt: skip
    report(f"(a) snapshot of {rows:,} rows, {args.format}, codec {args.codec}", lines)
    result("snapshot", format=args.format, codec=args.codec, rows=rows, cores=cores, **figures)


def pipe_accounting(
    key: str, run: PipeRun, rows: int, cores: int
) -> tuple[list[tuple[str, str]], dict[str, object]]:
    """A pipe's CPU per row (psql and kcat, Postgres, the broker) and the bound they put on its
    rate: report lines and RESULT figures named after `key`."""
    assert run.stack is not None, "the bench samples the stack's CPU around every pipe"
    cpu_us = run.cpu / rows * 1e6
    postgres_us, broker_us = run.stack.postgres / rows * 1e6, run.stack.broker / rows * 1e6
    bound = core_bound(cores, cpu_us, postgres_us, broker_us)
    lines = [
        ("  psql and kcat CPU", f"{run.cpu:8.2f} s  ({cpu_us:.2f} us per row)"),
        ("  Postgres CPU meanwhile", f"{run.stack.postgres:8.2f} s  ({postgres_us:.2f} us per row)"),
        ("  broker CPU meanwhile", f"{run.stack.broker:8.2f} s  ({broker_us:.2f} us per row)"),
        (
            f"  {cores}-core bound",
            f"{bound:21,.0f} rows/s  ({cores} / {cpu_us + postgres_us + broker_us:.2f} us)",
        ),
    ]
    figures: dict[str, object] = {
        f"{key}_cpu_us_per_row": cpu_us, f"{key}_postgres_us_per_row": postgres_us,
        f"{key}_broker_us_per_row": broker_us, f"{key}_two_core_bound_rows_s": round(bound),
    }  # fmt: skip
    return lines, figures


def parse_variant(text: str) -> tuple[str, list[str]]:
    label, _, settings = text.partition("=")
    if not label or "=" not in settings:
        raise SystemExit(f"--variant {text!r}: expected LABEL=key=value[,key=value...]")
    return label, settings.split(",")


@dataclass(frozen=True)
class WorkerRun:
    """One worker's snapshot: its seconds (between its log lines), its CPU seconds (all its
    processes), what Postgres and the broker spent in the same window, and its peak RSS."""

    seconds: float
    cpu: float
    stack: CpuSample
    peak_rss_mb: float
    # From the worker's start (its process launched) to "snapshot complete": wall and CPU seconds,
    # start-up included (imports, topics, the slot, the readers' fork server).
    from_start_seconds: float
    from_start_cpu: float


def run_worker(dsn: str, prefix: str, extra: list[str], log_dir: Path, stack_cpu: StackCpu) -> WorkerRun:
    """One worker's snapshot of the table into fresh topics."""
    run_prefix = unique(prefix)
    started = datetime.now()  # local time, as the worker's log lines
    worker = Worker(dsn, unique("snap"), run_prefix, *extra, log_dir=log_dir)
    try:
        begin = log_time(worker.wait_log("snapshot of "))
        cpu_before, stack_before = worker.cpu_seconds(), stack_cpu.sample()
        end = log_time(worker.wait_log("snapshot complete"))
        cpu_total = worker.cpu_seconds()
        cpu, stack = cpu_total - cpu_before, stack_cpu.sample() - stack_before
        peak = worker.peak_rss_mb()
    finally:
        worker.stop()
        delete_topics(run_prefix)
    return WorkerRun(
        (end - begin).total_seconds(), cpu, stack, peak, (end - started).total_seconds(), cpu_total
    )


if __name__ == "__main__":
    main()
