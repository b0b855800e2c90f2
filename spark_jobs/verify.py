"""Verify: every mirror under a warehouse against its Postgres table; prints the keys that differ.

Each row is hashed on both sides (see `rowhash`), joined by key, and reported as missing in Delta,
extra in Delta, or different. Exit status 1 when any table differs. Run it with the source quiet (or
right after a merge of a stopped worker): changes still in flight differ legitimately.

    spark-submit --py-files bottledwater.zip spark_jobs/verify.py --warehouse /lake --postgres postgres://...
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from spark_jobs import option_parser, options
from spark_jobs.connections.session import build_session
from spark_jobs.lake import fingerprints, warehouse
from spark_jobs.rules import layout

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DEFAULT_SHOWN_KEYS = options.DEFAULT_SHOWN_KEYS
DUPLICATE = "duplicate_in_delta"
KINDS = ("missing_in_delta", "extra_in_delta", "different", DUPLICATE)


@dataclass
class TableDiff:
    path: str
    source: str
    delta_rows: int = 0
    postgres_rows: int = 0
    missing_in_delta: list[str] = field(default_factory=list)
    extra_in_delta: list[str] = field(default_factory=list)
    different: list[str] = field(default_factory=list)
    duplicate_in_delta: list[str] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def equal(self) -> bool:
        return not any(self.counts.values())


def verify_table(spark: SparkSession, path: str, dsn: str, shown: int = DEFAULT_SHOWN_KEYS) -> TableDiff:
    from pyspark.sql import functions as F

    spec = fingerprints.comparable(spark, path, dsn)
    if not fingerprints.key_columns_present(spec):
        raise ValueError(f"{path}: key columns {spec.keys} are not all in both Postgres and Delta")
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


def verify_warehouse(
    spark: SparkSession, root: str, dsn: str, tables: Sequence[str] = (), shown: int = DEFAULT_SHOWN_KEYS
) -> list[TableDiff]:
    """Every mirror under `root` (or only `tables`, as schema.table safe names)."""
    locations = warehouse.list_tables(spark, root)
    if tables:
        locations = [t for t in locations if t.qualified_safe_name in set(tables)]
    return [verify_table(spark, t.path(root), dsn, shown) for t in locations]


def report(diff: TableDiff) -> str:
    head = f"{diff.source} ({diff.path}): Delta {diff.delta_rows} rows, Postgres {diff.postgres_rows} rows"
    if diff.equal:
        return head + ": equal"
    lines = [head + ": DIFFERENT"]
    for kind in KINDS:
        keys: list[str] = getattr(diff, kind)
        if diff.counts[kind]:
            more = diff.counts[kind] - len(keys)
            lines.append(
                f"  {kind} ({diff.counts[kind]}): "
                + ", ".join(keys)
                + (f" … and {more} more" if more else "")
            )
    return "\n".join(lines)


DESCRIPTION = (
    "Compare every Delta mirror under --warehouse with its Postgres table; print the keys that differ."
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


__all__ = ["TableDiff", "layout", "main", "verify_table", "verify_warehouse"]

if __name__ == "__main__":
    sys.exit(main())
