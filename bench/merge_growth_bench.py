"""Merge growth benchmark: one batch of random updates MERGEd into mirrors of growing size, copy-on-
write against deletion vectors, uniform keys against a hot tail, with and without a key-range
predicate in the MERGE condition. Start-up excluded (one session, timed per MERGE). Prints figures
and ratios, asserts nothing, and ends with one `RESULT bench=merge_growth …` line.

    .venv/bin/python bench/merge_growth_bench.py                            # 1M and 5M rows
    .venv/bin/python bench/merge_growth_bench.py --sizes 1000000,10000000   # 10M: about 10 min to build

Each mirror is built directly (spark.range, sorted by key into files of --rows-per-file, as OPTIMIZE
ZORDER BY the key leaves it) with the merge's own table properties; each batch is --changes updates
of existing keys, newer than every row, MERGEd by `mirror_merge.merge_changes` (the merge's MERGE),
on a fresh copy of the mirror per variant. The merge's default is deletion vectors with the key
range (dv_uniform_range, dv_hot_range); the key range's cost (one aggregate) is in its time.
Target: batch time grows <= 1.3x for 10x rows.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

import worker_bench_common as common
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from shared_connections.spark_session import SparkSettings, build_session
from spark_jobs.lake import delta_tables, mirror_merge
from spark_jobs.lake.mirror_merge import MergeSpec
from spark_jobs.rules import layout

HOT_TAIL = 0.15
BASE_LSN = 1 << 32


def mirror_rows(spark: SparkSession, rows: int, per_file: int) -> DataFrame:
    """A keyed mirror's `rows` snapshot rows, in files of about `per_file` rows, ordered by key."""
    return (
        spark.range(rows)
        .select(
            F.col("id"),
            F.concat(F.lit("name "), F.col("id").cast("string")).alias("name"),
            (F.col("id") % 100000 / 100).cast("decimal(12,2)").alias("amount"),
            F.lit("x" * 40).alias("note"),
            F.lit(BASE_LSN).alias(layout.LSN),
            F.col("id").alias(layout.SEQ),
            F.lit("r").alias(layout.OP),
            F.current_timestamp().alias(layout.COMMIT_TS),
        )
        .repartitionByRange(max(1, rows // per_file), "id")
        .sortWithinPartitions("id")
    )


def _build(spark: SparkSession, path: str, rows: int, per_file: int, dv: bool) -> None:
    frame = mirror_rows(spark, rows, per_file)
    properties = {
        layout.KEY_PROPERTY: layout.encode_key_columns(("id",)),
        delta_tables.DELETION_VECTORS: "true" if dv else "false",
    }
    delta_tables.create_table(spark, path, frame.schema, properties)
    frame.write.format("delta").mode("append").save(path)


def _changes(spark: SparkSession, rows: int, changes: int, hot: bool, seed: int) -> DataFrame:
    low = int(rows * (1 - HOT_TAIL)) if hot else 0
    keys = (
        spark.range(changes)
        .select((F.lit(low) + (F.rand(seed) * (rows - low)).cast("long")).alias("id"))
        .distinct()
    )
    return keys.select(
        "id",
        F.lit("updated").alias("name"),
        F.lit(1).cast("decimal(12,2)").alias("amount"),
        F.lit("y").alias("note"),
        F.lit(BASE_LSN + 1 + seed).alias(layout.LSN),
        F.lit(0).cast("long").alias(layout.SEQ),
        F.lit("u").alias(layout.OP),
        F.current_timestamp().alias(layout.COMMIT_TS),
        F.lit(None).cast("array<string>").alias(layout.UNCHANGED),
    ).cache()


def _merge(spark: SparkSession, path: str, changes: DataFrame, key_range: bool, version: int) -> float:
    started = time.monotonic()
    columns = ("id", "name", "amount", "note")
    spec = MergeSpec(
        path, ("id",), columns, delta_tables.Txn(f"growth-{version}", version), key_range=key_range
    )
    mirror_merge.merge_changes(spark, changes, spec)
    return time.monotonic() - started


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="1000000,5000000", help="mirror sizes (default: 1M,5M)")
    parser.add_argument("--changes", type=int, default=10_000, help="updates per batch (default: 10,000)")
    parser.add_argument("--rows-per-file", type=int, default=125_000, help="(default: 125,000)")
    args = parser.parse_args()
    spark = build_session(SparkSettings(app_name="bottledwater-merge-growth-bench", driver_memory="3g"))
    work = Path(tempfile.mkdtemp(prefix="merge_growth_"))
    variants = [
        ("cow_uniform", False, False, False),
        ("dv_uniform", True, False, False),
        ("dv_uniform_range", True, False, True),  # the merge's default since deletion vectors
        ("cow_hot", False, True, False),
        ("cow_hot_range", False, True, True),
        ("dv_hot", True, True, False),
        ("dv_hot_range", True, True, True),
    ]
    figures: dict[str, object] = {}
    rows_out = []
    try:
        for size in (int(s) for s in args.sizes.split(",")):
            for dv in (False, True):
                base = str(work / f"base_{size}_{dv}")
                started = time.monotonic()
                _build(spark, base, size, args.rows_per_file, dv)
                rows_out.append((f"{size:,} rows, dv={dv}: build", f"{time.monotonic() - started:.1f} s"))
            for version, (name, dv, hot, key_range) in enumerate(variants):
                path = str(work / f"{name}_{size}")
                shutil.copytree(str(work / f"base_{size}_{dv}"), path)
                changes = _changes(spark, size, args.changes, hot, version)
                changes.count()
                seconds = [_merge(spark, path, changes, key_range, 2 * version + i) for i in (1, 2)]
                changes.unpersist()
                shutil.rmtree(path)
                figures[f"{name}_{size}_s"] = min(seconds)
                rows_out.append((f"{size:,} rows, {name}", " ".join(f"{s:.2f} s" for s in seconds)))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    sizes = [int(s) for s in args.sizes.split(",")]
    if len(sizes) > 1:
        for name, *_ in variants:
            small, large = figures[f"{name}_{sizes[0]}_s"], figures[f"{name}_{sizes[-1]}_s"]
            figures[f"{name}_growth"] = float(large) / float(small)  # type: ignore[arg-type]
            rows_out.append(
                (f"{name}: {sizes[-1] // sizes[0]}x rows -> batch time", f"{figures[f'{name}_growth']:.2f}x")
            )
    rows_out.append(("load average (1, 5, 15 min)", " ".join(f"{x:.2f}" for x in os.getloadavg())))
    common.report("merge growth: one batch of updates into growing mirrors (start-up excluded)", rows_out)
    common.result("merge_growth", changes=args.changes, **figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
