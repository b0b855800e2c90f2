"""Verify: every mirror under a warehouse against its Postgres table; prints the rows that differ.

Each row is hashed on both sides (see `rowhash`). A keyed table's rows are joined by key and reported
as missing in Delta, extra in Delta, or different. A table without a key (`--allow-unkeyed`) is
compared as a multiset of rows, duplicates counted (`rules.multiset`), while its mirror is insert-only;
one whose topic carried updates cannot be compared by value and is reported so in one line.

Exit status: 0 when every table is equal; 1 when any table differs or cannot be compared, or when the
warehouse holds no mirror (2: a usage error, as argparse exits). Run it with the source quiet (or
right after a merge of a stopped worker): changes still in flight differ legitimately.

    spark-submit --py-files bottledwater.zip spark_jobs/verify.py --warehouse /lake --postgres postgres://...
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from spark_jobs import option_parser, options
from spark_jobs.connections.session import build_session
from spark_jobs.lake import fingerprints, warehouse
from spark_jobs.rules import layout, multiset

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, Row, SparkSession

DEFAULT_SHOWN_KEYS = options.DEFAULT_SHOWN_KEYS
DUPLICATE = "duplicate_in_delta"
KINDS = ("missing_in_delta", "extra_in_delta", "different", DUPLICATE)


@dataclass
class TableDiff:
    """A keyed table's lists hold keys; a keyless one's (`keyless`) hold rows, `×n` after a row off
    by n occurrences, and its counts count occurrences. `unreconcilable` says why the table could not
    be compared at all (then nothing else is filled in but `delta_rows`)."""

    path: str
    source: str
    delta_rows: int = 0
    postgres_rows: int = 0
    missing_in_delta: list[str] = field(default_factory=list)
    extra_in_delta: list[str] = field(default_factory=list)
    different: list[str] = field(default_factory=list)
    duplicate_in_delta: list[str] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    keyless: bool = False
    unreconcilable: str | None = None
    # Per kind, the occurrences its listed rows stand for (a keyless table's); else one per key.
    shown_counts: dict[str, int] = field(default_factory=dict)

    @property
    def equal(self) -> bool:
        return self.unreconcilable is None and not any(self.counts.values())


def verify_table(spark: SparkSession, path: str, dsn: str, shown: int = DEFAULT_SHOWN_KEYS) -> TableDiff:
    from pyspark.sql import functions as F

    spec = fingerprints.comparable(spark, path, dsn)
    if not spec.keys:
        return verify_keyless(spark, path, dsn, spec, shown)
    if not fingerprints.key_columns_present(spec):
        missing = [k for k in spec.keys if k not in spec.columns]
        return TableDiff(
            path,
            f"{spec.schema}.{spec.table}",
            unreconcilable=f"key column(s) {', '.join(missing)} not in both Postgres and Delta (renamed "
            "or dropped?): the rows cannot be matched by key",
        )
    lake = fingerprints.delta_key_hashes(spark, path, spec).alias("d")
    source = fingerprints.postgres_key_hashes(spark, dsn, spec).alias("p")
    joined = lake.join(source, F.col("d.k") == F.col("p.k"), "full_outer").select(
        F.coalesce(F.col("d.k"), F.col("p.k")).alias("k"),
        F.when(F.col("d.k").isNull(), "missing_in_delta")
        .when(F.col("p.k").isNull(), "extra_in_delta")
        .when(F.col("d.h") != F.col("p.h"), "different")
        .alias("kind"),
    )
    # A key held by several Delta rows (a broken table) is reported once as a duplicate.
    duplicates = lake.groupBy("k").count().where("count > 1").select("k", F.lit(DUPLICATE).alias("kind"))
    differing = joined.where(F.col("kind").isNotNull()).unionByName(duplicates).distinct().cache()
    try:
        counts = {r["kind"]: r["count"] for r in differing.groupBy("kind").count().collect()}
        diff = TableDiff(path, f"{spec.schema}.{spec.table}", lake.count(), source.count())
        diff.counts = {kind: counts.get(kind, 0) for kind in KINDS}
        for row in differing.orderBy("kind", "k").limit(shown * len(KINDS)).collect():
            bucket: list[str] = getattr(diff, row["kind"])
            if len(bucket) < shown:
                bucket.append(row["k"])
        return diff
    finally:
        differing.unpersist()


def verify_keyless(
    spark: SparkSession, path: str, dsn: str, spec: fingerprints.Comparable, shown: int = DEFAULT_SHOWN_KEYS
) -> TableDiff:
    """A table without a key: its rows as multisets on both sides, or the reason it cannot be."""
    from pyspark.sql import functions as F

    source = f"{spec.schema}.{spec.table}"
    # The mirror's own ops are the only record of what its topic carried (the worker publishes no
    # delete of an unkeyed table, and an update arrives as a row like an insert): reading the one
    # column is cheap, and settles whether a comparison by value means anything.
    ops = spark.read.format("delta").load(path).groupBy(F.coalesce(F.col(layout.OP), F.lit("?"))).count()
    op_counts = {str(r[0]): int(r[1]) for r in ops.collect()}
    reason = multiset.unreconcilable_reason(op_counts)
    if reason is not None:
        return TableDiff(path, source, sum(op_counts.values()), keyless=True, unreconcilable=reason)
    # The whole row is its identity: the per-key hashing with every column as the key gives each
    # row's hash (to match on) and its text (to show).
    whole_rows = dataclasses.replace(spec, keys=tuple(spec.columns))
    lake = _per_row(fingerprints.delta_key_hashes(spark, path, whole_rows)).alias("d")
    pg = _per_row(fingerprints.postgres_key_hashes(spark, dsn, whole_rows)).alias("p")
    in_delta, in_postgres = F.coalesce(F.col("d.n"), F.lit(0)), F.coalesce(F.col("p.n"), F.lit(0))
    rows = (
        lake.join(pg, F.col("d.h") == F.col("p.h"), "full_outer")
        .select(
            # Shown as the side that holds more of it reads it.
            F.when(in_delta >= in_postgres, F.col("d.t")).otherwise(F.col("p.t")).alias("t"),
            in_delta.alias("d"),
            in_postgres.alias("p"),
        )
        .cache()
    )
    try:
        totals = rows.agg(F.sum("d"), F.sum("p")).first() or (0, 0)
        differing = rows.where(F.col("d") != F.col("p")).orderBy("t").toLocalIterator()
        found = multiset.compare(_row_counts(differing), shown)
    finally:
        rows.unpersist()
    diff = TableDiff(path, source, int(totals[0] or 0), int(totals[1] or 0), keyless=True)
    diff.missing_in_delta, diff.extra_in_delta = found.missing_rows, found.extra_rows
    diff.counts = {kind: 0 for kind in KINDS}
    diff.counts.update(missing_in_delta=found.missing_in_delta, extra_in_delta=found.extra_in_delta)
    diff.shown_counts = {"missing_in_delta": found.missing_shown, "extra_in_delta": found.extra_shown}
    return diff


def _per_row(hashes: DataFrame) -> DataFrame:
    """(h, n: how often the row occurs, t: its text) from (k: the row's text, h: its hash)."""
    from pyspark.sql import functions as F

    return hashes.groupBy("h").agg(F.count(F.lit(1)).alias("n"), F.min("k").alias("t"))


def _row_counts(rows: Iterator[Row]) -> Iterator[multiset.RowCount]:
    for row in rows:
        yield multiset.RowCount(row["t"], row["d"], row["p"])


def verify_warehouse(
    spark: SparkSession, root: str, dsn: str, tables: Sequence[str] = (), shown: int = DEFAULT_SHOWN_KEYS
) -> list[TableDiff]:
    """Every mirror under `root` (or only `tables`, as schema.table safe names)."""
    locations = warehouse.list_tables(spark, root)
    if tables:
        locations = [t for t in locations if t.qualified_safe_name in set(tables)]
    return [verify_table(spark, t.path(root), dsn, shown) for t in locations]


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
    return "\n".join(lines)


DESCRIPTION = (
    "Compare every Delta mirror under --warehouse with its Postgres table and print what differs: "
    "the keys of a keyed table; for a table without a key, the rows (compared as multisets, while "
    "its topic is insert-only). Exit status 0 when every table is equal, 1 when one differs or "
    "cannot be compared, or when the warehouse holds no table. Run it with the source quiet: changes "
    "in flight differ."
)


def main(argv: Sequence[str] | None = None) -> int:
    args = option_parser.build_parser("verify", DESCRIPTION).parse_args(argv)
    spark = build_session(option_parser.spark_settings(args, "bottledwater-verify"))
    diffs = verify_warehouse(spark, args.warehouse, args.postgres, args.table, args.show)
    for diff in diffs:
        print(report(diff))
    if not diffs:
        print(f"no Delta tables under {args.warehouse}", file=sys.stderr)
        return 1
    return 0 if all(d.equal for d in diffs) else 1


__all__ = ["TableDiff", "layout", "main", "verify_keyless", "verify_table", "verify_warehouse"]

if __name__ == "__main__":
    sys.exit(main())
