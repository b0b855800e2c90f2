"""The watermark's I/O: a batch's end offsets from the streaming checkpoint, the mark recorded with
every merge commit (user metadata) and as a table property, the idle marks of the tables a batch
had nothing of (one commit per batch in `<warehouse>/_bw_state/_merge/idle_marks`), and the marks
read back from a table's history and the idle marks. The logic is `spark_jobs.rules.watermark`.

`TableWatermark` is what a merge batch calls: `begin` before its commits (the mark they carry),
`finish` after them (the mark commit: the property), or `idle` for a table with nothing in the
batch of the one merge query (its mark for the idle marks, no commit of its own). A batch that only
proves again, later, what every table already holds (an idle source) writes no commit at all: its
marks with the newer proof time go to the query's proof file (`write_proofs`), read with the idle
marks."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from spark_jobs.lake import delta_tables
from spark_jobs.rules import layout
from spark_jobs.rules.watermark import (
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
    marked_in,
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
# An idle table's newest versions are read again at least this often, though no batch of the query
# wrote it: a maintenance commit (OPTIMIZE) makes a newer version, which its marks must name before
# VACUUM removes the files only the older one reads.
STATE_MAX_AGE_S = 600.0


def end_offsets(spark: SparkSession, checkpoint: str, batch_id: int) -> dict[tuple[str, int], int] | None:
    """The offsets a micro-batch reads up to, as its checkpoint planned them (written before the batch
    runs), through Hadoop's file system so that any checkpoint location works (s3a://, file:). None
    when Spark no longer keeps the file (a parked slice replayed long after its batch). Read for every
    batch, not kept: a checkpoint restored from an older copy replans the same batch ids anew."""
    path, fs = hadoop_path(spark, f"{checkpoint.rstrip('/')}/offsets/{batch_id}")
    if not fs.exists(path):
        return None
    return spark_end_offsets(_read_text(spark, fs, path))


def hadoop_path(spark: SparkSession, location: str) -> tuple[Any, Any]:
    """A Hadoop Path and its file system (any URI scheme the session can reach)."""
    jvm: Any = spark.sparkContext._jvm
    path = jvm.org.apache.hadoop.fs.Path(location)
    return path, path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())


def _read_text(spark: SparkSession, fs: Any, path: Any) -> str:
    jvm: Any = spark.sparkContext._jvm
    stream = fs.open(path)
    try:
        return str(jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8"))
    finally:
        stream.close()


def write_text(spark: SparkSession, location: str, name: str, text: str) -> tuple[Any, Any]:
    """`text` as the file `name` of the directory `location`, written under a hidden name and renamed,
    so that a reader sees a whole file or none; returns the directory's Hadoop Path and file system."""
    directory, fs = hadoop_path(spark, location)
    jvm: Any = spark.sparkContext._jvm
    target = jvm.org.apache.hadoop.fs.Path(directory, name)
    hidden = jvm.org.apache.hadoop.fs.Path(directory, f".{name}.tmp")
    stream = fs.create(hidden, True)
    try:
        stream.write(bytearray(text.encode()))
    finally:
        stream.close()
    fs.delete(target, False)  # Hadoop's rename does not replace
    if not fs.rename(hidden, target):
        raise OSError(f"could not rename {hidden} to {target}: is {location} writable?")
    return directory, fs


def read_text(spark: SparkSession, location: str) -> str | None:
    """The text of the file at `location`, None when there is none."""
    path, fs = hadoop_path(spark, location)
    return _read_text(spark, fs, path) if fs.exists(path) else None


def write_proofs(
    spark: SparkSession, warehouse: str, query_id: str, batch_id: int, marks: list[IdleMark]
) -> None:
    """The query's newest proof of unchanged marks: a batch that proved only positions its tables
    already held, later (an idle source), writes their marks with the new `at` to one small file
    (`layout.proof_file_name`) instead of a Delta commit, then removes the query's older files.
    Written under a hidden name and renamed, so a reader sees a whole file or none; losing one only
    makes the lag read older (the marks themselves are in the tables' commits and the idle marks)."""
    name = layout.proof_file_name(query_id, batch_id)
    directory, fs = write_text(spark, layout.proofs_path(warehouse), name, idle_metadata(marks))
    for status in fs.listStatus(directory):
        other = str(status.getPath().getName())
        if other != name and layout.is_proof_file(other) and other.startswith(f"{query_id}."):
            fs.delete(status.getPath(), False)


def proof_marks(spark: SparkSession, warehouse: str) -> list[IdleMark]:
    """The marks of every query's newest proof file in the warehouse ([] when there is none)."""
    directory, fs = hadoop_path(spark, layout.proofs_path(warehouse))
    if not fs.exists(directory):
        return []
    marks: list[IdleMark] = []
    for status in fs.listStatus(directory):
        if layout.is_proof_file(str(status.getPath().getName())):
            try:
                marks += parse_idle(_read_text(spark, fs, status.getPath()))
            except Exception:  # removed between the listing and the read: a newer one replaced it
                log.debug("proof file %s went away while read", status.getPath())
    return marks


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
    if delta_tables.newest_version(spark, path) < 0:
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
    delta_tables.create_table(spark, path, StructType([StructField("batch_id", LongType())]), {})
    with _user_metadata(spark, idle_metadata(marks)):
        delta_tables.set_property(spark, path, IDLE_BATCH_PROPERTY, str(batch_id))


def idle_marks(spark: SparkSession, warehouse: str, limit: int | None = None) -> dict[str, list[IdleMark]]:
    """The idle marks of the warehouse by table key, oldest first (among the newest `limit` commits,
    if given), then the marks of the queries' newest proofs (`write_proofs`)."""
    path = layout.idle_marks_path(warehouse)
    proofs = proof_marks(spark, warehouse)
    committed = delta_tables.commit_metadata(spark, path, limit)
    return by_table([m for _, metadata in committed for m in parse_idle(metadata)] + proofs)


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
    return marked_in(delta_tables.commit_metadata(spark, path, limit))


@dataclass(frozen=True)
class BatchMark:
    """A batch's step of a table's mark: `previous`, what the table held before (its stored mark, or
    its idle floor if newer), and `mark`, what the batch's commits carry."""

    previous: Mark
    mark: Mark

    @property
    def moved(self) -> bool:
        """Whether a position moved, so that the mark commit (`TableWatermark.finish`) is due: a later
        proof of the same positions rides on the batch's data commits, if any."""
        return self.mark.watermark != NO_POSITION and not self.mark.same_positions(self.previous)


@dataclass(frozen=True)
class IdleStep:
    """What a batch with nothing of a table did to its mark: `moved`, a position moved (recorded in
    the idle-marks commit); else the same positions were proven again, later (a proof file)."""

    mark: IdleMark
    moved: bool


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
        # The newest idle mark of the table (from the idle marks at start, then this merge's own):
        # the stored mark is no older than it.
        self.floor: Mark | None = None
        # What the table's newest versions hold, while no batch of this query wrote it: read once
        # (`_current`, and every STATE_MAX_AGE_S), so that batches with nothing of the table cost no
        # I/O of it.
        self._state: IdleMark | None = None
        self._state_read = 0.0
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
        stored: Mark,
        applied_changes: int | None = None,
    ) -> BatchMark | None:
        """`proven` then `begin` for one batch (None without a checkpoint): `raw_control` are its
        control records, `changes` its decoded changes of the table (None: none), `stored` the mark
        the table holds as the batch read it (`table_state`); its TRUNCATE and DDL events count as
        applied too. `applied_changes`, when `changes` is None: their newest position, already known
        (`BatchSummary.applied`: no Spark job)."""
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
        return self.begin(stored, proven, applied)

    def begin(self, stored: Mark, proven: Progress | None, applied: int | None) -> BatchMark:
        """The mark the batch's commits carry: the stored one advanced by what this batch proves and
        applies. Stored, not remembered: a restored checkpoint or another process's run never makes
        it go back."""
        self._state = None  # the batch may write the table: read it again when it is idle next
        previous = newer(stored, self.floor)
        return BatchMark(previous, previous.advanced(proven, applied))

    def _current(self, spark: SparkSession) -> IdleMark | None:
        """The table's newest versions and the mark they hold (None: no mirror yet), read from the
        lake when unknown (the query's first batch of the table, or after a batch that wrote it) or
        older than STATE_MAX_AGE_S."""
        if self._state is None or time.monotonic() - self._state_read > STATE_MAX_AGE_S:
            self._state_read = time.monotonic()
            version = delta_tables.newest_version(spark, self.path)
            if version < 0:
                return None
            stored = parse_mark(delta_tables.table_properties(spark, self.path).get(WATERMARK_PROPERTY))
            history = (
                -1 if self.history_path is None else delta_tables.newest_version(spark, self.history_path)
            )
            self._state = IdleMark(
                table_key(self.path),
                version,
                history if history >= 0 else None,
                newer(stored or START, self.floor),
            )
        return self._state

    def idle(
        self, spark: SparkSession, control_records: Sequence[dict[str, Any]], ends: Offsets
    ) -> IdleStep | None:
        """The table's step after a batch with nothing of it (its decoded control records, its end
        offsets): None when its mark did not change (or there is no mirror yet: nothing to read at
        the mark). A batch that proves only what the table already holds costs no I/O of the table;
        one that moves its watermark reads the table's newest versions first (another run may have
        written it since)."""
        current = self._current(spark)
        proven = self.proven(control_records, ends)
        if current is None or proven is None:
            return None
        mark = current.mark.advanced(proven, None)
        if mark == current.mark or mark.watermark == NO_POSITION:
            return None
        moved = not mark.same_positions(current.mark)
        if moved:
            self._state = None
            current = self._current(spark)
            if current is None:
                return None
            mark = current.mark.advanced(proven, None)
        self._state = replace(current, mark=mark)
        self.floor = newer(mark, self.floor)
        return IdleStep(self._state, moved)

    def finish(
        self, spark: SparkSession, step: BatchMark | None, *, mirror_exists: bool, history_exists: bool
    ) -> Mark | None:
        """After the batch's commits: the mark commit (the property, on the mirror and its history as
        they exist after the batch), if a position moved; returns the mark written."""
        if step is None or not step.moved or not mirror_exists:
            return None
        write_mark(spark, self.path, step.mark)
        if self.history_path is not None and history_exists:
            write_mark(spark, self.history_path, step.mark)
        log.debug("%s: watermark %s, applied %s", self.path, step.mark.watermark, step.mark.applied)
        return step.mark
