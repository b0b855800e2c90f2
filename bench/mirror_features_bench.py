"""Mirror features benchmark: one batch of mixed changes MERGEd into a default mirror (column mapping,
deletion vectors) and into a portable one (`--mirror-features portable`: neither, so the MERGE copies
the rows of every file it touches). Start-up and the build excluded (one session, timed per MERGE).
Prints figures and the portable/default ratio, asserts nothing, and ends with one
`RESULT bench=mirror_features …` line.

    .venv/bin/python bench/mirror_features_bench.py                                # 1M rows, 200k changes
    .venv/bin/python bench/mirror_features_bench.py --rows 5000000 --changes 1000000   # the issue's size

Each mirror is built directly (spark.range, sorted by key into files of --rows-per-file, as OPTIMIZE
ZORDER BY the key leaves it) by `delta_tables.create_table` with the features under test; each batch
is --changes changes of uniformly spread keys (60 % updates, 20 % deletes, 20 % inserts of new keys),
newer than every row, MERGEd by `mirror_merge.merge_changes` (the merge's MERGE, with the key range)
under `deletion_vector_writes`, as the merge runs it, on a fresh copy of the mirror per run; the
runs alternate between the two settings (--runs each), and the medians are compared.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from merge_growth_bench import mirror_rows
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from shared_connections.spark_session import SparkSettings, build_session
from spark_jobs.lake import delta_tables, mirror_merge
from spark_jobs.lake.mirror_merge import MergeSpec
from spark_jobs.rules import layout
from spark_jobs.rules.mirror_features import CHOICES, MirrorFeatures

BASE_LSN = 1 << 32
DATA_COLUMNS = ["id", "name", "amount", "note"]


def _build(spark: SparkSession, path: str, rows: int, per_file: int, features: MirrorFeatures) -> None:
    frame = mirror_rows(spark, rows, per_file)
    properties = {layout.KEY_PROPERTY: layout.encode_key_columns(("id",))}
    delta_tables.create_table(spark, path, frame.schema, properties, features)
    frame.write.format("delta").mode("append").save(path)


def _changes(spark: SparkSession, rows: int, changes: int) -> DataFrame:
    """Uniformly spread keys: 60 % updates, 20 % deletes of existing keys, 20 % inserts past them."""
    existing = (
        spark.range(changes * 4 // 5)
        .select((F.rand(7) * rows).cast("long").alias("id"))
        .distinct()
        .withColumn("__u", F.rand(11))
        .select("id", F.when(F.col("__u") < 0.75, F.lit("u")).otherwise(F.lit("d")).alias(layout.OP))
    )
    inserts = spark.range(rows, rows + changes // 5).select("id", F.lit("c").alias(layout.OP))
    return (
        existing.unionByName(inserts)
        .select(
            "id",
            F.lit("changed").alias("name"),
            F.lit(1).cast("decimal(12,2)").alias("amount"),
            F.lit("y").alias("note"),
            F.lit(BASE_LSN + 1).alias(layout.LSN),
            F.lit(0).cast("long").alias(layout.SEQ),
            layout.OP,
            F.current_timestamp().alias(layout.COMMIT_TS),
            F.lit(None).cast("array<string>").alias(layout.UNCHANGED),
        )
        .cache()
    )


def _merge(spark: SparkSession, path: str, changes: DataFrame, version: int) -> float:
    started = time.monotonic()
    with delta_tables.deletion_vector_writes(spark, path):
        txn = delta_tables.Txn(f"mirror-features-{version}", version)
        mirror_merge.merge_changes(spark, changes, MergeSpec(path, ("id",), tuple(DATA_COLUMNS), txn))
    return time.monotonic() - started


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=1_000_000, help="mirror rows (default: 1,000,000)")
    parser.add_argument("--changes", type=int, default=200_000, help="changes per batch (default: 200,000)")
    parser.add_argument("--rows-per-file", type=int, default=125_000, help="(default: 125,000)")
    parser.add_argument("--runs", type=int, default=2, help="MERGEs per setting, alternated (default: 2)")
    parser.add_argument(
        "--mirror-features",
        choices=(*CHOICES, "both"),
        default="both",
        help="the setting(s) to measure (default: both, for the ratio)",
    )
    args = parser.parse_args()
    chosen: list[MirrorFeatures] = list(CHOICES) if args.mirror_features == "both" else [args.mirror_features]
    spark = build_session(SparkSettings(app_name="bottledwater-mirror-features-bench", driver_memory="3g"))
    work = Path(tempfile.mkdtemp(prefix="mirror_features_"))
    seconds: dict[str, list[float]] = {f: [] for f in chosen}
    try:
        for features in chosen:
            started = time.monotonic()
            _build(spark, str(work / f"base_{features}"), args.rows, args.rows_per_file, features)
            print(f"{features}: {args.rows:,} rows built in {time.monotonic() - started:.1f} s", flush=True)
        changes = _changes(spark, args.rows, args.changes)
        print(f"{changes.count():,} changes per batch", flush=True)
        version = 0
        for run in range(args.runs):
            for features in chosen:
                version += 1
                path = str(work / f"{features}_{run}")
                shutil.copytree(str(work / f"base_{features}"), path)
                seconds[features].append(_merge(spark, path, changes, version))
                shutil.rmtree(path)
                print(f"run {run + 1} {features}: {seconds[features][-1]:.2f} s", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        spark.stop()
    medians = {f: statistics.median(s) for f, s in seconds.items()}
    result = [f"bench=mirror_features rows={args.rows} changes={args.changes} runs={args.runs}"]
    for features, median in medians.items():
        print(f"{features}: median {median:.2f} s ({' '.join(f'{s:.2f}' for s in seconds[features])})")
        result.append(f"{features}_s={median:.2f}")
    if len(medians) == 2:
        ratio = medians["portable"] / medians["default"]
        print(f"portable / default: {ratio:.2f}x")
        result.append(f"portable_over_default={ratio:.2f}")
    print("RESULT " + " ".join(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
