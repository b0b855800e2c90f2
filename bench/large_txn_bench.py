"""(g) One large transaction with and without in-progress streaming (Postgres 14+, protocol 2).

One N-row INSERT (default 1,000,000; `--rows 5000000` is the size it was built for) committed
while the worker streams, once with the default (protocol 2, `streaming 'on'`: the worker encodes
the chunks as they arrive into its spool and publishes them at the commit) and once with
`--no-stream-in-progress` (protocol 1: the walsender decodes at the commit, spilling to disk past
`logical_decoding_work_mem`). For each: the
server's `spill_bytes` and `stream_bytes` from `pg_stat_replication_slots`, the time from the
commit returning to the slot acknowledging it, and the worker's peak RSS (VmHWM). Streamed, also
the worker's own account of its spool (its log line at the commit): the seconds it spent encoding
the chunks against the seconds over which they came, and how long handing the commit to the
producer took. After the streamed run, the **keyed pipe** sends the same rows (`COPY | kcat -P -K`,
keyed by id, with the five `bw.*` headers and the worker's producer settings) into a topic of the
same partitions: the rate of a producer with nothing to encode, which a commit of already encoded
messages should approach.

`--delivery exactly-once` runs both modes so: the worker acknowledges a transaction only once the
Kafka transaction holding it committed, so commit -> acknowledged is commit -> visible to a
`read_committed` consumer (the commit markers land on the partitions a moment after), and the
RESULT line also names that ratio `commit_to_visible_ratio`. Today a streamed transaction is still
produced at its commit under exactly-once too (spooled, then inside the stream's Kafka
transaction), so that ratio is what the spool gives, not what producing before the commit would.

Run: `.venv/bin/python bench/large_txn_bench.py [--rows 1000000] [--format avro|json]
[--spool-memory-mb 64] [--only streaming|protocol1] [--statements 1 --pause-s 0]
[--delivery at-least-once|exactly-once]`
(`--statements 10 --pause-s 1`: the transaction runs a while, as a batch job does, and the worker
keeps up with its chunks). No assertions; ends with one `RESULT bench=large_txn ...` line (with
both modes, `commit_to_ack_ratio`: streaming over protocol 1, the baseline of the same run; the
load average last).
"""

from __future__ import annotations

import argparse
import re
import tempfile
import time
from pathlib import Path
from typing import Any

from snapshot_bench import SNAPSHOT_HEADERS, run_pipe
from worker_bench_common import (
    BROKER,
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

from cdc_worker.shell.kafka_settings import producer_settings

DEFAULT_ROWS = 1_000_000
PARTITIONS = 4
# The worker's log line at a streamed transaction's commit (`shell.stream.in_progress`).
SPOOL_LINE = re.compile(
    r"streamed transaction \d+: (\d+) payloads spooled in ([\d.]+) s of encoding while its chunks came "
    r"over ([\d.]+) s; (handed to the producer|produced as they came \(in [\d.]+ s\); committed in Kafka) "
    r"([\d.]+) s"
)


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


def run(mode: str, args: argparse.Namespace) -> dict[str, float]:
    rows, statements, pause_s = args.rows, args.statements, args.pause_s
    prefix, slot = unique("bench"), unique("large")
    extra = [
        "-x",
        "-f",
        args.format,
        "-T",
        f"partitions={PARTITIONS}",
        "--spool-memory-mb",
        str(args.spool_memory_mb),
    ]
    extra += ["--delivery", args.delivery]
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
        try:
            figures = {
                "insert_s": committed - started,
                "commit_to_ack_s": done - committed,
                "peak_rss_mb": peak,
                "spill_mb": spill / 2**20,
                "stream_mb": stream / 2**20,
                "stream_txns": txns,
            }
            if mode == "streaming":
                figures.update(spool_figures(Path(log_dir)))
                figures["keyed_pipe_s"] = keyed_pipe_seconds(dsn, f"{prefix}.pipe")
        finally:
            delete_topics(prefix)
    return figures


def spool_figures(log_dir: Path) -> dict[str, float]:
    """The worker's account of the spool at the commit: seconds encoding vs seconds of chunks, and
    the seconds handing the commit to the producer (zeros when it logged none: not streamed)."""
    found = [m for log in log_dir.glob("*") if log.is_file() for m in SPOOL_LINE.finditer(log.read_text())]
    if not found:
        return {
            "produced_while_running": 0.0,
            "spool_encode_s": 0.0,
            "spool_chunks_s": 0.0,
            "commit_handover_s": 0.0,
        }
    payloads, encode_s, chunks_s, how, handover_s = found[-1].groups()
    payloads, encode_s, chunks_s, handover_s = (float(v) for v in (payloads, encode_s, chunks_s, handover_s))
    return {
        "produced_while_running": float(how != "handed to the producer"),
        "spool_encode_s": encode_s,
        "spool_chunks_s": chunks_s,
        "spool_encode_rows_s": payloads / max(encode_s, 1e-9),
        "spool_arrival_rows_s": payloads / max(chunks_s, 1e-9),
        "commit_handover_s": handover_s,
    }


def keyed_pipe_seconds(dsn: str, topic: str) -> float:
    """`COPY | kcat -P -K` of the table's rows into `topic` (the worker's partitions), keyed by id
    with the five `bw.*` headers and the worker's producer settings, until Kafka acknowledged all."""
    settings = producer_settings(BROKER, {}, "bench-keyed-pipe")
    del settings["bootstrap.servers"]
    kcat = ["kcat", "-P", "-b", BROKER, "-t", topic, "-K", "\t"]
    kcat += [arg for name, value in SNAPSHOT_HEADERS.items() for arg in ("-H", f"{name}={value}")]
    kcat += [arg for name, value in settings.items() for arg in ("-X", f"{name}={value}")]
    return run_pipe(dsn, topic, "COPY (SELECT id, big.* FROM big) TO STDOUT", kcat, None).seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=DEFAULT_ROWS)
    parser.add_argument("--format", choices=("avro", "json"), default="avro")
    parser.add_argument("--spool-memory-mb", type=int, default=64)
    parser.add_argument("--only", choices=("streaming", "protocol1"))
    parser.add_argument("--statements", type=int, default=1, help="INSERTs the transaction is made of")
    parser.add_argument("--pause-s", type=float, default=0.0, help="pause between them, inside it")
    parser.add_argument("--delivery", choices=("at-least-once", "exactly-once"), default="at-least-once")
    args = parser.parse_args()
    modes = [args.only] if args.only else ["streaming", "protocol1"]
    results = {mode: run(mode, args) for mode in modes}
    for mode, r in results.items():
        report(
            f"(g) one {args.rows:,}-row transaction ({args.statements} INSERTs, {args.pause_s} s apart), "
            f"{mode}, {args.format}, {args.delivery}",
            [
                ("BEGIN ... COMMIT", f"{r['insert_s']:8.1f} s"),
                ("commit -> acknowledged", f"{r['commit_to_ack_s']:8.1f} s"),
                *(
                    [
                        (
                            "spool: encoding s / chunks' span s",
                            f"{r['spool_encode_s']:8.1f} / {r['spool_chunks_s']:.1f}",
                        ),
                        ("commit handed to the producer in", f"{r['commit_handover_s']:8.2f} s"),
                        ("keyed pipe, same rows", f"{r['keyed_pipe_s']:8.1f} s"),
                    ]
                    if "keyed_pipe_s" in r
                    else []
                ),
                ("worker peak RSS", f"{r['peak_rss_mb']:8.0f} MB  (target < 300 MB)"),
                ("server spill_bytes", f"{r['spill_mb']:8.1f} MB"),
                ("server stream_bytes", f"{r['stream_mb']:8.1f} MB  ({r['stream_txns']:.0f} txns)"),
            ],
        )
    fields: dict[str, object] = {"rows": args.rows, "format": args.format}
    fields.update(statements=args.statements, pause_s=args.pause_s, delivery=args.delivery)
    for mode, r in results.items():
        fields.update({f"{mode}_{k}": float(v) for k, v in r.items()})
    if len(results) == 2:  # protocol 1 is the baseline, measured in the same run
        baseline = results["protocol1"]["commit_to_ack_s"]
        fields["commit_to_ack_ratio"] = results["streaming"]["commit_to_ack_s"] / max(baseline, 1e-9)
        if args.delivery == "exactly-once":  # acknowledged only once a Kafka commit made it visible
            fields["commit_to_visible_ratio"] = fields["commit_to_ack_ratio"]
    if "streaming" in results:  # the commit's rate against the keyed pipe's, for the same rows
        streamed = results["streaming"]
        fields["streaming_commit_rows_s"] = args.rows / max(streamed["commit_to_ack_s"], 1e-9)
        fields["keyed_pipe_rows_s"] = args.rows / max(streamed["keyed_pipe_s"], 1e-9)
        fields["commit_vs_keyed_pipe"] = fields["streaming_commit_rows_s"] / fields["keyed_pipe_rows_s"]
    result("large_txn", **fields)


if __name__ == "__main__":
    main()
