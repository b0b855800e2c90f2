"""Verify: every mirror under a warehouse against its Postgres table; prints the rows that differ.

Each row is hashed on both sides (see `rowhash`). A keyed table's rows are joined by key and reported
as missing in Delta, extra in Delta, or different. A table without a key (`--allow-unkeyed`) is
compared as a multiset of rows, duplicates counted (`rules.multiset`), while its mirror is insert-only;
one whose topic carried updates cannot be compared by value and is reported so in one line.

The lake side is its freshest consistent state (`reading.consistent.read_consistent`: the mirrors plus
the changelog's tail, all tables at one source position), what a reader of the lake gets. A source
that is written to runs ahead of it, so the keys that differ are settled, as CDC users check a live
replica: Postgres is read again for those keys only, the WAL position after that read noted (every
transaction the read saw committed before it), and once the lake proves that position they are read
there, so both sides show the same transactions; keys that agree are dropped, and only differences
that persist for `--settle-seconds` are reported. A mirror that holds commits the merge did not write
(by hand, say) is compared as it is, unsettled.

Exit status: 0 when every table is equal; 1 when any table differs or cannot be compared, or when the
warehouse holds no mirror (2: a usage error, as argparse exits).

    spark-submit --py-files bottledwater.zip spark_jobs/verify.py --warehouse /lake --postgres postgres://...
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from shared_connections.spark_session import build_session
from spark_jobs import option_parser, options
from spark_jobs.errors import ConfigurationError
from spark_jobs.job_main import exit_on_error
from spark_jobs.lake import warehouse
from spark_jobs.rules import layout, multiset
from spark_jobs.verifying.compare import (
    DEFAULT_SHOWN_KEYS,
    KINDS,
    MAX_SETTLE_KEYS,
    Compared,
    TableDiff,
    compare,
    verify_keyless,
    verify_table,
)
from spark_jobs.verifying.settle import Say, first_read, format_lsn, lake_frame, settle, source_lsn

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DEFAULT_SETTLE_S = options.DEFAULT_SETTLE_S


def verify_warehouse(
    spark: SparkSession,
    root: str,
    dsn: str,
    tables: Sequence[str] = (),
    shown: int = DEFAULT_SHOWN_KEYS,
    *,
    settle_s: float = 0.0,
    say: Say | None = None,
) -> list[TableDiff]:
    """Every mirror under `root` (or only `tables`, as schema.table safe names), read as the lake's
    freshest consistent state, its differing keys settled for up to `settle_s` seconds (0: none).
    `say` gets the progress lines."""
    tell: Say = say or (lambda _line: None)
    locations = warehouse.list_tables(spark, root)
    if tables:
        locations = [t for t in locations if t.qualified_safe_name in set(tables)]
    names = [t.qualified_safe_name for t in locations]
    read = first_read(spark, root, names, tell) if names else None
    compared: dict[str, Compared] = {}
    for number, location in enumerate(locations, 1):
        path, name = location.path(root), location.qualified_safe_name
        frame, note = lake_frame(spark, path, name, read)
        done = compare(spark, path, dsn, shown, frame, keep_keys=settle_s > 0 and note is None)
        done.diff.note = note
        compared[name] = done
        tell(_progress_line(done, f"{number}/{len(locations)} tables"))
    pending = [
        (name, c)
        for name, c in compared.items()
        if not c.diff.equal and 0 < len(c.keys) + len(c.rows) <= MAX_SETTLE_KEYS
    ]
    for c in compared.values():
        if settle_s > 0 and not c.diff.equal and len(c.keys) + len(c.rows) > MAX_SETTLE_KEYS:
            c.diff.note = f"not settled: more than {MAX_SETTLE_KEYS:,} keys differ (a lake that far behind)"
    if pending:
        settle(spark, root, dsn, dict(pending), shown=shown, settle_s=settle_s, tell=tell)
    return [c.diff for c in compared.values()]


def _progress_line(done: Compared, where: str) -> str:
    diff = done.diff
    if diff.unreconcilable is not None:
        return f"verify: {diff.source}: cannot be compared ({where})"
    differing = sum(diff.counts.values())
    what = "rows" if diff.keyless else "keys"
    state = "equal" if diff.equal else f"{differing:,} {what} differ"
    return (
        f"verify: {diff.source}: {diff.postgres_rows:,} Postgres rows compared with {diff.delta_rows:,} "
        f"in Delta, {state} ({where})"
    )


def report(diff: TableDiff) -> str:
    if diff.unreconcilable is not None:
        return f"{diff.source} ({diff.path}): CANNOT VERIFY: {diff.unreconcilable}"
    head = f"{diff.source} ({diff.path}): Delta {diff.delta_rows} rows, Postgres {diff.postgres_rows} rows"
    if diff.keyless:
        head += " (no key: compared as multisets of rows)"
    if diff.equal:
        return head + ": equal"
    lines = [head + ": DIFFERENT"]
    for kind in KINDS:
        keys: list[str] = getattr(diff, kind)
        if diff.counts[kind]:
            more = diff.counts[kind] - diff.shown_counts.get(kind, len(keys))
            lines.append(
                f"  {kind} ({diff.counts[kind]}): "
                + ", ".join(keys)
                + (f" … and {more} more" if more else "")
            )
    if diff.keyless:
        lines.append(f"  {multiset.UNCAPTURED_HINT}")
    if diff.note is not None:
        lines.append(f"  ({diff.note})")
    return "\n".join(lines)


DESCRIPTION = (
    "Compare every Delta mirror under --warehouse with its Postgres table and print what differs: "
    "the keys of a keyed table; for a table without a key, the rows (compared as multisets, while its "
    "topic is insert-only). The lake is read as its freshest consistent state (the mirrors plus the "
    "changelog's tail, at one source position), and keys that differ are settled: read again on both "
    "sides at one source position once the lake proves it, for up to --settle-seconds, so changes in "
    "flight are not reported. Exit status 0 when every table is equal, 1 when one differs or cannot be "
    "compared, or when the warehouse holds no table."
)


@exit_on_error
def main(argv: Sequence[str] | None = None) -> int:
    args = option_parser.build_parser("verify", DESCRIPTION).parse_args(argv)
    if args.settle_seconds < 0:
        raise ConfigurationError(f"--settle-seconds {args.settle_seconds:g}: expected 0 or more")
    spark = build_session(option_parser.spark_settings(args, "bottledwater-verify"))
    diffs = verify_warehouse(
        spark,
        args.warehouse,
        args.postgres,
        args.table,
        args.show,
        settle_s=args.settle_seconds,
        say=lambda line: print(line, file=sys.stderr, flush=True),
    )
    for diff in diffs:
        print(report(diff))
    if not diffs:
        print(f"no Delta tables under {args.warehouse}", file=sys.stderr)
        return 1
    return 0 if all(d.equal for d in diffs) else 1


__all__ = [
    "KINDS",
    "TableDiff",
    "format_lsn",
    "layout",
    "main",
    "source_lsn",
    "verify_keyless",
    "verify_table",
    "verify_warehouse",
]

if __name__ == "__main__":
    sys.exit(main())
