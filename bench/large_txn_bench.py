"""(g) One large transaction with and without in-progress streaming (Postgres 14+, protocol 2).

One N-row INSERT (default 1,000,000; `--rows 5000000` is the size it was built for) committed
while the worker streams, once with the default (protocol 2, `streaming 'on'`: the worker encodes
the chunks as they arrive into its spool and publishes them at the commit) and once with
`--no-stream-in-progress` (protocol 1: the walsender decodes at the commit, spilling to disk past
`logical_decoding_work_mem`). For each: the
server's `spill_bytes` and `stream_bytes` from `pg_stat_replication_slots`, the time from the
commit returning to the slot acknowledging it, and the worker's peak RSS (VmHWM).

Run: `.venv/bin/python bench/large_txn_bench.py [--rows 1000000] [--format avro|json]
[--spool-memory-mb 64] [--only streaming|protocol1] [--statements 1 --pause-s 0]`
(`--statements 10 --pause-s 1`: the transaction runs a while, as a batch job does, and the worker
keeps up with its chunks). No assertions; ends with one `RESULT bench=large_txn ...` line (with
both modes, `commit_to_ack_ratio`: streaming over protocol 1, the baseline of the same run; the
load average last).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

from worker_bench_common import (
    Worker,
    delete_topics,
    execute,
    report,
    result,
    scalar,
    scratch_database,
    unique,
    wait_caught_up,
)

DEFAULT_ROWS = 1_000_000


def slot_stats(dsn: str, slot: str) -> tuple[int, int, int]:
    """spill_bytes, stream_bytes, stream_txns of the slot."""
    row = scalar(
        dsn,
        "SELECT spill_bytes || ',' || stream_bytes || ',' || stream_txns "
        "FROM pg_stat_replication_slots WHERE slot_name = %s",
        (slot,),
    )
    spill, stream, txns = (int(v) for v in (row or "0,0,0").split(","))
    return spill, stream, txns


def transaction(rows: int, statements: int, pause_s: float) -> list[Any]:
    """One transaction of `statements` INSERTs (`pause_s` apart: a batch job that runs a while)."""
    step = -(-rows // statements)
    body: list[Any] = []
    for first in range(1, rows + 1, step):
        if body and pause_s > 0:
            body.append(("SELECT pg_sleep(%s)", (pause_s,)))
        body.append(
            (
                "INSERT INTO big SELECT g, 'row ' || g, g / 100.0 FROM generate_series(%s, %s) g",
                (first, min(first + step - 1, rows)),
            )
        )
    return ["BEGIN", *body, "COMMIT"]


def run(  # noqa: PLR0917 - the command line's figures, once per mode
    mode: str, rows: int, fmt: str, spool_memory_mb: int, statements: int, pause_s: float
) -> dict[str, float]:
    prefix, slot = unique("bench"), unique("large")
    extra = ["-x", "-f", fmt, "-T", "partitions=4", "--spool-memory-mb", str(spool_memory_mb)]
    if mode == "protocol1":
        extra.append("--no-stream-in-progress")
    with (
        scratch_database() as dsn,
        tempfile.TemporaryDirectory() as log_dir,
        tempfile.TemporaryDirectory() as spool_dir,
    ):
        execute(dsn, "CREATE TABLE big (id bigint PRIMARY KEY, note text, amount numeric(12, 2))")
        worker = Worker(dsn, slot, prefix, *extra, "--spool-dir", spool_dir, log_dir=Path(log_dir))
        try:
            worker.wait_log("streaming slot")
            time.sleep(1)
            started = time.monotonic()
            execute(dsn, *transaction(rows, statements, pause_s))
            committed = time.monotonic()
            done = wait_caught_up(dsn, slot)
            peak = worker.peak_rss_mb()
            time.sleep(1)  # the walsender reports its decoding statistics as it goes
            spill, stream, txns = slot_stats(dsn, slot)
        finally:
            worker.stop()
            delete_topics(prefix)
    return {
        "insert_s": committed - started,
        "commit_to_ack_s": done - committed,
        "peak_rss_mb": peak,
        "spill_mb": spill / 2**20,
        "stream_mb": stream / 2**20,
        "stream_txns": txns,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=DEFAULT_ROWS)
    parser.add_argument("--format", choices=("avro", "json"), default="avro")
    parser.add_argument("--spool-memory-mb", type=int, default=64)
    parser.add_argument("--only", choices=("streaming", "protocol1"))
    parser.add_argument("--statements", type=int, default=1, help="INSERTs the transaction is made of")
    parser.add_argument("--pause-s", type=float, default=0.0, help="pause between them, inside it")
    args = parser.parse_args()
    modes = [args.only] if args.only else ["streaming", "protocol1"]
    results = {
        mode: run(mode, args.rows, args.format, args.spool_memory_mb, args.statements, args.pause_s)
        for mode in modes
    }
    for mode, r in results.items():
        report(
            f"(g) one {args.rows:,}-row transaction ({args.statements} INSERTs, {args.pause_s} s apart), "
            f"{mode}, {args.format}",
            [
                ("BEGIN ... COMMIT", f"{r['insert_s']:8.1f} s"),
                ("commit -> acknowledged", f"{r['commit_to_ack_s']:8.1f} s"),
                ("worker peak RSS", f"{r['peak_rss_mb']:8.0f} MB  (target < 300 MB)"),
                ("server spill_bytes", f"{r['spill_mb']:8.1f} MB"),
                ("server stream_bytes", f"{r['stream_mb']:8.1f} MB  ({r['stream_txns']:.0f} txns)"),
            ],
        )
    fields: dict[str, object] = {"rows": args.rows, "format": args.format}
    fields.update(statements=args.statements, pause_s=args.pause_s)
    for mode, r in results.items():
        fields.update({f"{mode}_{k}": float(v) for k, v in r.items()})
    if len(results) == 2:  # protocol 1 is the baseline, measured in the same run
        baseline = results["protocol1"]["commit_to_ack_s"]
        fields["commit_to_ack_ratio"] = results["streaming"]["commit_to_ack_s"] / max(baseline, 1e-9)
    result("large_txn", **fields)


if __name__ == "__main__":
    main()
