"""(b) Streaming throughput: N mixed changes (inserts, updates, deletes in transactions of 1,000)
drained from a slot by the worker into Kafka (acknowledged), against `pg_recvlogical` with pgoutput
on the same publication, from a slot created at the same point, into /dev/null.

Run: `.venv/bin/python bench/stream_bench.py [--changes 500000] [--format avro|json] [--codec C]
[--profile PATH] [--postgres-version 14|15|16|17|18] [--leaves N]`.
`--leaves N` makes the table hash-partitioned into N leaves (every transaction's rows spread over
all of them), captured as one table (`--partitions root`: pgoutput sends every change as the
root's); pg_recvlogical reads the same publication, so both decode the same partitioned changes.
`--postgres-version` other than 15 runs both sides against the stack's cluster of that major
(`bw-stack pg up N`, started here if it is not running and stopped afterwards), with that major's
own pg_recvlogical: the ratio is always against the same server in the same run.
Both slots exist before the changes are made, so both read the same WAL; each is timed from its
start until it reached the WAL position after the last change (the worker from its "streaming
slot" log line, pg_recvlogical as a whole process, start-up included). Ends with one
`RESULT name=value ...` line.

The worker's CPU while draining is also split by thread (the Python main thread, which reads the
slot, decodes, encodes and produces; librdkafka's threads). `--profile PATH` runs the draining
worker under cProfile, writes its stats to PATH and prints the functions that took the most time:
cProfile slows the Python part several times over, so read its shares, not its times, and take
the rates from a run without it.

Where the machine's cores go: the worker, Postgres and the Kafka broker share them, so the bench
also reads, in the same windows, Postgres' CPU (every backend: the walsender decoding for
pg_recvlogical or for the worker) and the broker's (its JVM) per change (`StackCpu`; the local
stack only). With `w` the worker's CPU per change, `p` Postgres' and `k` the broker's during the
worker's drain, the cores (`cores`, 2 here) can carry at most `cores / (w + p + k)` changes/s,
however the work is scheduled; and the worker CPU per change that 0.9x pg_recvlogical would leave
is `cores / (0.9 * recv_rate) - p - k` (negative: out of reach even with a worker that costs
nothing). The RESULT fields: `recvlogical_cpu_us_per_change` (pg_recvlogical's own CPU),
`recvlogical_postgres_us_per_change`, `postgres_us_per_change` and `broker_us_per_change` (during
the worker's drain), `cores`, `two_core_bound_changes_s`, `two_core_bound_vs_recvlogical` and
`worker_us_left_at_target`. The walsender's CPU per change depends on its client's pace: one that
takes every message as it comes (pg_recvlogical into /dev/null) costs it more than one it has to
wait for, so `p` is read in the worker's own drain, never taken from the baseline's.

Where the worker's main thread spent the drain (schedstat): on a CPU, runnable but waiting for one,
and asleep, waiting for input (`main_thread_asleep_share` of the drain). A worker well below the
bound with a large asleep share waits on Postgres' messages or Kafka's reports, not on the cores.
The main thread handles every change on one core, so its own CPU per change bounds the rate too:
`1 / main thread CPU per change` (`main_thread_bound_vs_recvlogical`, against pg_recvlogical).

The events table has autovacuum off and a CHECKPOINT follows the changes, so neither lands in a
window.
"""

from __future__ import annotations

import argparse
import os
import pstats
import resource
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from psycopg2 import sql
from worker_bench_common import (
    PG_BIN,
    POSTGRES,
    StackCpu,
    Worker,
    core_bound,
    current_lsn,
    delete_topics,
    execute,
    poll_slot,
    report,
    result,
    scratch_database,
    unique,
    us_left_at,
    wait_caught_up,
)

from stack.config import StackConfig
from stack.postgres_versions import Cluster

DEFAULT_CHANGES = 500_000
STACK_MAJOR = 15  # the stack's own Postgres (Debian's)
TRANSACTION_ROWS = 1000
# The target: the worker at >= 0.9x pg_recvlogical's changes/s.
TARGET_VS_RECVLOGICAL = 0.9


def make_changes(dsn: str, changes: int) -> int:
    """About `changes` row changes: half inserts, then updates of a third and deletes of a fifth of
    the inserted rows, each statement its own transaction of TRANSACTION_ROWS rows."""
    inserts = changes // 2
    updates = changes * 3 // 10
    deletes = changes - inserts - updates
    statements: list[object] = []
    for start in range(0, inserts, TRANSACTION_ROWS):
        statements.append(
            (
                "INSERT INTO events SELECT g, g %% 97, 'payload ' || g FROM generate_series(%s, %s) g",
                (start + 1, min(start + TRANSACTION_ROWS, inserts)),
            )
        )
    for start in range(0, updates, TRANSACTION_ROWS):
        statements.append(
            (
                "UPDATE events SET v = v + 1 WHERE id BETWEEN %s AND %s",
                (start + 1, min(start + TRANSACTION_ROWS, updates)),
            )
        )
    for start in range(0, deletes, TRANSACTION_ROWS):
        first = inserts - deletes + start + 1
        statements.append(
            (
                "DELETE FROM events WHERE id BETWEEN %s AND %s",
                (first, min(first + TRANSACTION_ROWS - 1, inserts)),
            )
        )
    execute(dsn, *statements)
    return inserts + updates + deletes


def create_events(dsn: str, leaves: int) -> None:
    """The events table, plain, or (`leaves` > 0) hash-partitioned by id into that many leaves, so
    that every transaction's rows are spread over all of them; the worker captures it as one table
    (`--partitions root`), pg_recvlogical reads the same publication. Autovacuum off: a vacuum of
    the updated and deleted rows would otherwise land in one of the windows as Postgres CPU (a
    partitioned table has no storage of its own: each leaf says it)."""
    if not leaves:
        execute(
            dsn,
            "CREATE TABLE events (id bigint PRIMARY KEY, v int, note text) WITH (autovacuum_enabled = off)",
        )
        return
    execute(dsn, "CREATE TABLE events (id bigint PRIMARY KEY, v int, note text) PARTITION BY HASH (id)")
    for index in range(leaves):
        execute(
            dsn,
            sql.SQL(
                "CREATE TABLE {} PARTITION OF events FOR VALUES WITH (MODULUS {}, REMAINDER {}) "
                "WITH (autovacuum_enabled = off)"
            ).format(sql.Identifier(f"events_{index:02d}"), sql.Literal(leaves), sql.Literal(index)),
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--changes", type=int, default=DEFAULT_CHANGES)
    parser.add_argument("--format", choices=("avro", "json"), default="avro")
    parser.add_argument("--codec", choices=("auto", "native", "python"), default="auto")
    parser.add_argument(
        "--profile", type=Path, default=None, help="cProfile the draining worker into this file"
    )
    parser.add_argument(
        "--postgres-version", type=int, choices=(14, 15, 16, 17, 18), default=STACK_MAJOR,
        help="the server's major: 15 is the stack's own, the others the stack's `bw-stack pg` clusters",
    )  # fmt: skip
    parser.add_argument(
        "--leaves", type=int, default=0,
        help="hash-partition the table into this many leaves, captured as one (the partitioned stream)",
    )  # fmt: skip
    args = parser.parse_args()
    with other_major(args.postgres_version) as (server, recv_command):
        run(args, server, recv_command)


@contextmanager
def other_major(major: int) -> Iterator[tuple[str, list[str]]]:
    """The server's URL and the pg_recvlogical command of `major` (its own binaries and libraries);
    a cluster of the stack's other majors is started if needed and then stopped again."""
    if major == STACK_MAJOR:
        yield POSTGRES, [str(PG_BIN / "pg_recvlogical")]
        return
    cluster = Cluster(StackConfig.from_env(), major)
    started_here = cluster.pid() is None
    cluster.start()
    try:
        yield (
            cluster.url(),
            ["env", f"LD_LIBRARY_PATH={cluster.lib_dir}", str(cluster.bin_dir / "pg_recvlogical")],
        )
    finally:
        if started_here:
            cluster.stop()


def run(args: argparse.Namespace, server: str, recv_command: list[str]) -> None:
    prefix, slot = unique("bench"), unique("stream")
    recv_slot = unique("recv")
    with scratch_database(server=server) as dsn, tempfile.TemporaryDirectory() as log_dir:
        create_events(dsn, args.leaves)
        stack_cpu = StackCpu.locate(dsn)
        # The worker creates its slot and publication (no snapshot), then stops; pg_recvlogical's
        # slot is created right after, before any change: both see the same transactions.
        first = Worker(dsn, slot, prefix, "-x", "-f", args.format, log_dir=Path(log_dir))
        first.wait_log("streaming slot")
        first.stop()
        execute(dsn, ("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (recv_slot,)))
        print(f"making {args.changes:,} changes ...", flush=True)
        made = make_changes(dsn, args.changes)
        end = current_lsn(dsn)
        # The changes' dirty pages written now, not by a checkpoint inside a window.
        execute(dsn, "CHECKPOINT")

        started, recv_before, recv_cpu_before = time.monotonic(), stack_cpu.sample(), _children_cpu()
        subprocess.run(
            [
                *recv_command,
                "-d",
                dsn,
                "-S",
                recv_slot,
                "--start",
                "-E",
                _lsn_text(end),
                "-o",
                "proto_version=1",
                "-o",
                f"publication_names={slot}",
                "-f",
                "/dev/null",
                "--no-loop",
            ],
            check=True,
        )
        recv_s = time.monotonic() - started
        recv_cpu = _children_cpu() - recv_cpu_before
        # Its walsender may still be ending: once it has been reaped its CPU is all in the sample.
        _wait_slot_released(dsn, recv_slot)
        recv_stack = stack_cpu.sample() - recv_before

        worker = Worker(
            dsn,
            slot,
            prefix,
            "-f",
            args.format,
            "-T",
            "partitions=4",
            "--codec",
            args.codec,
            log_dir=Path(log_dir),
            profile=args.profile,
        )
        try:
            worker.wait_log("streaming slot")
            begun, cpu_before, wait_before = time.monotonic(), worker.cpu_seconds(), worker.cpu_wait_seconds()
            threads_before, stack_before = worker.thread_cpu_seconds(), stack_cpu.sample()
            main_before = worker.main_thread_schedstat()
            done = wait_caught_up(dsn, slot, end)
            cpu, stack = worker.cpu_seconds() - cpu_before, stack_cpu.sample() - stack_before
            main_after = worker.main_thread_schedstat()
            main_on_cpu, main_waiting = main_after[0] - main_before[0], main_after[1] - main_before[1]
            threads = {
                name: seconds - threads_before.get(name, 0.0)
                for name, seconds in worker.thread_cpu_seconds().items()
            }
            cpu_wait = worker.cpu_wait_seconds() - wait_before
            peak = worker.peak_rss_mb()
        finally:
            worker.stop()
            delete_topics(prefix)
    worker_s = done - begun
    recv_rate, worker_rate = made / recv_s, made / worker_s
    cpu_us = cpu / made * 1e6
    by_thread = sorted(threads.items(), key=lambda item: -item[1])
    recv_us, recv_postgres_us = recv_cpu / made * 1e6, recv_stack.postgres / made * 1e6
    postgres_us, broker_us = stack.postgres / made * 1e6, stack.broker / made * 1e6
    cores = os.cpu_count() or 1
    bound = core_bound(cores, cpu_us, postgres_us, broker_us)
    recv_bound = core_bound(cores, recv_us, recv_postgres_us)
    target = TARGET_VS_RECVLOGICAL * recv_rate
    left_us = us_left_at(cores, target, postgres_us, broker_us)
    main_asleep = max(0.0, worker_s - main_on_cpu - main_waiting)
    # The main thread reads, decodes, encodes and produces every change on one core, whatever the
    # others do: its CPU per change caps the rate on its own.
    main_us = main_on_cpu / made * 1e6
    main_bound = core_bound(1, main_us)
    spread = f" over {args.leaves} leaves of a partitioned table" if args.leaves else ""
    report(
        f"(b) streaming {made:,} mixed changes{spread}, {args.format}, codec {args.codec}, "
        f"Postgres {args.postgres_version}",
        [
            ("pg_recvlogical > /dev/null", f"{recv_s:8.2f} s  {recv_rate:12,.0f} changes/s  (baseline)"),
            ("  pg_recvlogical CPU", f"{recv_cpu:8.2f} s  ({recv_us:.2f} us per change)"),
            ("  Postgres CPU meanwhile", f"{recv_stack.postgres:8.2f} s  ({recv_postgres_us:.2f} us/change)"),
            ("  broker CPU meanwhile (idle)", f"{recv_stack.broker:8.2f} s  (its housekeeping alone)"),
            (
                f"  {cores}-core bound, pg_recvlogical",
                f"{recv_bound:21,.0f} changes/s  ({cores} / (pg_recvlogical + Postgres))",
            ),
            ("worker into Kafka, acked", f"{worker_s:8.2f} s  {worker_rate:12,.0f} changes/s"),
            ("ratio worker / pg_recvlogical", f"{worker_rate / recv_rate:8.3f}x  (target >= 0.9x)"),
            ("worker CPU while draining", f"{cpu:8.2f} s  ({cpu_us:.2f} us per change; target <= 4)"),
            *(
                (f"  thread {name}", f"{seconds:8.2f} s  ({seconds / made * 1e6:.2f} us per change)")
                for name, seconds in by_thread
                if seconds > 0
            ),
            ("worker threads waiting for a CPU", f"{cpu_wait:8.2f} s  (machine load: others' and ours)"),
            (
                "worker main thread in the drain",
                f"{main_on_cpu:8.2f} s on a CPU, {main_waiting:.2f} s waiting for one, {main_asleep:.2f} s "
                "asleep (for Postgres or Kafka)",
            ),
            (
                "one-core bound, worker main thread",
                f"{main_bound:21,.0f} changes/s  ({main_bound / recv_rate:.3f}x pg_recvlogical; "
                f"1 / {main_us:.2f} us)",
            ),
            ("worker peak RSS", f"{peak:8.0f} MB"),
            ("Postgres CPU while draining", f"{stack.postgres:8.2f} s  ({postgres_us:.2f} us per change)"),
            ("broker CPU while draining", f"{stack.broker:8.2f} s  ({broker_us:.2f} us per change)"),
            (
                f"{cores}-core bound, worker",
                f"{bound:21,.0f} changes/s  ({bound / recv_rate:.3f}x pg_recvlogical; "
                f"{cores} / {cpu_us + postgres_us + broker_us:.2f} us)",
            ),
            (
                f"worker CPU left at {TARGET_VS_RECVLOGICAL}x",
                f"{left_us:8.2f} us per change  ({cores} / {target:,.0f} changes/s - Postgres - broker)",
            ),
        ],
    )
    result(
        "stream_partitions" if args.leaves else "stream", format=args.format, codec=args.codec,
        postgres_version=args.postgres_version, leaves=args.leaves, changes=made,
        recvlogical_changes_s=round(recv_rate),
        worker_changes_s=round(worker_rate), worker_vs_recvlogical=worker_rate / recv_rate,
        cpu_us_per_change=cpu_us, peak_rss_mb=round(peak),
        recvlogical_cpu_us_per_change=recv_us, recvlogical_postgres_us_per_change=recv_postgres_us,
        postgres_us_per_change=postgres_us, broker_us_per_change=broker_us, cores=cores,
        two_core_bound_changes_s=round(bound), two_core_bound_vs_recvlogical=bound / recv_rate,
        worker_us_left_at_target=left_us, main_thread_asleep_share=main_asleep / worker_s,
        main_thread_bound_vs_recvlogical=main_bound / recv_rate,
        **{f"{_field(name)}_us": seconds / made * 1e6 for name, seconds in by_thread if seconds > 0},
    )  # fmt: skip
    if args.profile is not None:
        print(f"\n== cProfile of the draining worker (its own run, slowed by the profiler): {args.profile}")
        pstats.Stats(str(args.profile)).sort_stats("tottime").print_stats(30)


def _field(thread: str) -> str:
    """A thread name as a RESULT field (CPU us per change): `rdk:broker` -> `thread_rdk_broker`."""
    return "thread_" + "".join(c if c.isalnum() else "_" for c in thread)


def _children_cpu() -> float:
    """CPU seconds of this process's ended children so far (pg_recvlogical)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _wait_slot_released(dsn: str, slot: str, timeout: float = 30.0) -> None:
    """Wait until no walsender holds `slot`: the one pg_recvlogical used has ended."""
    poll_slot(
        dsn,
        slot,
        "SELECT active FROM pg_replication_slots WHERE slot_name = %s",
        lambda active: not active,
        timeout=timeout,
        failure=f"slot {slot} still in use {timeout}s after pg_recvlogical exited",
        interval=0.01,
    )


def recvlogical_seconds(dsn: str, slot: str, publication: str, end: int) -> float:
    """How long pg_recvlogical (pgoutput, protocol 1, into /dev/null) takes as a whole process to
    read `slot` up to `end`; returns once its walsender has let the slot go."""
    started = time.monotonic()
    subprocess.run(
        [
            str(PG_BIN / "pg_recvlogical"), "-d", dsn, "-S", slot, "--start", "-E", _lsn_text(end),
            "-o", "proto_version=1", "-o", f"publication_names={publication}", "-f", "/dev/null",
            "--no-loop",
        ],
        check=True,
    )  # fmt: skip
    seconds = time.monotonic() - started
    _wait_slot_released(dsn, slot)
    return seconds


def _lsn_text(lsn: int) -> str:
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


if __name__ == "__main__":
    main()
