"""A consistent read through the lake's changelog: at the changelog's newest proven position (or an
older one asked for), each table its mirror's version plus its changelog tail (`changelog_tail`),
decoded as the changelog records it, so the read is as fresh as the last changelog commit however far
the mirrors trail."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, TypeVar

from kafka_contract.topics import control_topic_name
from spark_jobs.lake import changelog, delta_tables
from spark_jobs.lake.mirror_versions import RECENT_COMMITS, NoCommonWatermark, table_path, versions_of
from spark_jobs.lake.watermark_io import RECENT_IDLE_COMMITS, idle_marks
from spark_jobs.merge_options import MergeOptions, reading_options
from spark_jobs.reading import changelog_tail
from spark_jobs.reading.result import ConsistentRead, TableRead
from spark_jobs.rules import layout
from spark_jobs.rules.changelog_commit import newest_commit
from spark_jobs.rules.names import delta_path
from spark_jobs.rules.watermark import Version, tail_base

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

T = TypeVar("T")
R = TypeVar("R")
# Tables whose part of a read through the changelog is built at once (`_each`).
READ_THREADS = 4


def read_with_tail(
    spark: SparkSession,
    warehouse: str,
    names: Sequence[str],
    at_lsn: int | None,
    given: MergeOptions | None,
) -> ConsistentRead | str:
    """`consistent.read_consistent` through the warehouse's changelog, or why it cannot be: it proves no
    position yet, records no decoding (and none is `given`), or a table's version before the
    position is older than the changelog (its tail is not all there)."""
    path = layout.changelog_path(warehouse)
    pinned = delta_tables.newest_version(spark, path)  # batches appended meanwhile are not half read
    recent = changelog.recent_commits(spark, warehouse)
    head = newest_commit(commit for _, commit in recent)
    if head is None or head.watermark <= 0:
        return f"the changelog of {warehouse} proves no position yet (is the worker publishing progress?)"
    options = given
    if options is None:
        decoding = changelog.recorded_decoding(spark, warehouse, recent)
        if decoding is None:
            return (
                f"the changelog of {warehouse} records no decoding settings (written by an older merge "
                "until its next batch): give the merge's format, registry and topic prefix"
            )
        options = reading_options(warehouse, decoding)
    if options.output_format == "avro" and not options.schema_registry:
        return f"the changelog of {warehouse} holds Avro records: give the schema registry to decode them"
    position = head.watermark if at_lsn is None else min(at_lsn, head.watermark)
    idle = idle_marks(spark, warehouse, RECENT_IDLE_COMMITS)

    def base_of(name: str) -> tuple[Version | None, float | None]:
        """The table's base version, and when the version after it was committed if it is not the
        newest (a base older than the changelog's start has no whole tail)."""
        # The base is among the newest commits unless the position is older than all of them.
        table = versions_of(spark, warehouse, name, use_history=False, idle=idle, limit=RECENT_COMMITS)
        base = tail_base(table, position) or tail_base(
            versions_of(spark, warehouse, name, use_history=False, idle=idle, limit=None), position
        )
        if base is None:
            return None, None
        mirror = table_path(warehouse, name)
        newer = base.version < delta_tables.newest_version(spark, mirror)
        return base, _committed_s(spark, mirror, base.version + 1) if newer else None

    bases: dict[str, Version] = {}
    started: float | None = None
    for name, (base, next_committed) in zip(names, _each(names, base_of), strict=True):
        if base is None:
            return f"{name}: no version of its mirror holds nothing after {position}"
        if next_committed is not None:
            started = _changelog_started(spark, warehouse) if started is None else started
            if next_committed < started:
                return f"{name}: its mirror's version {base.version} is older than the changelog's start"
        bases[name] = base
    reads = _read_tails(spark, warehouse, bases, position=position, pinned=pinned, options=options)
    return ConsistentRead(position, reads, head.watermark, head.at, pinned)


def _each(items: Sequence[T], work: Callable[[T], R]) -> list[R]:
    """`work` on every item, in order, READ_THREADS at once: a table's part of a read is mostly
    round trips to the JVM (Delta's log, the plan's analysis), which overlap across threads."""
    if len(items) < 2:
        return [work(item) for item in items]
    with ThreadPoolExecutor(min(READ_THREADS, len(items)), thread_name_prefix="bw-read") as pool:
        return list(pool.map(work, items))


def _read_tails(
    spark: SparkSession,
    warehouse: str,
    bases: Mapping[str, Version],
    *,
    position: int,
    pinned: int,
    options: MergeOptions,
) -> dict[str, TableRead]:
    """Each table's base version, with its changelog tail up to `position` when the version's
    watermark is older (the tails read and summarized together: `changelog_tail.tails`)."""

    def version_of(name: str) -> TableRead | tuple[changelog_tail.MirrorVersion, dict[str, str]]:
        """The table's read when its version holds the position; else the version to apply a tail
        to, not loaded (the tail's statement resolves it), and the table's properties."""
        path, version = table_path(warehouse, name), bases[name].version
        if bases[name].mark.watermark >= position:
            return TableRead(
                name, spark.read.format("delta").option("versionAsOf", version).load(path), version
            )
        relation = f"{delta_path(path)} VERSION AS OF {version}"
        mirror = changelog_tail.MirrorVersion(relation, delta_tables.column_names_at(spark, path, version))
        return mirror, delta_tables.table_properties(spark, path)

    names = list(bases)
    reads: dict[str, TableRead] = {}
    behind: dict[str, tuple[changelog_tail.MirrorVersion, dict[str, str]]] = {}
    for name, read in zip(names, _each(names, version_of), strict=True):
        if isinstance(read, TableRead):
            reads[name] = read
        else:
            behind[name] = read
    if not behind:
        return reads
    locations = {
        name: layout.location_for_topic(properties[layout.TOPIC_PROPERTY], options.topic_prefix)
        for name, (_, properties) in behind.items()
    }
    afters = {locations[name].topic: bases[name].mark.watermark for name in behind}

    def with_tail(name: str) -> TableRead:
        mirror, properties = behind[name]
        tail, summary = tails[locations[name].topic]
        frame = changelog_tail.with_tail(
            spark,
            mirror,
            tail,
            location=locations[name],
            options=options,
            properties=properties,
            summary=summary,
        )
        return TableRead(name, frame, bases[name].version, bases[name].mark.watermark)

    control, fmt = control_topic_name(options.topic_prefix), options.output_format
    with changelog_tail.tails(
        spark, warehouse, afters, control, upto=position, version=pinned, output_format=fmt
    ) as tails:
        reads.update(zip(behind, _each(list(behind), with_tail), strict=True))
    return {name: reads[name] for name in names}


def _changelog_started(spark: SparkSession, warehouse: str) -> float:
    """When the changelog's first batch was committed (epoch seconds)."""
    first = min(version for version, _ in changelog.commits(spark, warehouse))
    return _committed_s(spark, layout.changelog_path(warehouse), first)


def _committed_s(spark: SparkSession, path: str, version: int) -> float:
    """When a table's `version` was committed (epoch seconds, Delta's commit timestamp)."""
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    row = (
        DeltaTable.forPath(spark, path)
        .history()
        .where(F.col("version") == F.lit(version))
        .select(F.unix_micros("timestamp").alias("at"))
        .head()
    )
    if row is None:
        raise NoCommonWatermark(f"{path} has no version {version} in its log (retention removed it?)")
    return float(row["at"]) / 1e6
