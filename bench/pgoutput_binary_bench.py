"""pgoutput `binary 'true'` against text: the server's cost to decode and send one N-row insert
transaction, and its bytes, both read from the same slot (peeked, so each mode reads the same WAL).

The cost is the Postgres backend's own CPU time (from /proc, so Postgres must run on this machine)
around `pg_logical_slot_peek_binary_changes`, summed server-side so that no bytes travel; the
baseline is text mode in the same run, on the same slot. Two tables: the snapshot bench's 7-column
`orders`, and a `wide` one of the types whose text output costs most (timestamptz, numeric, float8,
uuid, jsonb, arrays).

Ends with one `RESULT bench=pgoutput_binary name=value ... load1=...` line (`worker_bench_common.result`).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import psycopg2
from worker_bench_common import report, result, scratch_database, stat_cpu_seconds

TABLES = {
    "orders": (
        """CREATE TABLE t (id bigint PRIMARY KEY, customer_id int NOT NULL, status text NOT NULL,
           amount numeric(12, 2), created_at timestamptz NOT NULL, shipped boolean, note text)""",
        """INSERT INTO t SELECT g, g %% 10007, (ARRAY['new', 'paid', 'shipped'])[1 + g %% 3],
           (g %% 100000) / 100.0, timestamptz '2024-01-01 00:00:00+00' + g * interval '1 second',
           g %% 2 = 0, CASE WHEN g %% 5 = 0 THEN NULL ELSE 'note ' || g END
           FROM generate_series(1, %s) g""",
    ),
    "wide": (
        """CREATE TABLE t (id bigint PRIMARY KEY, t1 timestamptz, t2 timestamptz, d date,
           n numeric(18, 6), f float8, u uuid, j jsonb, a int[])""",
        """INSERT INTO t SELECT g, now() + g * interval '1 second', now() - g * interval '1 ms',
           date '2024-01-01' + g %% 1000, g * 1.000001, g / 7.0, md5(g::text)::uuid,
           jsonb_build_object('k', g, 's', 'v' || g), ARRAY[g, g + 1, g + 2]
           FROM generate_series(1, %s) g""",
    ),
}
PEEK = """SELECT count(*), sum(octet_length(data)) FROM pg_logical_slot_peek_binary_changes(
    'bw_binary_bench', NULL, NULL, 'proto_version', '1', 'publication_names', 'bw_binary_bench',
    'binary', %s)"""


def measure(dsn: str, table: str, rows: int, repeats: int) -> dict[str, tuple[float, int]]:
    """Per mode: (median backend CPU seconds, bytes)."""
    create, fill = TABLES[table]
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute(create)
            cur.execute("CREATE PUBLICATION bw_binary_bench FOR TABLE t")
            cur.execute("SELECT pg_create_logical_replication_slot('bw_binary_bench', 'pgoutput')")
            cur.execute(fill, (rows,))
            cur.execute("SELECT pg_backend_pid()")
            (pid,) = cur.fetchone() or (0,)
            cpu: dict[str, list[float]] = {"false": [], "true": []}
            size: dict[str, int] = {}
            for _ in range(repeats):
                for binary, seconds in cpu.items():
                    before = backend_cpu(pid)
                    cur.execute(PEEK, (binary,))
                    _count, size[binary] = cur.fetchone() or (0, 0)
                    seconds.append(backend_cpu(pid) - before)
            cur.execute("SELECT pg_drop_replication_slot('bw_binary_bench')")
    finally:
        conn.close()
    return {binary: (statistics.median(cpu[binary]), size[binary]) for binary in cpu}


def backend_cpu(pid: int) -> float:
    return stat_cpu_seconds(Path(f"/proc/{pid}/stat"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    lines: list[tuple[str, str]] = []
    figures: dict[str, object] = {"rows": args.rows}
    for table in TABLES:
        with scratch_database() as dsn:
            started = time.monotonic()
            modes = measure(dsn, table, args.rows, args.repeats)
        (text_cpu, text_bytes), (binary_cpu, binary_bytes) = modes["false"], modes["true"]
        if min(text_cpu, binary_cpu) <= 0:
            # The kernel counts a process's CPU in clock ticks (10 ms): too few rows read as none.
            raise SystemExit(
                f"--rows {args.rows}: the server's CPU for {table} was under one clock tick; "
                "measure with more rows (50,000 or more)"
            )
        text_us, binary_us = text_cpu / args.rows * 1e6, binary_cpu / args.rows * 1e6
        lines += [
            (
                f"{table}: text (baseline)",
                f"{text_us:6.2f} us CPU/row  {text_bytes / args.rows:7.1f} bytes/row",
            ),
            (f"{table}: binary", f"{binary_us:6.2f} us CPU/row  {binary_bytes / args.rows:7.1f} bytes/row"),
            (
                f"{table}: binary / text",
                f"{binary_us / text_us:6.3f}x CPU  {binary_bytes / text_bytes:7.3f}x bytes",
            ),
            (f"{table}: run took", f"{time.monotonic() - started:6.1f} s"),
        ]
        figures |= {
            f"{table}_text_us_per_row": text_us, f"{table}_binary_us_per_row": binary_us,
            f"{table}_cpu_ratio": binary_us / text_us, f"{table}_bytes_ratio": binary_bytes / text_bytes,
        }  # fmt: skip
    report(f"pgoutput binary vs text, one {args.rows:,}-row insert transaction, server side", lines)
    result("pgoutput_binary", **figures)


if __name__ == "__main__":
    main()
