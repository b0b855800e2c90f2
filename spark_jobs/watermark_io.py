"""The watermark's I/O: a batch's end offsets from the streaming checkpoint, the mark recorded with
every merge commit (user metadata) and as a table property, the idle marks of the tables a batch
had nothing of (one commit per batch in `<warehouse>/_bw_state/_merge/idle_marks`), and the marks
read back from a table's history and the idle marks. The logic is `spark_jobs.watermark`.

`TableWatermark` is what a merge batch calls: `begin` before its commits (the mark they carry),
`finish` after them (the mark commit: the property), or `idle` for a table with nothing in the
batch of the one merge query (its mark for the idle marks, no commit of its own)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from spark_jobs import delta_tables, layout
from spark_jobs.watermark import (
    NO_POSITION,
    START,
    WATERMARK_PROPERTY,
    IdleMark,
    Mark,
    Offsets,
    Progress,
    ProgressLog,
    Version,
    by_table,
    idle_metadata,
    newer,
    newest,
    newest_mark,
    parse_idle,
    parse_mark,
    progress_of,
    spark_end_offsets,
    table_control_position,
    table_key,
    warehouse_of,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)
USER_METADATA_CONF = "spark.databricks.delta.commitInfo.userMetadata"
# The idle-marks table's one property, set by every commit (a commit needs a change to carry its
# user metadata; the batch id makes each one differ).
IDLE_BATCH_PROPERTY = "bottledwater.batch"
# Every batch that moves an idle table's mark lists it, so its newest idle mark is among the newest
# commits (the reads of the newest common position and the merge's start look no further).
RECENT_IDLE_COMMITS = 100


def end_offsets(spark: SparkSession, checkpoint: str, batch_id: int) -> dict[tuple[str, int], int] | None:
    """The offsets a micro-batch reads up to, as its checkpoint planned them (written before the batch
    runs), through Hadoop's file system so that any checkpoint location works (s3a://, file:). None
    when Spark no longer keeps the file (a parked slice replayed long after its batch). Read for every
    table, not kept: a checkpoint restored from an older copy replans the same batch ids anew."""
    jvm: Any = spark.sparkContext._jvm
    path = jvm.org.apache.hadoop.fs.Path(f"{checkpoint.rstrip('/')}/offsets/{batch_id}")
    fs = path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    if not fs.exists(path):
        return None
    stream = fs.open(path)
    try:
        text = jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8")
    finally:
        stream.close()
    return spark_end_offsets(str(text))


@contextmanager
def recording(spark: SparkSession, mark: Mark | None) -> Iterator[None]:
    """Every Delta commit inside carries `mark` (None: nothing) as its user metadata (DESCRIBE
    HISTORY shows it, so time travel finds the version of a position). The session is the query's
    own clone, so the setting never reaches another table's commits; it is always unset after."""
    if mark is None:
        yield
        return
    with _user_metadata(spark, mark.metadata()):
        yield


@contextmanager
def _user_metadata(spark: SparkSession, text: str) -> Iterator[None]:
    spark.conf.set(USER_METADATA_CONF, text)
    try:
        yield
    finally:
        spark.conf.unset(USER_METADATA_CONF)


def stored_mark(spark: SparkSession, path: str) -> Mark:
    """The newest mark of a table (its property), START when it has none."""
    if not delta_tables.table_exists(spark, path):
        return START
    return parse_mark(delta_tables.table_properties(spark, path).get(WATERMARK_PROPERTY)) or START


def write_mark(spark: SparkSession, path: str, mark: Mark) -> None:
    """The mark commit: the table property, with the mark as the commit's user metadata. Replaying it
    is harmless (a mark never goes back: it is computed from the stored one)."""
    with recording(spark, mark):
        delta_tables.set_property(spark, path, WATERMARK_PROPERTY, mark.property_value())


def write_idle_marks(spark: SparkSession, warehouse: str, batch_id: int, marks: list[IdleMark]) -> None:
    """One commit to the idle-marks table (created on first use, no rows): the marks as its user
    metadata. Replaying it is harmless (each mark is one a batch proved)."""
    from pyspark.sql.types import LongType, StructField, StructType

    path = layout.idle_marks_path(warehouse)
    if not delta_tables.table_exists(spark, path):
        schema = StructType([StructField("batch_id", LongType())])
        delta_tables.create_table(spark, path, schema, {})
    with _user_metadata(spark, idle_metadata(marks)):
        delta_tables.set_property(spark, path, IDLE_BATCH_PROPERTY, str(batch_id))


def idle_marks(spark: SparkSession, warehouse: str, limit: int | None = None) -> dict[str, list[IdleMark]]:
    """The idle marks of the warehouse by table key, oldest first (among the newest `limit` commits,
    if given)."""
    path = layout.idle_marks_path(warehouse)
    if not delta_tables.table_exists(spark, path):
        return {}
    return by_table(m for _, metadata in _user_metadata_of(spark, path, limit) for m in parse_idle(metadata))


def _user_metadata_of(spark: SparkSession, path: str, limit: int | None) -> list[tuple[int, str]]:
    """(version, user metadata) of a table's commits that carry some, oldest first (among the newest
    `limit`, if given), from its log."""
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    rows = (
        DeltaTable.forPath(spark, path)
        .history(limit)
        .where(F.col("userMetadata").isNotNull())
        .select("version", "userMetadata")
        .collect()
    )
    return sorted((int(row["version"]), str(row["userMetadata"])) for row in rows)


def newest_idle_mark(spark: SparkSession, mirror_path: str) -> Mark | None:
    """The newest idle mark of the mirror at `mirror_path` (`<warehouse>/<schema>/<table>`), None
    when it has none among the newest."""
    marks = idle_marks(spark, warehouse_of(mirror_path), RECENT_IDLE_COMMITS).get(table_key(mirror_path), [])
    return newest_mark(m.mark for m in marks)


def batch_applied(changes: DataFrame) -> int | None:
    """The newest source position among a batch's decoded changes (None: no change)."""
    from pyspark.sql import functions as F

    position = F.when(F.col(layout.OP) == F.lit("r"), F.col(layout.LSN) - F.lit(1)).otherwise(
        F.col(layout.LSN)
    )
    row = changes.agg(F.max(position).alias("applied")).head()
    return None if row is None or row["applied"] is None else int(row["applied"])


def marked_versions(spark: SparkSession, path: str, limit: int | None = None) -> list[Version]:
    """Every version of a table whose commit carries a mark, oldest first (within Delta's log
    retention, `delta.logRetentionDuration`, 30 days by default); among the newest `limit` commits
    only, if given."""
    marks = ((version, parse_mark(metadata)) for version, metadata in _user_metadata_of(spark, path, limit))
    return [Version(version, mark) for version, mark in marks if mark is not None]


class TableWatermark:
    """One table's watermark across a merge's batches (one instance per table and query)."""

    def __init__(
        self,
        path: str,
        history_path: str | None,
        topics: Iterable[str],
        decode: Callable[[bytes], dict[str, Any]],
    ) -> None:
        self.path = path
        self.decode = decode
        self.history_path = history_path
        self.topics = tuple(topics)
        self.progress = ProgressLog()
        self.mark: Mark | None = None
        self._previous = START
        self._stored_mark, self._stored_version = START, -1
        # The newest idle mark of the table (from the idle marks at start, then this merge's own):
        # the stored mark is no older than it.
        self.floor: Mark | None = None
        # The streaming checkpoint, where each batch's end offsets are; None: no watermark recorded.
        self.checkpoint: str | None = None

    def proven(self, control_records: Iterable[dict[str, Any]], ends: Offsets) -> Progress | None:
        """Take the batch's progress events; the newest its end offsets prove for this table."""
        self.progress.add(p for p in (progress_of(r) for r in control_records) if p is not None)
        return self.progress.proven(ends, self.topics)

    def batch(
        self,
        spark: SparkSession,
        batch_id: int,
        raw_control: Iterable[tuple[bytes | None, bytes | None]],
        changes: DataFrame | None,
        *,
        applied_changes: int | None = None,
    ) -> Mark | None:
        """`proven` then `begin` for one batch (None without a checkpoint): `raw_control` are its
        control records, `changes` its decoded changes of the table (None: none); its TRUNCATE and
        DDL events count as applied too. `applied_changes`, when `changes` is None: their newest
        position, already known (`BatchSummary.applied`: no Spark job)."""
        self.mark = None  # `finish` writes only a mark of this batch
        if self.checkpoint is None:
            return None
        ends = end_offsets(spark, self.checkpoint, batch_id)
        if ends is None:
            return None
        control_records = [self.decode(value) for _, value in raw_control if value is not None]
        proven = self.proven(control_records, ends)
        applied = newest(
            applied_changes if changes is None else batch_applied(changes),
            table_control_position(control_records, self.topics[0]),
        )
        return self.begin(spark, proven, applied)

    def begin(self, spark: SparkSession, proven: Progress | None, applied: int | None) -> Mark:
        """The mark the batch's commits carry: the stored one advanced by what this batch proves and
        applies. Stored, not remembered: a restored checkpoint or another process's run never makes
        it go back."""
        self._previous = newer(self._stored(spark), self.floor)
        self.mark = self._previous.advanced(proven, applied)
        return self.mark

    def _stored(self, spark: SparkSession) -> Mark:
        """`stored_mark`, read again only when the table has a new version (a property changes only
        with one): an idle table's batches then cost a listing of its log, not a replay of it."""
        version = delta_tables.newest_version(spark, self.path)
        if version != self._stored_version:
            self._stored_mark = stored_mark(spark, self.path) if version >= 0 else START
            self._stored_version = version
        return self._stored_mark

    def idle(
        self, spark: SparkSession, batch_id: int, raw_control: Iterable[tuple[bytes | None, bytes | None]]
    ) -> IdleMark | None:
        """The table's idle mark after a batch with nothing of it (None: its mark did not move, or
        there is no mirror yet): its current versions hold every transaction up to the mark."""
        mark = self.batch(spark, batch_id, raw_control, None)
        self.mark = None  # nothing for `finish` to write
        if (
            mark is None
            or mark == self._previous
            or mark.watermark == NO_POSITION
            or self._stored_version < 0
        ):
            return None  # (no mirror yet: nothing to read at the mark)
        history = -1 if self.history_path is None else delta_tables.newest_version(spark, self.history_path)
        self.floor = mark
        return IdleMark(table_key(self.path), self._stored_version, history if history >= 0 else None, mark)

    def finish(self, spark: SparkSession) -> None:
        """After the batch's commits: the property commit, if the mark moved and the mirror exists."""
        mark = self.mark
        if mark is None or mark.watermark == NO_POSITION or not delta_tables.table_exists(spark, self.path):
            return
        if mark == self._previous:
            return
        write_mark(spark, self.path, mark)
        if self.history_path is not None and delta_tables.table_exists(spark, self.history_path):
            write_mark(spark, self.history_path, mark)
        log.debug("%s: watermark %s, applied %s", self.path, mark.watermark, mark.applied)
