"""A mirror as one slice of a merge batch finds it, read once before the slice's steps.

Every step of the slice (DDL, TRUNCATE, tombstones, history, mirror, the mark commit) decides from
this one value instead of asking the lake again: what a step changes, it returns, and the next step
is handed that. Reading it costs a listing of the mirror's log and its newest metadata (cached by
Delta per table, `delta_tables.table_properties`), the history's newest version and whether the
tombstones table exists; the TRUNCATE remembered before the mirror existed is read only while it
does not.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from spark_jobs.lake import delta_tables
from spark_jobs.rules import layout
from spark_jobs.rules.watermark import START, WATERMARK_PROPERTY, Mark, parse_mark

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@dataclass(frozen=True)
class TablePaths:
    """Where a mirror and the tables beside it are: its history, its tombstones, and the TRUNCATEs
    seen before it existed (`merging.truncates`); None: not kept, or not asked about."""

    mirror: str
    history: str | None = None
    tombstones: str | None = None
    pending_truncates: str | None = None


@dataclass(frozen=True)
class TableState:
    """version: the mirror's newest version (-1: no mirror yet); properties: its newest properties
    (the key, the TRUNCATE it starts after, the mark); history_version likewise (-1: none);
    pending_truncate: the newest TRUNCATE remembered while there was no mirror."""

    paths: TablePaths
    version: int = -1
    properties: Mapping[str, str] = field(default_factory=dict)
    history_version: int = -1
    tombstones_exist: bool = False
    pending_truncate: tuple[int, int] | None = None

    @property
    def exists(self) -> bool:
        return self.version >= 0

    @property
    def history_exists(self) -> bool:
        return self.history_version >= 0

    @property
    def mark(self) -> Mark:
        """The mirror's stored mark (its property), START when it has none."""
        return parse_mark(self.properties.get(WATERMARK_PROPERTY)) or START

    @property
    def known_truncate(self) -> tuple[int, int] | None:
        """The TRUNCATE the mirror starts after: its property, or the one remembered before it."""
        if self.exists:
            return layout.parse_position(self.properties.get(layout.TRUNCATED_BEFORE_PROPERTY))
        return self.pending_truncate


def read_state(spark: SparkSession, paths: TablePaths) -> TableState:
    """The state of the mirror at `paths` (and of the tables beside it that `paths` names), as a
    merge slice's steps, the maintenance and the readers take it."""
    version = delta_tables.newest_version(spark, paths.mirror)
    history = -1 if paths.history is None else delta_tables.newest_version(spark, paths.history)
    tombstones = paths.tombstones is not None and delta_tables.table_exists(spark, paths.tombstones)
    pending = paths.pending_truncates if version < 0 else None
    return TableState(
        paths,
        version,
        delta_tables.table_properties(spark, paths.mirror) if version >= 0 else {},
        history,
        tombstones,
        None if pending is None else newest_position(spark, pending),
    )


def newest_position(spark: SparkSession, path: str) -> tuple[int, int] | None:
    """The newest (lsn, seq) among the rows of the table at `path`, None when it has none."""
    from pyspark.sql import functions as F

    frame = delta_tables.read_table(spark, path)
    if frame is None:
        return None
    newest = frame.select(F.max(F.struct(F.col(layout.LSN), F.col(layout.SEQ))).alias("newest")).head()
    if newest is None or newest["newest"] is None:
        return None
    return int(newest["newest"][0]), int(newest["newest"][1])
