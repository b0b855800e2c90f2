"""Consistent reads across tables: DataFrames of several Delta mirrors as of one source position.

Every merge commit records the table's mark (`spark_jobs.rules.watermark`): every transaction committed at
or before `watermark` is applied, and no change after `applied`; a batch with nothing of a table
records its mark in the warehouse's idle marks instead. A version equals its Postgres table
as of W when applied <= W <= watermark; a `--history` table serves any W up to its watermark through
its validity columns. `read_consistent` takes the newest W that every table serves (or the newest at
or before a position or time asked for) and returns each table at it, so a transaction that touched
several tables is seen whole or not at all. docs/lakehouse.md has the argument and an example.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from spark_jobs.lake import changelog, delta_tables
from spark_jobs.lake.mirror_versions import NoCommonWatermark as NoCommonWatermark  # noqa: PLC0414 (re-exported: reads raise it)
from spark_jobs.lake.mirror_versions import table_path, versions_of
from spark_jobs.lake.watermark_io import RECENT_IDLE_COMMITS, idle_marks
from spark_jobs.merge_options import MergeOptions
from spark_jobs.merging import scd2
from spark_jobs.reading.result import ConsistentRead, TableRead
from spark_jobs.reading.through_changelog import read_with_tail
from spark_jobs.rules import layout
from spark_jobs.rules.watermark import TableVersions, common_watermark, proven_at, readable_at

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


log = logging.getLogger(__name__)


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
        keeps = changelog.exists(spark, warehouse)
        if keeps and at_time is not None:
            at_lsn, at_time = (
                _newest_commit_with_changelog(spark, warehouse, names, at_time, use_history),
                None,
            )
        fresh = (
            read_with_tail(spark, warehouse, names, at_lsn, tail_from)
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
    if changelog.exists(spark, warehouse):
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
