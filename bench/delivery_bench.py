"""(b2) What exactly-once delivery costs the stream: N mixed changes (the stream benchmark's load:
inserts, updates, deletes in transactions of 1,000) drained from a slot by the worker under
`--delivery exactly-once` and under `--delivery at-least-once`, against `pg_recvlogical` with
pgoutput on the same publication into /dev/null: every slot is created before the changes are made,
so all of them read the same WAL.

Run: `.venv/bin/python bench/delivery_bench.py [--changes 500000] [--format avro|json]
[--repeat 5]`. pg_recvlogical and the two modes drain `--repeat` times each, in rounds (pg_recvlogical,
at-least-once, exactly-once), each from a slot of its own, and their medians compared, so that a
drift of the machine during the run falls on all three. A worker is timed from its "streaming slot"
log line (start-up apart) until its slot acknowledged the WAL position after the last change: under
exactly-once a position is acknowledged only once the Kafka transaction holding it committed, so the
time includes every commit. Also each drain's worker CPU per change, and under exactly-once the
Kafka commits it made (from the log line it writes when it stops).

Ends with one `RESULT bench=delivery ...` line: `eos_vs_alo` (exactly-once's changes/s over
at-least-once's) and `eos_vs_recvlogical`.
"""

from __future__ import annotations

import argparse
import re
import statistics
import tempfile
import time
from pathlib import Path

from stream_bench import create_events, make_changes, recvlogical_seconds
from worker_bench_common import (
    Worker,
    current_lsn,
    delete_topics,
    execute,
    report,
    result,
    scratch_database,
    unique,
    wait_caught_up,
)

DEFAULT_CHANGES = 500_000
MODES = ("at-least-once", "exactly-once")
_COMMITS = re.compile(r"exactly-once: (\d+) Kafka transactions committed, ([0-9.]+) s spent committing")


class Drain:
    """One worker slot of one delivery mode, created before the changes, drained after them."""

    def __init__(self, dsn: str, mode: str, fmt: str, log_dir: Path) -> None:
        self.dsn, self.mode, self.log_dir = dsn, mode, log_dir
        self.slot, self.prefix = unique("deliv"), unique("bench")
        self.args = ("-f", fmt, "-T", "partitions=4", "--delivery", mode)
        creator = Worker(dsn, self.slot, self.prefix, "-x", *self.args, log_dir=log_dir)
        creator.wait_log("streaming slot")
        creator.stop()

    def run(self, end: int, changes: int) -> tuple[float, float, int, float]:
        """Changes/s until the slot acknowledged `end`, worker CPU us per change, Kafka commits, and
        the share of the drain spent committing them."""
        worker = Worker(self.dsn, self.slot, self.prefix, *self.args, log_dir=self.log_dir)
        try:
            worker.wait_log("streaming slot")
            begun, cpu_before = time.monotonic(), worker.cpu_seconds()
            done = wait_caught_up(self.dsn, self.slot, end)
            cpu = worker.cpu_seconds() - cpu_before
        finally:
            worker.stop()
            delete_topics(self.prefix)
        commits = _COMMITS.findall(worker.log())
        made, spent = (int(commits[-1][0]), float(commits[-1][1])) if commits else (0, 0.0)
        return changes / (done - begun), cpu / changes * 1e6, made, spent / (done - begun)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--changes", type=int, default=DEFAULT_CHANGES)
    parser.add_argument("--format", choices=("avro", "json"), default="avro")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    with scratch_database() as dsn, tempfile.TemporaryDirectory() as log_dir:
        create_events(dsn, 0)
        drains = [Drain(dsn, mode, args.format, Path(log_dir)) for _ in range(args.repeat) for mode in MODES]
        recv_slots = [unique("recv") for _ in range(args.repeat)]
        for recv_slot in recv_slots:
            execute(dsn, ("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (recv_slot,)))
        print(f"making {args.changes:,} changes ...", flush=True)
        made = make_changes(dsn, args.changes)
        end = current_lsn(dsn)
        execute(dsn, "CHECKPOINT")

        # Round by round: pg_recvlogical, then each mode, so that a drift of the machine falls on all.
        recv_rates: list[float] = []
        runs: dict[str, list[tuple[float, float, int, float]]] = {mode: [] for mode in MODES}
        for round_, recv_slot in enumerate(recv_slots):
            recv_rates.append(made / recvlogical_seconds(dsn, recv_slot, drains[0].slot, end))
            print(f"  pg_recvlogical: {recv_rates[-1]:,.0f} changes/s", flush=True)
            for drain in drains[round_ * len(MODES) : (round_ + 1) * len(MODES)]:
                runs[drain.mode].append(drain.run(end, made))
                print(f"  {drain.mode}: {runs[drain.mode][-1][0]:,.0f} changes/s", flush=True)

    recv_rate = statistics.median(recv_rates)
    rate = {mode: statistics.median(r[0] for r in runs[mode]) for mode in MODES}
    cpu = {mode: statistics.median(r[1] for r in runs[mode]) for mode in MODES}
    commits = statistics.median(r[2] for r in runs["exactly-once"])
    committing = statistics.median(r[3] for r in runs["exactly-once"])
    alo, eos = rate["at-least-once"], rate["exactly-once"]
    report(
        f"(b2) delivery modes: {made:,} mixed changes, {args.format}, median of {args.repeat} drains each",
        [
            (
                "pg_recvlogical > /dev/null",
                f"{recv_rate:12,.0f} changes/s  (baseline; each: "
                + ", ".join(f"{r:,.0f}" for r in recv_rates)
                + ")",
            ),
            *(
                (
                    f"worker, {mode}",
                    f"{rate[mode]:12,.0f} changes/s  ({rate[mode] / recv_rate:.3f}x pg_recvlogical; "
                    f"{cpu[mode]:.2f} us CPU per change; each: "
                    + ", ".join(f"{r[0]:,.0f}" for r in runs[mode])
                    + ")",
                )
                for mode in MODES
            ),
            ("exactly-once / at-least-once", f"{eos / alo:12.3f}x  (target >= 0.95x)"),
            (
                "Kafka commits, exactly-once",
                f"{commits:12,.0f}  ({made / max(commits, 1):,.0f} changes each; "
                f"{committing:.1%} of the drain spent committing)",
            ),
        ],
    )
    result(
        "delivery", format=args.format, changes=made, repeat=args.repeat,
        recvlogical_changes_s=round(recv_rate), alo_changes_s=round(alo), eos_changes_s=round(eos),
        eos_vs_alo=eos / alo, eos_vs_recvlogical=eos / recv_rate, alo_vs_recvlogical=alo / recv_rate,
        alo_cpu_us_per_change=cpu["at-least-once"], eos_cpu_us_per_change=cpu["exactly-once"],
        eos_kafka_commits=round(commits), eos_commit_share=committing,
    )  # fmt: skip


if __name__ == "__main__":
    main()
