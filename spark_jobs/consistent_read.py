"""Consistent reads across tables: DataFrames of several Delta mirrors as of one source position.

Every merge commit records the table's mark (`spark_jobs.rules.watermark`): every transaction committed at
or before `watermark` is applied, and no change after `applied`; a batch with nothing of a table
records its mark in the warehouse's idle marks instead. A version equals its Postgres table
as of W when applied <= W <= watermark; a `--history` table serves any W up to its watermark through
its validity columns. `read_consistent` takes the newest W that every table serves (or the newest at
or before a position or time asked for) and returns each table at it, so a transaction that touched
several tables is seen whole or not at all. docs/lakehouse.md has the argument and an example.

    python -m spark_jobs.consistent_read --warehouse /tmp/lake public.accounts public.transfers
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, TypeVar

from kafka_contract.topics import control_topic_name
from spark_jobs import consistent_views, option_parser
from spark_jobs.errors import ConfigurationError
from spark_jobs.job_main import exit_on_error
from spark_jobs.lake import changelog, delta_tables
from spark_jobs.lake.mirror_versions import RECENT_COMMITS, table_path, versions_of
from spark_jobs.lake.mirror_versions import NoCommonWatermark as NoCommonWatermark  # noqa: PLC0414 (re-exported: reads raise it)
from spark_jobs.lake.watermark_io import RECENT_IDLE_COMMITS, idle_marks
from spark_jobs.merge_options import MergeOptions, options_from_args, reading_options
from spark_jobs.merging import changelog_tail, scd2
from spark_jobs.rules import layout
from spark_jobs.rules.changelog_commit import newest_commit
from spark_jobs.rules.names import delta_path
from spark_jobs.rules.watermark import (
    TableVersions,
    Version,
    common_watermark,
    proven_at,
    readable_at,
    tail_base,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


log = logging.getLogger(__name__)
T = TypeVar("T")
R = TypeVar("R")
# Tables whose part of a read through the changelog is built at once (`_each`).
READ_THREADS = 4


@dataclass(frozen=True)
class TableRead:
    """One table of a consistent read: its frame and where it came from (a mirror version, or the
    history table when `version` is None), and, when the changelog's tail was applied to the version,
    the position the tail starts after (`tail_after`, the version's watermark)."""

    name: str
    frame: DataFrame
    version: int | None
    tail_after: int | None = None


@dataclass(frozen=True)
class ConsistentRead:
    """`position`: the commit LSN the tables are read at (every transaction at or before it, none
    after). `newest`: the newest watermark any of them reached; `proven_at`: when the worker proved
    `position` (epoch microseconds), so `lag_s` is how old that proof is."""

    position: int
    tables: dict[str, TableRead]
    newest: int
    proven_at: int | None
    changelog_version: int | None = None
    # Why the read is not through the changelog (None when it is): it is then at the mirrors' common
    # position, as fresh as the mirrors.
    not_fresh: str | None = None

    @property
    def lag_s(self) -> float | None:
        return None if self.proven_at is None else max(0.0, time.time() - self.proven_at / 1e6)

    def frame(self, name: str) -> DataFrame:
        return self.tables[name].frame

    def register_views(self, prefix: str = "") -> dict[str, str]:
        """Every table as a temporary SQL view at `position` (`consistent_views`: public.accounts is
        `<prefix>accounts`, sales.orders `<prefix>sales_orders`). Returns table -> view."""
        return consistent_views.register_views({n: t.frame for n, t in self.tables.items()}, prefix)


def read_consistent(
    spark: SparkSession,
    warehouse: str,
    names: Sequence[str],
    *,
    at_lsn: int | None = None,
    at_time: datetime | None = None,
    use_history: bool = True,
    tail_from: MergeOptions | None = None,
    through_changelog: bool = True,
) -> ConsistentRead:
    """The tables as of one position: the newest all serve, or the newest at or before `at_lsn`, or
    (`at_time`) at or before the newest commit of these tables' transactions up to that time (from
    their history tables, else their current rows: without history, a transaction whose rows were all
    changed since is not seen, and the answer may be older than asked). Raises NoCommonWatermark.

    When the warehouse keeps a changelog (and `through_changelog`), the position is the changelog's
    newest proven one (or `at_lsn`, or `at_time`'s, if older: the changelog's records count among the
    tables' transactions) and each table is its mirror plus its changelog tail (`changelog_tail`),
    decoded as the changelog records it (the merge's format, registry and topic prefix), so the read
    is as fresh as the last changelog commit, however far the mirrors trail. `tail_from`: the merge's
    options to decode with instead (a registry URL with credentials, say). A read that cannot go
    through the changelog is at the mirrors' common position, and says why (`not_fresh`, and one log
    line)."""
    not_fresh = "read through the mirrors only (through_changelog=False)"
    if through_changelog:
        keeps = delta_tables.table_exists(spark, layout.changelog_path(warehouse))
        if keeps and at_time is not None:
            at_lsn, at_time = (
                _newest_commit_with_changelog(spark, warehouse, names, at_time, use_history),
                None,
            )
        fresh = (
            _read_with_tail(spark, warehouse, names, at_lsn, tail_from)
            if keeps
            else f"{warehouse} keeps no changelog"
        )
        if isinstance(fresh, ConsistentRead):
            return fresh
        not_fresh = fresh
        (log.warning if keeps else log.info)("%s: read at the mirrors' common position", not_fresh)
    # The newest position is among the newest idle marks; one in the past may be in any.
    recent = None if at_lsn is not None or at_time is not None else RECENT_IDLE_COMMITS
    idle = idle_marks(spark, warehouse, recent)
    tables = [versions_of(spark, warehouse, n, use_history=use_history, idle=idle) for n in names]
    limit = at_lsn
    if at_time is not None:
        limit = _newest_commit_before(spark, warehouse, tables, at_time)
        if limit is None:
            raise NoCommonWatermark(f"no transaction of {', '.join(names)} committed at or before {at_time}")
    position = common_watermark(tables, at_most=limit)
    if position is None:
        raise NoCommonWatermark(
            f"no position every one of {', '.join(names)} can be read at"
            + ("" if limit is None else f" at or before {limit}")
            + ": the merge has not proven one yet (is the worker publishing progress, the merge running?)"
        )
    reads = {t.name: _read_at(spark, warehouse, t, position) for t in tables}
    newest = max((v.mark.watermark for t in tables for v in t.versions), default=position)
    proven = proven_at(tables, position)
    return ConsistentRead(position, reads, newest, proven, not_fresh=not_fresh)


def _read_with_tail(
    spark: SparkSession,
    warehouse: str,
    names: Sequence[str],
    at_lsn: int | None,
    given: MergeOptions | None,
) -> ConsistentRead | str:
    """`read_consistent` through the warehouse's changelog, or why it cannot be: it proves no
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


def _read_at(spark: SparkSession, warehouse: str, table: TableVersions, position: int) -> TableRead:
    from pyspark.sql import functions as F

    path = table_path(warehouse, table.name)
    version = readable_at(table, position)
    if version is not None:
        frame = spark.read.format("delta").option("versionAsOf", version.version).load(path)
        return TableRead(table.name, frame, version.version)
    # The history table: the versions in effect at `position` (started at or before it, not ended).
    history = spark.read.format("delta").load(path + layout.HISTORY_SUFFIX)
    in_effect = (F.col(scd2.START_LSN) <= F.lit(position)) & (
        F.col(scd2.END_LSN).isNull() | (F.col(scd2.END_LSN) > F.lit(position))
    )
    frame = (
        history.where(in_effect)
        .withColumnRenamed(scd2.START_LSN, layout.LSN)
        .withColumnRenamed(scd2.START_SEQ, layout.SEQ)
        .withColumnRenamed(scd2.START_AT, layout.COMMIT_TS)
        .drop(scd2.END_LSN, scd2.END_SEQ, scd2.END_AT)
    )
    return TableRead(table.name, frame, None)


def _newest_commit_with_changelog(
    spark: SparkSession, warehouse: str, names: Sequence[str], at: datetime, use_history: bool
) -> int:
    """The newest commit of these tables' transactions at or before `at`, in their mirrors (or
    history tables) and in the changelog, whose records the mirrors may not hold yet."""
    idle = idle_marks(spark, warehouse, None)
    tables = [versions_of(spark, warehouse, n, use_history=use_history, idle=idle) for n in names]
    mirrored = _newest_commit_before(spark, warehouse, tables, at)
    topics = [
        delta_tables.table_properties(spark, table_path(warehouse, n))[layout.TOPIC_PROPERTY] for n in names
    ]
    logged = None
    if delta_tables.table_exists(spark, layout.changelog_path(warehouse)):
        logged = changelog.newest_commit_before(spark, warehouse, topics, at)
    newest = max((p for p in (mirrored, logged) if p is not None), default=None)
    if newest is None:
        raise NoCommonWatermark(f"no transaction of {', '.join(names)} committed at or before {at}")
    return newest


def _newest_commit_before(
    spark: SparkSession, warehouse: str, tables: Sequence[TableVersions], at: datetime
) -> int | None:
    from pyspark.sql import functions as F

    newest: int | None = None
    for table in tables:
        path = table_path(warehouse, table.name)
        if table.history is not None:
            frame, lsn, ts = (
                spark.read.format("delta").load(path + layout.HISTORY_SUFFIX),
                scd2.START_LSN,
                scd2.START_AT,
            )
        else:
            frame, lsn, ts = spark.read.format("delta").load(path), layout.LSN, layout.COMMIT_TS
        row = frame.where(F.col(ts) <= F.lit(at)).agg(F.max(lsn).alias("lsn")).head()
        if row is not None and row["lsn"] is not None:
            newest = max(newest or 0, int(row["lsn"]))
    return newest


def summary(read: ConsistentRead) -> dict[str, object]:
    """What the CLI prints (and Dagster shows): the position, its lag, and each table's source."""
    return {
        "position": read.position,
        "newest_watermark": read.newest,
        "lag_s": None if read.lag_s is None else round(read.lag_s, 3),
        "changelog_version": read.changelog_version,
        "not_fresh": read.not_fresh,
        "tables": {name: _source(t) for name, t in read.tables.items()},
    }


def _source(table: TableRead) -> dict[str, object]:
    if table.version is None:
        return {"version": None, "from": "history"}
    if table.tail_after is None:
        return {"version": table.version, "from": "mirror"}
    return {"version": table.version, "from": "mirror+changelog", "tail_after": table.tail_after}


DESCRIPTION = (
    "Read Delta mirrors as of one source position (the newest all reached, or one given) and print it, "
    "its lag and each table's row count."
)


def build_parser() -> argparse.ArgumentParser:
    """The shared options of every Spark job (the warehouse, the worker's format, registry and topic
    prefix, the Spark options, each with its environment variable), then the read's own."""
    parser = option_parser.build_parser("consistent_read", DESCRIPTION)
    parser.add_argument("tables", nargs="+", help="schema.table (safe names), e.g. public.accounts")
    parser.add_argument(
        "--at-lsn", type=int, help="read as of this commit LSN (or the newest position before)"
    )
    parser.add_argument(
        "--at-time", type=datetime.fromisoformat, help="read as of this time (ISO 8601, with zone)"
    )
    parser.add_argument("--no-history", action="store_true", help="read the mirrors only")
    parser.add_argument(
        "--no-changelog",
        action="store_true",
        help="read at the mirrors' common position, not at the changelog's newest (mirror + tail)",
    )
    parser.add_argument(
        "--sql",
        help="a query over the tables as views at the read's position (public.accounts is `accounts`, "
        f"sales.orders `sales_orders`); its first {consistent_views.PRINTED_ROWS} rows are printed",
    )
    return parser


@exit_on_error
def main(argv: Sequence[str] | None = None) -> int:
    from shared_connections.spark_session import build_session

    args = build_parser().parse_args(argv)
    spark = build_session(option_parser.spark_settings(args, "bottledwater-consistent-read"))
    tail_from = None
    if not args.no_changelog and delta_tables.table_exists(spark, layout.changelog_path(args.warehouse)):
        tail_from = options_from_args(args, changelog.recorded_decoding(spark, args.warehouse))
        if tail_from.output_format == "avro" and not tail_from.schema_registry:
            raise ConfigurationError(
                f"{args.warehouse} keeps a changelog of Avro records and records no registry: give "
                "--schema-registry (or set BOTTLEDWATER_SCHEMA_REGISTRY) to read its tail (or "
                "--no-changelog to read the mirrors' common position)"
            )
    read = read_consistent(
        spark,
        args.warehouse,
        args.tables,
        at_lsn=args.at_lsn,
        at_time=args.at_time,
        use_history=not args.no_history,
        tail_from=tail_from,
        through_changelog=not args.no_changelog,
    )
    out = summary(read)
    out["rows"] = {name: table.frame.count() for name, table in read.tables.items()}
    if args.sql:
        read.register_views()
        out["sql"] = consistent_views.query_rows(spark, args.sql)
    print(json.dumps(out, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
