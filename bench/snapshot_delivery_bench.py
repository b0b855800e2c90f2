"""(a3) What exactly-once delivery costs the snapshot: the same rows published by the worker's
snapshot under `--delivery exactly-once` (each table read whole by one reader and published in one
Kafka transaction by that reader's transactional producer, the native one for the tables the native
codec encodes) and under `--delivery at-least-once` (tables cut into page ranges, shared by the
readers, the native producer where it can be built), in two shapes of the same total: `--tables`
tables (8 by default) and one table.

Run: `.venv/bin/python bench/snapshot_delivery_bench.py [--rows 1000000] [--tables 8]
[--format avro|json] [--repeat 5]`. Each shape is snapshotted `--repeat` times per mode, alternately
(at-least-once first), each into fresh topics with a slot of its own, and the medians compared, so
that a drift of the machine falls on both. A worker is timed between its own log lines "snapshot of
..." and "snapshot complete" (start-up apart; under exactly-once the time includes every table's
commit).

Ends with one `RESULT bench=snapshot_delivery ...` line: `eos_vs_alo_tables` and
`eos_vs_alo_one_table` (exactly-once's rows/s over at-least-once's), and each mode's rows/s.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from psycopg2 import sql
from worker_bench_common import execute, report, result, scratch_database, snapshot_window_seconds, unique

DEFAULT_ROWS = 1_000_000
DEFAULT_TABLES = 8
MODES = ("at-least-once", "exactly-once")
TABLE_DDL = """
CREATE TABLE {} (
    id bigint PRIMARY KEY, customer_id int NOT NULL, status text NOT NULL, amount numeric(12, 2),
    created_at timestamptz NOT NULL, shipped boolean, note text
)"""
FILL = """
INSERT INTO {}
SELECT g, g % 10007, (ARRAY['new', 'paid', 'shipped'])[1 + g % 3], (g % 100000) / 100.0,
       timestamptz '2024-01-01 00:00:00+00' + g * interval '1 second', g % 2 = 0,
       CASE WHEN g % 5 = 0 THEN NULL ELSE 'note ' || g END
  FROM generate_series(1, {}) g"""


def fill(dsn: str, schema: str, tables: int, rows: int) -> None:
    """`tables` tables of `rows // tables` rows each in `schema`, vacuumed, and a checkpoint."""
    statements: list[object] = [sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema))]
    for index in range(tables):
        name = sql.Identifier(schema, f"orders_{index}")
        statements += [
            sql.SQL(TABLE_DDL).format(name),
            sql.SQL(FILL).format(name, sql.Literal(rows // tables)),
        ]
    execute(dsn, *statements, "VACUUM ANALYZE", "CHECKPOINT")


def snapshot_seconds(dsn: str, schema: str, mode: str, fmt: str, log_dir: Path) -> float:
    """One worker's snapshot of `schema`'s tables into fresh topics, in `mode`."""
    prefix = unique("bench")
    args = ("-f", fmt, "-T", "partitions=4", "--delivery", mode, "--tables", f"{schema}.*")
    return snapshot_window_seconds(dsn, unique("snapdel"), prefix, *args, log_dir=log_dir)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=DEFAULT_ROWS)
    parser.add_argument("--tables", type=int, default=DEFAULT_TABLES)
    parser.add_argument("--format", choices=("avro", "json"), default="avro")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    shapes = {"tables": args.tables, "one_table": 1}
    seconds: dict[tuple[str, str], list[float]] = {}
    with scratch_database() as dsn, tempfile.TemporaryDirectory() as log_dir:
        for shape, tables in shapes.items():
            print(f"filling {args.rows:,} rows in {tables} table(s) ...", flush=True)
            fill(dsn, shape, tables, args.rows)
            for _ in range(args.repeat):
                for mode in MODES:
                    took = snapshot_seconds(dsn, shape, mode, args.format, Path(log_dir))
                    seconds.setdefault((shape, mode), []).append(took)
                    print(f"  {shape}, {mode}: {took:.2f} s", flush=True)
    rows = args.rows
    lines: list[tuple[str, str]] = []
    figures: dict[str, object] = {}
    for shape, tables in shapes.items():
        rates = {mode: rows / statistics.median(seconds[shape, mode]) for mode in MODES}
        ratio = rates["exactly-once"] / rates["at-least-once"]
        for mode in MODES:
            runs = ", ".join(f"{s:.2f}" for s in seconds[shape, mode])
            lines.append((f"{tables} table(s), {mode}", f"{rates[mode]:12,.0f} rows/s  (runs: {runs} s)"))
            figures[f"{shape}_{mode.replace('-', '_')}_rows_s"] = round(rates[mode])
        lines.append((f"  ratio exactly-once / at-least-once, {tables} table(s)", f"{ratio:8.3f}x"))
        figures[f"eos_vs_alo_{shape}"] = ratio
    report(f"(a3) snapshot of {rows:,} rows, {args.format}: exactly-once against at-least-once", lines)
    result("snapshot_delivery", format=args.format, rows=rows, tables=args.tables, **figures)


if __name__ == "__main__":
    main()
