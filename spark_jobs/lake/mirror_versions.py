"""A mirror's marked versions, and the lake's common watermark, read from the Delta logs.

Each merge commit records the table's mark (`spark_jobs.rules.watermark`); a batch with nothing of a
table records it in the warehouse's idle marks. `versions_of` gathers a table's marked versions with
its idle marks and what its SCD2 history table serves; `lake_watermark` the newest position every
table serves, for Dagster and the pagers, without reading the tables. `spark_jobs.consistent_read`
reads the tables at such a position.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from spark_jobs.errors import InfrastructureError
from spark_jobs.lake.table_state import TablePaths, read_state
from spark_jobs.lake.watermark_io import idle_marks, marked_versions
from spark_jobs.rules import layout
from spark_jobs.rules.watermark import (
    IdleMark,
    TableVersions,
    common_watermark,
    proven_at,
    table_key,
    with_idle,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# The observation looks at the newest commits only: the newest common position is among them.
RECENT_COMMITS = 20


class NoCommonWatermark(InfrastructureError):
    """No position that every table serves (yet)."""


def table_path(warehouse: str, name: str) -> str:
    """`schema.table` (safe names, as the topic gives them; `table` alone for public) -> its mirror."""
    schema, _, table = name.rpartition(".")
    return f"{warehouse.rstrip('/')}/{schema or 'public'}/{table}"


def versions_of(
    spark: SparkSession,
    warehouse: str,
    name: str,
    *,
    use_history: bool = True,
    limit: int | None = None,
    idle: Mapping[str, Sequence[IdleMark]] | None = None,
) -> TableVersions:
    """A table's marked versions (among its newest `limit` commits, if given) with its marks among
    the warehouse's `idle` marks (by table key, `watermark_io.idle_marks`), and the positions its
    history table serves (if it has one)."""
    path = table_path(warehouse, name)
    history_path = path + layout.HISTORY_SUFFIX
    state = read_state(spark, TablePaths(path, history=history_path if use_history else None))
    if not state.exists:
        raise NoCommonWatermark(f"no Delta table {path} for {name}: merge it first, or check --warehouse")
    versions = marked_versions(spark, path, limit)
    history = None
    if state.history_exists:
        marks = [v.mark for v in marked_versions(spark, history_path, limit)]
        if marks:
            # A history table created with its mirror holds every change since the slot's snapshot,
            # whose rows carry the consistent point C; its first watermark is at least C - 1. The
            # history shows a snapshot row from C on (it has no op column to count it as C - 1 like
            # `applied` does), so it serves positions after its first watermark.
            history = (marks[0].watermark + 1, max(m.watermark for m in marks))
    own = () if idle is None else idle.get(table_key(path), ())
    return with_idle(TableVersions(name, versions, history), own)


def lake_watermark(
    spark: SparkSession, warehouse: str, names: Sequence[str]
) -> dict[str, int | float | None]:
    """The common watermark of `names`, its lag and when it was proven, without reading the tables
    (for Dagster's observation, the freshness check and the slot-lag pager): `common_watermark`
    None when they share no position yet."""
    tables = []
    idle = idle_marks(spark, warehouse, RECENT_COMMITS)
    for name in names:
        try:
            tables.append(versions_of(spark, warehouse, name, limit=RECENT_COMMITS, idle=idle))
        except NoCommonWatermark:
            continue  # not merged yet: it holds no reader back until it exists
    position = common_watermark(tables)
    proven = proven_at(tables, position)
    return {
        "common_watermark": position,
        "common_watermark_lag_s": None if proven is None else round(max(0.0, time.time() - proven / 1e6), 3),
        # When the worker proved it (epoch seconds): the lag of a later look is now minus this.
        "common_watermark_proven_at": None if proven is None else proven / 1e6,
        "tables_with_watermark": sum(1 for t in tables if t.versions),
    }
