"""The demo's freshness: how long after its commit a change is readable consistently.

Starts the demo as `make demo` does (the sample database, the snapshot through Dagster, the
supervised worker and, by the demo's defaults, the continuous merge behind the lake's changelog),
waits until the changelog serves a position and a warm-up passes (the first batches create the
mirrors: start-up, reported apart), then commits one change at a time to the sample
database (an UPDATE of a customer, while the demo's writer keeps writing) and times how long until
the changelog's proven position passes it (`lake_freshness.observe_changelog`, read from the Delta
log's files: the position a consistent read through the changelog serves, docs/lakehouse.md).
The change's position is `pg_current_wal_lsn()` read right after its COMMIT returned, at or past its
commit record, so a figure is never shorter than the truth. Probes start at random moments (0-3 s
apart) so that they sample every phase of the merge's trigger.

Baseline: the continuous merge's trigger interval (10 s). Target: p99 ≤ 20 s. Ends with one
`RESULT bench=demo_freshness lag_p50_s=… lag_p99_s=… lag_max_s=… trigger_s=… target_s=20 probes=…
ready_s=… load1=…` line (`worker_bench_common.result`). The demo's processes are stopped at the end
when this run started them (the stack stays up).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import psycopg2
import worker_bench_common as common

from orchestration import lake_freshness
from spark_jobs.options import DEFAULT_TRIGGER_INTERVAL_S
from spark_jobs.rules import layout
from stack import demo, process
from stack.config import StackConfig

POLL_S = 0.1
CHANGE = "UPDATE public.customers SET name = name WHERE id = (SELECT min(id) FROM public.customers)"
READY_TIMEOUT_S = 600.0
PROBE_TIMEOUT_S = 300.0


def _wait_ready(changelog: str) -> float:
    """Seconds until the changelog serves a position (the supervisor's tick, the run's launch, the
    JVM's start and the snapshot's first batch)."""
    started = time.monotonic()
    while time.monotonic() - started < READY_TIMEOUT_S:
        if lake_freshness.observe_changelog(changelog) is not None:
            return time.monotonic() - started
        time.sleep(1.0)
    raise SystemExit(f"the demo's changelog served no position in {READY_TIMEOUT_S:.0f} s: see .stack/logs")


def _probe(dsn: str, changelog: str) -> float:
    """One change committed, then seconds until the changelog's position passes it."""
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute(CHANGE)
            committed = time.monotonic()
            cur.execute("SELECT pg_current_wal_lsn()::text")
            row = cur.fetchone()
            assert row is not None
            lsn = common.lsn_of(str(row[0]))
    finally:
        conn.close()
    while time.monotonic() - committed < PROBE_TIMEOUT_S:
        seen = lake_freshness.observe_changelog(changelog)
        if seen is not None and seen.position >= lsn:
            return time.monotonic() - committed
        time.sleep(POLL_S)
    raise SystemExit(f"the change at {lsn} was not in the changelog after {PROBE_TIMEOUT_S:.0f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--probes", type=int, default=40, help="changes timed (default: 40)")
    parser.add_argument("--seed", type=int, default=7, help="of the probes' random spacing")
    parser.add_argument(
        "--warmup-seconds",
        type=float,
        default=60.0,
        help="after the first position, before the first probe: the first batches create the mirrors "
        "(default: 60)",
    )
    args = parser.parse_args()

    cfg = StackConfig.from_env()
    running = process.read_pid(cfg.pid_file("dagster-daemon"), "dagster-daemon") is not None
    dsn = demo.create_sample_database(cfg)
    demo.start_pipeline(cfg)
    env = demo.pipeline_env(cfg)
    changelog = layout.changelog_path(env["BW_WAREHOUSE"])
    try:
        ready_s = _wait_ready(changelog)
        time.sleep(args.warmup_seconds)
        spacing = random.Random(args.seed)
        lags = []
        for n in range(args.probes):
            time.sleep(spacing.uniform(0.0, 3.0))
            lags.append(_probe(dsn, changelog))
            print(f"probe {n + 1}/{args.probes}: readable after {lags[-1]:.1f} s", flush=True)
    finally:
        if not running:
            demo.stop_pipeline(cfg)
    ordered = sorted(lags)
    p50 = statistics.median(ordered)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    interval = DEFAULT_TRIGGER_INTERVAL_S
    common.report(
        "the demo: a change readable consistently (through the changelog) after its commit",
        [
            ("merge", demo.merge_in_effect(env)),
            ("ready (the changelog's first position), start-up apart", f"{ready_s:8.1f} s"),
            ("warm-up left out", f"{args.warmup_seconds:8.1f} s"),
            ("commit -> readable p50 / p99 / max", f"{p50:.1f} / {p99:.1f} / {ordered[-1]:.1f} s"),
            ("p99 in trigger intervals", f"{p99 / interval:.2f} (target p99 <= 20 s)"),
            ("probes", str(len(ordered))),
        ],
    )
    common.result(
        "demo_freshness",
        lag_p50_s=p50,
        lag_p99_s=p99,
        lag_max_s=ordered[-1],
        trigger_s=interval,
        target_s=20,
        probes=len(ordered),
        ready_s=ready_s,
    )


if __name__ == "__main__":
    main()
