"""The steps of one table's slice of a merge batch, each the one owner of its part of the slice:

- `apply_ddl`: the DDL events (the table's DDL log, and columns added before any row has them);
- `remember_truncate`, `record_truncate`: the slice's TRUNCATE (remembered while there is no mirror,
  else the property the mirror starts after);
- `prepare_changes`, `prepare_mirror`: the changes to write, and the mirror created or evolved;
- `append_tombstones`: the deletes remembered; `merge_history`: the SCD type 2 history;
  `merge_mirror`: the mirror's MERGE.

Each is handed the slice (`SliceInput`: the batch, the table's state read once before the steps,
the commits' txn) and what it needs of the earlier steps, and returns what it did: none reads the
table's state again, none keeps anything between batches. `merge_batch.TableMerger` says in which
order they run. Every data commit is idempotent (txnAppId = query id + the slice's identity,
txnVersion = the batch id) and carries the batch's mark.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from spark_jobs.decoding import spark_envelope
from spark_jobs.lake import delta_tables, mirror_merge, watermark_io
from spark_jobs.lake.delta_tables import Txn
from spark_jobs.lake.mirror_merge import MergeSpec
from spark_jobs.lake.table_state import TableState
from spark_jobs.merging import batch_schema, ddl, scd2, truncates
from spark_jobs.merging.slice_decoding import DecodedBatch
from spark_jobs.merging.truncates import Truncate
from spark_jobs.rules import changes, key_range, layout, mirror_features
from spark_jobs.rules.key_range import KeyRange
from spark_jobs.rules.mirror_features import MirrorFeatures
from spark_jobs.rules.watermark import Mark

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)


@dataclass
class BatchResult:
    batch_id: int
    messages: int
    changes: int
    truncated_before: tuple[int, int] | None
    added_columns: list[str]


@dataclass(frozen=True)
class SliceInput:
    """What every step of a slice is handed: the batch, the table's state as the slice read it,
    and where the table's tables are."""

    spark: SparkSession
    batch_id: int
    summary: batch_schema.BatchSummary
    state: TableState
    truncate: Truncate | None
    location: layout.TableLocation
    warehouse: str
    features: MirrorFeatures
    query_id: str | None

    def txn(self, kind: str = "merge") -> Txn:
        """The idempotent marker of the slice's commits of `kind` (merge or ddl)."""
        return Txn(f"bottledwater-{kind}-{self.query_id}-{self.summary.identity()}", self.batch_id)


@dataclass(frozen=True)
class PreparedChanges:
    """The slice's changes ready for its writes: `carried`, every event with its TOAST values carried;
    `newest`, one change per key, without those before a TRUNCATE or older than a remembered delete
    (persisted: the caller unpersists it); `count` and `bounds`, its count and key range, from one
    aggregate; `effective`, the newest TRUNCATE the mirror starts after (this slice's or an earlier)."""

    keys: tuple[str, ...]
    data_columns: tuple[str, ...]
    toast: tuple[str, ...]
    carried: DataFrame
    newest: DataFrame
    count: int
    bounds: KeyRange | None
    effective: tuple[int, int] | None


def apply_ddl(at: SliceInput, decode: Callable[[bytes], dict[str, Any]]) -> list[str]:
    """The slice's DDL events (`--capture-ddl`) first: the table's DDL log, and the columns they add."""
    events = ddl.table_events(decode, at.location.topic, at.summary.control_records)
    mirror = at.state.paths.mirror
    return ddl.apply(
        at.spark,
        warehouse=at.warehouse,
        location=at.location,
        mirror_path=mirror,
        mirror_properties=at.state.properties if at.state.exists else None,
        events=events,
        txn=at.txn("ddl"),
    )


def remember_truncate(at: SliceInput) -> BatchResult:
    """A slice with no row of a table that has no mirror yet: its TRUNCATE, if any, is remembered.

    The mirror is not created here: without rows the batch carries no key schema (JSON not even
    field names), so the table would be created keyless, indistinguishable from an --allow-unkeyed
    one, and the registry's latest key schema is no substitute (a table that never had a row may
    have none, and JSON has no registry). There is nothing to delete yet, but changes older than the
    TRUNCATE may still arrive in later batches (another topic, a split backlog, a replay): its
    position is kept in the table's state and the mirror, once created, starts from it."""
    truncate, path = at.truncate, at.state.paths.pending_truncates
    if truncate is not None:
        assert path is not None, "the slice's state names where TRUNCATEs are remembered"
        truncates.remember(at.spark, path, truncate, at.txn())
        topic = at.location.topic
        log.info("%s: TRUNCATE at %s/%s before the first row, remembered", topic, *truncate.position)
    return BatchResult(at.batch_id, 0, 0, None if truncate is None else truncate.position, [])


def prepare_changes(at: SliceInput, decoded: DecodedBatch) -> PreparedChanges:
    """The slice's decoded events as the writes take them. An unkeyed table has no row identity to
    merge on (and its deletes are not published): its mirror keeps every event as a row, like its
    topic, identified by (lsn, seq), so that a replayed event is recognised and adds nothing."""
    from pyspark import StorageLevel

    position = None if at.truncate is None else at.truncate.position
    known = [p for p in (position, at.state.known_truncate) if p is not None]
    effective = max(known) if known else None
    keys = decoded.keys or (layout.LSN, layout.SEQ)
    typed = dict(decoded.columns)
    toast = tuple(c for c in at.summary.unchanged_columns if c in typed) if decoded.keys else ()
    carried = changes.carry_unchanged(decoded.frame, keys, list(toast))
    newest = changes.newest_per_key(changes.drop_truncated(carried, effective), keys)
    tombstones = at.state.paths.tombstones
    dead = (
        at.spark.read.format("delta").load(tombstones) if tombstones and at.state.tombstones_exist else None
    )
    newest = mirror_merge.drop_resurrections(dead, newest, keys).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        count, bounds = key_range.counted(newest, keys)
    except BaseException:
        newest.unpersist()
        raise
    columns = tuple(n for n, _ in decoded.columns)
    return PreparedChanges(keys, columns, toast, carried, newest, count, bounds, effective)


def prepare_mirror(at: SliceInput, decoded: DecodedBatch, *, check_features: bool) -> list[str]:
    """Create the mirror, or add the columns it lacks; returns the names of those added.
    `check_features`: say in a log line when the mirror's table features differ from the option's
    (kept, not refused: converting is a rewrite of every file, the operator's to start)."""
    from pyspark.sql.types import StructType

    state, path = at.state, at.state.paths.mirror
    keys, columns, decoded_schema = decoded.keys, decoded.columns, decoded.frame.schema
    meta = [(f.name, f.dataType) for f in decoded_schema.fields if f.name in layout.META_COLUMNS]
    wanted = [*columns, *meta]
    if not state.exists:
        # The metadata columns as the contract declares them (lsn, seq, op never null), whatever
        # nullability the decoding expressions carry.
        declared = {f.name: f for f in spark_envelope.META_FIELDS}
        schema = StructType([declared.get(name, decoded_schema[name]) for name, _ in wanted])
        created = {
            layout.KEY_PROPERTY: layout.encode_key_columns(keys),
            layout.SOURCE_PROPERTY: decoded.source_name,
            layout.TOPIC_PROPERTY: at.location.topic,
        }
        if state.pending_truncate is not None:
            # In the same commit as the table, so no later batch can see the table without it.
            created[layout.TRUNCATED_BEFORE_PROPERTY] = layout.format_position(*state.pending_truncate)
        delta_tables.create_table(at.spark, path, schema, created, at.features)
        return []
    have = mirror_features.of_table(state.properties)
    if check_features and have != at.features:
        log.warning(mirror_features.kept_message(path, have, at.features))
    stored_keys = layout.decode_key_columns(state.properties.get(layout.KEY_PROPERTY))
    if stored_keys and stored_keys != keys:
        raise delta_tables.SchemaEvolutionError(
            f"{at.location.topic}: the key is now {list(keys)}, the Delta table {path} was "
            f"built on {list(stored_keys)}: a new primary key needs the table rebuilt "
            "(drop it and its checkpoint)"
        )
    return delta_tables.add_missing_columns(at.spark, path, wanted, state.properties)


def record_truncate(at: SliceInput) -> tuple[int, int] | None:
    """The slice's TRUNCATE as the property the mirror starts after, when newer than the one it
    holds (the commit before the data commits, which carry the mark); returns its position."""
    position = None if at.truncate is None else at.truncate.position
    known = at.state.known_truncate
    if position is not None and (known is None or position > known):
        path, value = at.state.paths.mirror, layout.format_position(*position)
        delta_tables.set_property(at.spark, path, layout.TRUNCATED_BEFORE_PROPERTY, value)
    return position


def append_tombstones(at: SliceInput, prepared: PreparedChanges) -> None:
    """The slice's deletes, remembered against stale inserts of later batches."""
    path = at.state.paths.tombstones
    assert path is not None, "the slice's state names the tombstones table"
    spec = _spec(at, prepared, path, exists=at.state.tombstones_exist)
    mirror_merge.append_tombstones(at.spark, prepared.newest, spec)


def merge_history(at: SliceInput, prepared: PreparedChanges, mark: Mark | None) -> None:
    """The history's MERGE: every event of the slice, the versions a TRUNCATE of it ended kept."""
    path = at.state.paths.history
    assert path is not None, "a history merged where the merge keeps none"
    events = changes.drop_truncated(prepared.carried, at.state.known_truncate)
    spec = replace(
        _spec(at, prepared, path, exists=at.state.history_exists),
        truncated_at=None if at.truncate is None else at.truncate.commit_ts,
        # Its own range: its events hold keys that `newest` may not (resurrections).
        key_range=True,
        toast_from=at.state.paths.mirror,
    )
    with watermark_io.recording(at.spark, mark), delta_tables.deletion_vector_writes(at.spark, path):
        scd2.merge_history(at.spark, events, spec)


def merge_mirror(
    at: SliceInput, prepared: PreparedChanges, mark: Mark | None, *, added: list[str]
) -> BatchResult:
    """The mirror's MERGE (an append into a mirror this slice created: nothing to join with)."""
    path, position = at.state.paths.mirror, None if at.truncate is None else at.truncate.position
    spec = replace(
        _spec(at, prepared, path, exists=True),
        truncate=position if position == prepared.effective else None,
        target_empty=not at.state.exists,
        key_range=prepared.bounds,
    )
    with watermark_io.recording(at.spark, mark), delta_tables.deletion_vector_writes(at.spark, path):
        mirror_merge.merge_changes(at.spark, prepared.newest, spec)
    messages = at.summary.table_messages
    log.info("merged batch %s of %s: %s messages", at.batch_id, at.location.topic, messages)
    return BatchResult(at.batch_id, messages, prepared.count, position, added)


def _spec(at: SliceInput, prepared: PreparedChanges, path: str, *, exists: bool) -> MergeSpec:
    return MergeSpec(
        path,
        prepared.keys,
        prepared.data_columns,
        at.txn(),
        toast_columns=prepared.toast,
        truncate=None if at.truncate is None else at.truncate.position,
        exists=exists,
        features=at.features,
    )
