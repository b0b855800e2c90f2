"""Maintenance: OPTIMIZE (Z-ordered by the key), deletion vectors purged, VACUUM, and pruning of the
merge's tombstones.

Every merge batch writes small files; OPTIMIZE compacts them, and Z-ordering by the key clusters
rows so that the next MERGE (which joins on the key) prunes files instead of rewriting most of them.
The MERGE marks updated and deleted rows in deletion vectors instead of rewriting their files; every
read applies them until `REORG TABLE … APPLY (PURGE)` rewrites the files that carry them (OPTIMIZE's
Z-order rewrites them all anyway; plain compaction leaves large files alone).
VACUUM deletes files no version within the retention needs: keep the retention longer than the
longest query and than any time travel you rely on (Delta refuses less than 7 days unless forced).
Tombstones older than their retention are dropped: a stale insert can only arrive from a replay,
and Kafka's compaction removes tombstoned keys after `delete.retention.ms` (one day by default).
The lake's changelog (merge --changelog) keeps its rows for `--changelog-days` (7 by default), never
those of a parked table (they wait to be merged) nor the newest batch's (its proven position).

    spark-submit --py-files bottledwater.zip spark_jobs/maintenance.py --warehouse /lake [--vacuum-hours 168]
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from spark_jobs import option_parser, options
from spark_jobs.job_main import exit_on_error
from spark_jobs.lake import changelog, delta_tables, warehouse
from spark_jobs.lake.table_state import TablePaths, read_state
from spark_jobs.merging.parked import ParkedLog
from spark_jobs.rules import layout, mirror_features
from spark_jobs.rules.names import delta_path

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)
DEFAULT_VACUUM_HOURS = options.DEFAULT_VACUUM_HOURS  # Delta's own minimum without the safety check
DEFAULT_TOMBSTONE_HOURS = options.DEFAULT_TOMBSTONE_HOURS
RETENTION_CHECK_CONF = "spark.databricks.delta.retentionDurationCheck.enabled"


@dataclass
class ChangelogResult:
    path: str
    trimmed: int
    optimize_metrics: dict[str, Any]


@dataclass
class MaintenanceResult:
    path: str
    optimize_metrics: dict[str, Any]
    vacuumed: bool
    tombstones_pruned: int
    deletion_vectors_purged: int = 0


def optimize(spark: SparkSession, path: str, zorder: bool = True) -> dict[str, Any]:
    """Compact small files; Z-order by the key (from the table's properties) when asked and known."""
    from delta.tables import DeltaTable

    keys = layout.decode_key_columns(delta_tables.table_properties(spark, path).get(layout.KEY_PROPERTY))
    builder = DeltaTable.forPath(spark, path).optimize()
    result = builder.executeZOrderBy(*keys) if zorder and keys else builder.executeCompaction()
    row = result.select("metrics").head()
    return row[0].asDict(recursive=True) if row is not None else {}


def purge_deletion_vectors(spark: SparkSession, path: str) -> int:
    """Rewrite the files that carry deletion vectors without the rows they mark (REORG … APPLY
    (PURGE)); returns how many deletion vectors went. Files without any are left alone."""
    from pyspark.sql import functions as F

    result = spark.sql(f"REORG TABLE {delta_path(path)} APPLY (PURGE)")
    row = result.select(F.col("metrics.deletionVectorStats.numDeletionVectorsRemoved")).head()
    return int(row[0] or 0) if row is not None else 0


def enable_deletion_vectors(spark: SparkSession, path: str) -> bool:
    """Turn deletion vectors on for a table created without them (before they were the default);
    returns whether it did. This upgrades the table's Delta protocol to reader 3 / writer 7 (table
    features): a reader without the deletionVectors feature can no longer read it. A portable table
    (`--mirror-features portable`) is left as it is, said in one log line: its readers are the ones
    that feature would lock out."""
    properties = delta_tables.table_properties(spark, path)
    if properties.get(delta_tables.DELETION_VECTORS) == "true":
        return False
    if mirror_features.of_table(properties) == mirror_features.PORTABLE:
        log.info("%s: portable (--mirror-features portable): deletion vectors left off", path)
        return False
    on = f"'{delta_tables.DELETION_VECTORS}' = 'true'"
    spark.sql(f"ALTER TABLE {delta_path(path)} SET TBLPROPERTIES ({on})")
    log.info("%s: deletion vectors enabled (Delta protocol now reader 3 / writer 7)", path)
    return True


def _vectors_removed(optimize_metrics: dict[str, Any]) -> int:
    """The deletion vectors OPTIMIZE dropped with the files it rewrote."""
    return int((optimize_metrics.get("deletionVectorStats") or {}).get("numDeletionVectorsRemoved") or 0)


def vacuum(
    spark: SparkSession, path: str, retention_hours: float = DEFAULT_VACUUM_HOURS, force: bool = False
) -> None:
    """Delete unreferenced files older than the retention. Below 168 hours only with `force`, since
    a concurrent reader or a long merge may still need those files."""
    from delta.tables import DeltaTable

    if retention_hours < DEFAULT_VACUUM_HOURS and not force:
        raise ValueError(
            f"VACUUM retention {retention_hours}h is under Delta's {DEFAULT_VACUUM_HOURS:.0f}h safety limit: "
            "pass force=True (--force) if no reader or writer can still need older files"
        )
    previous = spark.conf.get(RETENTION_CHECK_CONF, None)
    if force:
        spark.conf.set(RETENTION_CHECK_CONF, "false")
    try:
        DeltaTable.forPath(spark, path).vacuum(retention_hours)
    finally:
        if force:
            spark.conf.set(RETENTION_CHECK_CONF, previous or "true")


def prune_tombstones(
    spark: SparkSession, path: str, retention: timedelta, now: datetime | None = None
) -> int:
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    tombstones = delta_tables.read_table(spark, path)
    if tombstones is None:
        return 0
    cutoff = (now or datetime.now(UTC)) - retention
    old = F.col(layout.COMMIT_TS) < F.lit(cutoff)
    count = tombstones.where(old).count()
    if count:
        DeltaTable.forPath(spark, path).delete(old)
    return count


def maintain_changelog(
    spark: SparkSession,
    root: str,
    retention: timedelta,
    *,
    vacuum_hours: float | None = DEFAULT_VACUUM_HOURS,
    force: bool = False,
    now: datetime | None = None,
) -> ChangelogResult | None:
    """Trim the changelog's rows older than `retention` (parked tables' rows stay: their changes are
    not merged yet), OPTIMIZE what is left (which clusters it by topic) and VACUUM it; None when the
    warehouse has no changelog."""
    path = layout.changelog_path(root)
    if not changelog.exists(spark, root):
        return None
    parked = ParkedLog(root)
    parked.load(spark)
    cutoff = (now or datetime.now(UTC)) - retention
    trimmed = changelog.trim(spark, root, cutoff, keep_topics=parked.topics())
    metrics = optimize(spark, path, zorder=False)
    if vacuum_hours is not None:
        vacuum(spark, path, vacuum_hours, force)
    return ChangelogResult(path, trimmed, metrics)


def maintain(
    spark: SparkSession,
    root: str,
    *,
    tables: Sequence[str] = (),
    zorder: bool = True,
    vacuum_hours: float | None = DEFAULT_VACUUM_HOURS,
    force: bool = False,
    tombstone_retention: timedelta = timedelta(hours=DEFAULT_TOMBSTONE_HOURS),
    deletion_vectors: bool = False,
) -> list[MaintenanceResult]:
    """OPTIMIZE and purge the deletion vectors of (and VACUUM unless `vacuum_hours` is None) every
    mirror, its history table and its tombstone table (compacted, not Z-ordered), after pruning the
    tombstones past their retention. `deletion_vectors`: first turn them on for the mirrors and
    history tables created without them (a protocol upgrade, `enable_deletion_vectors`)."""
    results = []
    for location in warehouse.list_tables(spark, root):
        if tables and location.qualified_safe_name not in tables:
            continue
        path = location.path(root)
        history, tombstones = location.history_path(root), location.tombstones_path(root)
        state = read_state(spark, TablePaths(path, history=history, tombstones=tombstones))
        has_history = state.history_exists
        if deletion_vectors:
            for table in (path, history) if has_history else (path,):
                enable_deletion_vectors(spark, table)
        metrics = optimize(spark, path, zorder)
        purged = _vectors_removed(metrics) + purge_deletion_vectors(spark, path)
        if has_history:
            optimize(spark, history, zorder)
            purge_deletion_vectors(spark, history)
        if vacuum_hours is not None:
            vacuum(spark, path, vacuum_hours, force)
            if has_history:
                vacuum(spark, history, vacuum_hours, force)
        pruned = prune_tombstones(spark, tombstones, tombstone_retention)
        if state.tombstones_exist:
            # Each batch with deletes appends a small file to it (mirror_merge.append_tombstones),
            # and every batch reads all of them for the resurrection guard.
            optimize(spark, tombstones, zorder=False)
            purge_deletion_vectors(spark, tombstones)  # the pruning's DELETE leaves some
            if vacuum_hours is not None:
                vacuum(spark, tombstones, vacuum_hours, force)
        results.append(MaintenanceResult(path, metrics, vacuum_hours is not None, pruned, purged))
    return results


@exit_on_error
def main(argv: Sequence[str] | None = None) -> int:
    from shared_connections.spark_session import build_session

    args = option_parser.build_parser("maintenance", "OPTIMIZE and VACUUM the Delta mirrors.").parse_args(
        argv
    )
    spark = build_session(option_parser.spark_settings(args, "bottledwater-maintenance"))
    if not args.table:
        log_result = maintain_changelog(
            spark,
            args.warehouse,
            timedelta(days=args.changelog_days),
            vacuum_hours=None if args.no_vacuum else args.vacuum_hours,
            force=args.force,
        )
        if log_result is not None:
            print(
                f"{log_result.path}: {log_result.trimmed} rows past {args.changelog_days:g} days trimmed, "
                f"optimized ({log_result.optimize_metrics.get('numFilesRemoved', 0)} files -> "
                f"{log_result.optimize_metrics.get('numFilesAdded', 0)})"
            )
    results = maintain(
        spark,
        args.warehouse,
        tables=args.table,
        zorder=not args.no_zorder,
        vacuum_hours=None if args.no_vacuum else args.vacuum_hours,
        force=args.force,
        tombstone_retention=timedelta(hours=args.tombstone_hours),
        deletion_vectors=args.enable_deletion_vectors,
    )
    for result in results:
        files = (
            result.optimize_metrics.get("numFilesRemoved", 0),
            result.optimize_metrics.get("numFilesAdded", 0),
        )
        print(
            f"{result.path}: optimized ({files[0]} files -> {files[1]}), vacuumed={result.vacuumed}, "
            f"deletion vectors purged={result.deletion_vectors_purged}, "
            f"tombstones pruned={result.tombstones_pruned}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
