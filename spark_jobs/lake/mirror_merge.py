"""The writes of a batch's changes to a mirror's tables: the guarded MERGE into the mirror, the
tombstones appended, and the stale changes they drop (`drop_resurrections`).

What one write is (its table, key, columns, TRUNCATE, txn, key range) is one value, `MergeSpec`,
shared with the history's MERGE (`merging.scd2`), so that the batch says it once and each write
takes what it needs of it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from spark_jobs.lake import delta_tables
from spark_jobs.lake.delta_tables import Txn, idempotent
from spark_jobs.rules import layout, mirror_features
from spark_jobs.rules.changes import newer_than
from spark_jobs.rules.key_range import KeyRange
from spark_jobs.rules.key_range import of_batch as key_range_of_batch
from spark_jobs.rules.mirror_features import MirrorFeatures
from spark_jobs.rules.names import column, quote

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

TARGET, SOURCE = "t", "s"


@dataclass(frozen=True)
class MergeSpec:
    """One write of a batch's changes into one table of the lake.

    truncate: a TRUNCATE of the batch that cuts the table (the rows or versions older than it end),
    truncated_at its commit time. txn: the commit's idempotent marker.

    exists: whether `path` holds the table already, as the batch read it once (None: asked here).
    target_empty: the caller knows the table holds no row (it created it in this batch). Every
    change is then an insert or a delete of nothing, so the non-deletes are appended: the MERGE's
    join with the target and its second pass cost about twice the append.

    key_range: bound the target by the batch's range of its leading key column
    (`key_range.of_batch`) in the condition, so that Delta skips the files whose key statistics lie
    outside it. No row outside it can match. Not with a TRUNCATE, which reads the whole table anyway.
    True: computed from the changes; a `KeyRange`: the caller's (`key_range.counted`); False or None:
    none.

    toast_from: the table whose current values stand in for TOAST columns an event left unchanged
    (the history takes them from the mirror); features: the table features of a table created here.
    """

    path: str
    keys: tuple[str, ...]
    data_columns: tuple[str, ...]
    txn: Txn
    toast_columns: tuple[str, ...] = ()
    truncate: tuple[int, int] | None = None
    truncated_at: datetime | None = None
    exists: bool | None = None
    target_empty: bool = False
    key_range: bool | KeyRange | None = True
    toast_from: str | None = None
    features: MirrorFeatures = mirror_features.DEFAULT

    def target_exists(self, spark: SparkSession) -> bool:
        if self.exists is not None:
            return self.exists
        return delta_tables.newest_version(spark, self.path) >= 0

    def bounds(self, changes: DataFrame) -> KeyRange | None:
        """The key range the write's condition holds (none with a TRUNCATE)."""
        if self.truncate is not None:
            return None
        if self.key_range is True:
            return key_range_of_batch(changes, self.keys)
        return self.key_range or None


def merge_changes(spark: SparkSession, changes: DataFrame, spec: MergeSpec) -> None:
    """MERGE one change per key into the mirror, guarded by (lsn, seq).

    delete when the incoming tombstone is newer; update when the incoming row is newer; insert a
    row whose key is absent; with a TRUNCATE in the batch, delete every unmatched row older than it.
    A mirror this batch created (`MergeSpec.target_empty`) takes an append instead.
    """
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    written = [*spec.data_columns, *layout.META_COLUMNS]
    if spec.target_empty:
        inserts = changes.where(F.col(layout.OP) != F.lit("d")).select(*[F.col(quote(n)) for n in written])
        with idempotent(spark, spec.txn):
            inserts.write.format("delta").mode("append").save(spec.path)
        return

    def t(name: str) -> Column:
        return F.col(column(TARGET, name))

    def s(name: str) -> Column:
        return F.col(column(SOURCE, name))

    on = conjunction([t(k) == s(k) for k in spec.keys])
    bounded = spec.bounds(changes)
    if bounded is not None:
        on = on & bounded.condition(TARGET)
    incoming_newer = newer_than(s(layout.LSN), s(layout.SEQ), t(layout.LSN), t(layout.SEQ))
    is_delete = s(layout.OP) == F.lit("d")
    toast = set(spec.toast_columns)
    update: dict[str, str | Column] = {}
    for name in written:
        if name in toast:
            keep = F.array_contains(F.coalesce(s(layout.UNCHANGED), F.array().cast("array<string>")), name)
            update[quote(name)] = F.when(keep, t(name)).otherwise(s(name))
        else:
            update[quote(name)] = s(name)
    insert: dict[str, str | Column] = {quote(name): s(name) for name in written}

    merge = (
        DeltaTable.forPath(spark, spec.path)
        .alias(TARGET)
        .merge(changes.alias(SOURCE), on)
        .whenMatchedDelete(condition=is_delete & incoming_newer)
        .whenMatchedUpdate(condition=~is_delete & incoming_newer, set=update)
        .whenNotMatchedInsert(condition=~is_delete, values=insert)
    )
    if spec.truncate is not None:
        lsn, seq = spec.truncate
        older = ~newer_than(t(layout.LSN), t(layout.SEQ), F.lit(lsn), F.lit(seq))
        merge = merge.whenNotMatchedBySourceDelete(condition=older)
    with idempotent(spark, spec.txn):
        merge.execute()


def append_tombstones(spark: SparkSession, changes: DataFrame, spec: MergeSpec) -> None:
    """Remember each deleted key with the delete's position in the tombstones table `spec.path`, so
    that a stale insert arriving later (another partition, an older checkpoint) cannot bring the row
    back.

    An append, not a MERGE: a key deleted again in a later batch gets a second row, and
    `drop_resurrections` asks whether any remembered delete is newer, which the duplicates do not
    change. A MERGE on the key would scan the whole tombstone table every batch to keep one row per
    key; the append writes only the batch's deletes. The duplicates last until
    `maintenance.prune_tombstones` removes them with the rest of their age.
    """
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    deletes = changes.where(F.col(layout.OP) == F.lit("d")).select(
        *[F.col(quote(k)) for k in spec.keys], F.col(layout.LSN), F.col(layout.SEQ), F.col(layout.COMMIT_TS)
    )
    if not spec.target_exists(spark):
        properties = {layout.KEY_PROPERTY: layout.encode_key_columns(spec.keys)}
        delta_tables.create_table(spark, spec.path, deletes.schema, properties, spec.features)
    # The table's own types: a key column widened in the source since (int -> bigint) is written as
    # the table holds it, as the MERGE's insert did, instead of failing the append's schema check.
    stored = DeltaTable.forPath(spark, spec.path).toDF().schema
    deletes = deletes.select(*[F.col(quote(f.name)).cast(f.dataType).alias(f.name) for f in stored.fields])
    with idempotent(spark, spec.txn):
        deletes.write.format("delta").mode("append").save(spec.path)


def drop_resurrections(dead: DataFrame | None, changes: DataFrame, keys: Sequence[str]) -> DataFrame:
    """Drop inserts and updates older than a remembered delete of the same key (an anti-join: a key
    may be remembered more than once, see `append_tombstones`). `dead`: the tombstones table's rows
    (None: there is none yet)."""
    from pyspark.sql import functions as F

    if dead is None:
        return changes
    dead_keys = [f"__bw_dead_key_{i}" for i in range(len(keys))]
    dead = dead.select(
        *[F.col(quote(k)).alias(d) for k, d in zip(keys, dead_keys, strict=True)],
        F.col(layout.LSN).alias("__bw_dead_lsn"),
        F.col(layout.SEQ).alias("__bw_dead_seq"),
    )
    same_key = conjunction([F.col(quote(k)) == F.col(d) for k, d in zip(keys, dead_keys, strict=True)])
    alive = newer_than(F.col(layout.LSN), F.col(layout.SEQ), F.col("__bw_dead_lsn"), F.col("__bw_dead_seq"))
    stale = same_key & (F.col(layout.OP) != F.lit("d")) & ~alive
    return changes.join(dead, on=stale, how="left_anti")


def conjunction(parts: Sequence[Column]) -> Column:
    result = parts[0]
    for part in parts[1:]:
        result = result & part
    return result
