"""Rebuild: one mirror (and its history table) merged anew from the lake's changelog, no Kafka needed.

For a mirror that was deleted, damaged, or merged wrong: the table's whole slice of the changelog
(its topic's records and the control topic's, as of the changelog's newest version) is merged in one
batch into a staging warehouse (`<warehouse>/_bw_state/rebuild`), its mark set to the changelog's
proven position, and then moved into place; the replaced mirror, history and tombstones are kept
under `<warehouse>/_bw_state/replaced/<schema>/<table>.<time>` for the operator to delete.

The changelog must hold the table from its first message: every partition of its topic from offset
0 (a changelog started after the table, or trimmed past its first changes by retention, does not;
re-snapshot the table instead). Stop the merge while rebuilding: a batch merged into the mirror
during the move would be lost with the replaced copy.

    python -m spark_jobs.rebuild --warehouse /lake --table public.accounts -r http://registry:8081
"""

from __future__ import annotations

import logging
import os
import sys
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from kafka_contract.topics import control_topic_name
from spark_jobs import option_parser
from spark_jobs.connections import dsn
from spark_jobs.errors import ConfigurationError
from spark_jobs.job_main import exit_on_error
from spark_jobs.lake import changelog, delta_tables, watermark_io
from spark_jobs.lake.table_state import TablePaths, read_state
from spark_jobs.merge_options import MergeOptions, options_from_args
from spark_jobs.merging.merge_batch import TableMerger
from spark_jobs.rules import layout, mirror_features
from spark_jobs.rules.changelog_commit import newest_commit
from spark_jobs.rules.mirror_features import MirrorFeatures
from spark_jobs.rules.watermark import NO_POSITION, Mark

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)
REBUILD_DIR = "rebuild"
REPLACED_DIR = "replaced"


class RebuildRefused(ConfigurationError):
    """The changelog cannot rebuild the table; the text says why and what to do instead."""


@dataclass(frozen=True)
class Rebuilt:
    """What a rebuild did: the mirror, the messages merged, the mark set, where the old copy went."""

    path: str
    messages: int
    mark: Mark
    replaced: str | None


def _topic_of(spark: SparkSession, opts: MergeOptions, table: str) -> str:
    """The topic of `table` (`schema.table`, safe names; `table` alone for public): its mirror's, else
    the changelog's topic named so."""
    from pyspark.sql import functions as F

    schema, _, name = table.rpartition(".")
    wanted = f"{schema or 'public'}.{name}"
    mirror = f"{opts.warehouse.rstrip('/')}/{schema or 'public'}/{name}"
    topic = read_state(spark, TablePaths(mirror)).properties.get(layout.TOPIC_PROPERTY)
    if topic:
        return topic
    frame = spark.read.format("delta").load(layout.changelog_path(opts.warehouse))
    for row in frame.select("topic").distinct().where(F.col("topic").isNotNull()).collect():
        try:
            location = layout.location_for_topic(str(row[0]), opts.topic_prefix)
        except ValueError:
            continue
        if location.qualified_safe_name == wanted:
            return str(row[0])
    raise RebuildRefused(
        f"the changelog holds nothing of {table}: check the name (schema.table, safe names) and "
        "--topic-prefix"
    )


def _check_whole(spark: SparkSession, warehouse: str, topic: str, table: str, version: int) -> None:
    """Refuse unless the changelog holds every partition of `topic` from its first message."""
    from pyspark.sql import functions as F

    records = changelog.read(spark, warehouse, [topic], version)
    firsts = records.groupBy("partition").agg(F.min("offset").alias("first")).collect()
    if not firsts:
        raise RebuildRefused(
            f"the changelog holds no record of {table} (retention trimmed them, or it started after its "
            f"last change): re-snapshot the table instead (bottledwater resnapshot {table})"
        )
    for row in firsts:
        if int(row["first"]) > 0:
            raise RebuildRefused(
                f"the changelog holds {table} from offset {row['first']} of partition {row['partition']} "
                "on, not from its first message (it started, or retention trimmed it, after): "
                f"re-snapshot the table instead (bottledwater resnapshot {table})"
            )


def _move(spark: SparkSession, source: str, target: str) -> bool:
    """Rename a directory through Hadoop's file system (any URI the session reaches); False when
    `source` does not exist."""
    jvm: Any = spark.sparkContext._jvm
    src, fs = watermark_io.hadoop_path(spark, source)
    if not fs.exists(src):
        return False
    dst = jvm.org.apache.hadoop.fs.Path(target)
    fs.mkdirs(dst.getParent())
    if not fs.rename(src, dst):
        raise OSError(f"could not move {source} to {target}: is the warehouse writable?")
    return True


def _delete(spark: SparkSession, location: str) -> None:
    path, fs = watermark_io.hadoop_path(spark, location)
    fs.delete(path, True)


def rebuild(spark: SparkSession, opts: MergeOptions, table: str) -> Rebuilt:
    """Merge `table`'s mirror anew from the changelog and put it in place (see the module's text)."""
    warehouse = opts.warehouse.rstrip("/")
    if not changelog.exists(spark, warehouse):
        raise RebuildRefused(
            f"{warehouse} keeps no changelog (merge --changelog): re-snapshot {table} instead "
            f"(bottledwater resnapshot {table})"
        )
    recent = changelog.recent_commits(spark, warehouse)
    if not recent:
        raise RebuildRefused(f"the changelog of {warehouse} has no batch commit yet: merge first")
    # Pinned: batches appended while it runs are not half in it; trims and compactions are in it.
    version = delta_tables.newest_version(spark, layout.changelog_path(warehouse))
    head = newest_commit(commit for _, commit in recent)
    topic = _topic_of(spark, opts, table)
    _check_whole(spark, warehouse, topic, table, version)
    location = layout.location_for_topic(topic, opts.topic_prefix)
    staging = f"{warehouse}/{layout.STATE_DIR}/{REBUILD_DIR}/{uuid.uuid4().hex[:12]}"
    staged = replace(opts, warehouse=staging, changelog=False)
    merger = TableMerger(location, staged)
    merger.bind(f"rebuild-{uuid.uuid4().hex[:12]}")
    control = control_topic_name(opts.topic_prefix)
    records = changelog.read(spark, warehouse, [topic, control], version)
    result = merger.process(records, 0)
    staged_path, staged_history = location.path(staging), location.history_path(staging)
    staged_state = read_state(spark, TablePaths(staged_path, history=staged_history))
    if result is None or not staged_state.exists:
        _delete(spark, staging)
        raise RebuildRefused(f"the changelog's records of {table} make no mirror (no row was ever published)")
    applied = _applied(spark, warehouse, topic, version)
    mark = Mark(NO_POSITION if head is None else head.watermark, applied, None if head is None else head.at)
    watermark_io.write_mark(spark, staged_path, mark)
    if opts.history and staged_state.history_exists:
        watermark_io.write_mark(spark, staged_history, mark)
    replaced = _swap(spark, location, staging, warehouse)
    _delete(spark, staging)
    # The session's cached log of the mirror's path is the replaced table's.
    spark._jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()  # type: ignore[union-attr]
    log.info("%s rebuilt from the changelog: %s messages, mark %s", table, result.messages, mark)
    return Rebuilt(location.path(warehouse), result.messages, mark, replaced)


def _applied(spark: SparkSession, warehouse: str, topic: str, version: int) -> int:
    """The newest source position among the topic's changes in the changelog (its rows carry the
    `_bw_op` and `_bw_lsn` a merge batch's decoded changes do)."""
    from pyspark.sql import functions as F

    frame = spark.read.format("delta").option("versionAsOf", version).load(layout.changelog_path(warehouse))
    applied = watermark_io.batch_applied(frame.where(F.col("topic") == F.lit(topic)))
    return NO_POSITION if applied is None else applied


def _swap(spark: SparkSession, location: layout.TableLocation, staging: str, warehouse: str) -> str | None:
    """The staged mirror, history and tombstones into place; the replaced ones kept aside. Returns
    where they went (None: there was no mirror)."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    aside = f"{warehouse}/{layout.STATE_DIR}/{REPLACED_DIR}/{location.schema}/{location.table}.{stamp}"
    pairs = (
        (location.path, "mirror"),
        (location.history_path, "history"),
        (location.tombstones_path, "tombstones"),
    )
    moved = False
    for path_of, name in pairs:
        moved |= _move(spark, path_of(warehouse), f"{aside}/{name}")
        _move(spark, path_of(staging), path_of(warehouse))
    return aside if moved else None


def existing_features(spark: SparkSession, warehouse: str, table: str) -> MirrorFeatures:
    """The features of the mirror a rebuild replaces (`default` when there is none): a rebuild
    without --mirror-features keeps them."""
    schema, _, name = table.rpartition(".")
    path = f"{warehouse.rstrip('/')}/{schema or 'public'}/{name}"
    state = read_state(spark, TablePaths(path))
    return mirror_features.of_table(state.properties) if state.exists else mirror_features.DEFAULT


@exit_on_error
def main(argv: Sequence[str] | None = None) -> int:
    from shared_connections.spark_session import build_session

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    dsn.redact_logs()
    description = "Rebuild one Delta mirror (and its history) from the lake's changelog."
    args = option_parser.build_parser("rebuild", description).parse_args(argv)
    if len(args.table) != 1:
        raise ConfigurationError("name one table to rebuild: --table schema.table")
    # The merge's DSN rules: -d warns (the process list shows it), then --postgres-file, then the
    # environment, so that the help's advice holds for both jobs.
    postgres_types, warning = dsn.merge_dsn(args.postgres_types, args.postgres_file, os.environ)
    if warning:
        log.warning(warning)
    spark = build_session(option_parser.spark_settings(args, "bottledwater-rebuild"))
    opts = options_from_args(
        args,
        changelog.recorded_decoding(spark, args.warehouse),
        postgres=postgres_types,
        kept_features=lambda: existing_features(spark, args.warehouse, args.table[0]),
    )
    if opts.output_format == "avro" and not opts.schema_registry:
        raise ConfigurationError(
            "--schema-registry is required for avro topics (the changelog records no registry)"
        )
    try:
        done = rebuild(spark, opts, args.table[0])
    except RebuildRefused as exc:
        raise RebuildRefused(f"{args.table[0]}: {exc}") from None
    print(
        f"{done.path}: rebuilt from the changelog, {done.messages} messages, watermark {done.mark.watermark}"
        + ("" if done.replaced is None else f"; the replaced copy is in {done.replaced}")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
