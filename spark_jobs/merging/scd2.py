"""The optional SCD type 2 history table `<table>__history`: one row per version of each row.

A version starts at the change that wrote it (`__start_lsn`/`__start_seq`/`__start_at`) and ends at
the key's next change or delete, or at a TRUNCATE (`__end_*`, null while current). Versions are
identified by (key, __start_lsn, __start_seq), so replaying a batch matches the versions it wrote
instead of adding them again; all of a batch's changes land in one MERGE.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from spark_jobs.lake import delta_tables
from spark_jobs.rules import layout, mirror_features
from spark_jobs.rules.changes import newer_than
from spark_jobs.rules.key_range import KeyRange
from spark_jobs.rules.mirror_features import MirrorFeatures
from spark_jobs.rules.names import column, quote

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import DataType

START_LSN, START_SEQ, START_AT = "__start_lsn", "__start_seq", "__start_at"
END_LSN, END_SEQ, END_AT = "__end_lsn", "__end_seq", "__end_at"
_KIND = "__bw_kind"
VERSION, CLOSER = "v", "c"


_VALUES, _PREV_VALUES, _FULL, _PREV_FULL, _HAS_PREV = (
    "__bw_values", "__bw_prev_values", "__bw_full", "__bw_prev_full", "__bw_has_prev",
)  # fmt: skip


def _holds_map(data_type: DataType) -> bool:
    """Maps (also inside arrays and structs) are not comparable in Spark; their JSON is."""
    return "map<" in data_type.simpleString()


def _comparable(name: str, data_type: DataType) -> Column:
    """The column in a form `<=>` can compare."""
    from pyspark.sql import functions as F

    col = F.col(quote(name))
    return F.to_json(col) if _holds_map(data_type) else col


def _drop_unchanged(
    spark: SparkSession,
    history_path: str,
    events: DataFrame,
    *,
    keys: Sequence[str],
    data_columns: Sequence[str],
    key_range: KeyRange | None = None,
) -> DataFrame:
    """Without the events that change no value of their row: as in Databricks AUTO CDC, a version
    starts only when a column changes. A re-snapshot's rows and `UPDATE ... SET x = x` repeat the
    row as it is. An event is compared with the one before it in the batch, the first of a key with
    the history version in effect at its position (not the open one: a replay after a checkpoint
    reset then finds the same answer). Deletes, and rows with unchanged TOAST values (whose values
    the event does not carry), always count as changes. `key_range`: the batch's keys lie in it, so
    only the history's files that overlap it are read."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    values = [c for c in data_columns if c not in keys]
    types = {f.name: f.dataType for f in events.schema.fields}
    carries_all = F.coalesce(F.size(F.col(layout.UNCHANGED)), F.lit(0)) <= 0
    ordered = Window.partitionBy(*[F.col(quote(k)) for k in keys]).orderBy(
        F.col(layout.LSN), F.col(layout.SEQ)
    )
    marked = (
        # (A key-only table compares an empty row: one constant field, as a struct needs one.)
        events.withColumn(
            _VALUES, F.struct(*[_comparable(c, types[c]).alias(c) for c in values], F.lit(0).alias("__bw_0"))
        )
        .withColumn(_FULL, (F.col(layout.OP) != F.lit("d")) & carries_all)
        .withColumn(_PREV_VALUES, F.lag(_VALUES).over(ordered))
        .withColumn(_PREV_FULL, F.lag(_FULL).over(ordered))
        .withColumn(_HAS_PREV, F.lag(layout.LSN).over(ordered).isNotNull())
    )
    repeats_previous = (
        F.col(_HAS_PREV) & F.col(_PREV_FULL) & F.col(_FULL) & F.col(_VALUES).eqNullSafe(F.col(_PREV_VALUES))
    )
    kept = marked.where(~repeats_previous)
    if delta_tables.table_exists(spark, history_path):
        history = spark.read.format("delta").load(history_path)
        if key_range is not None:
            history = history.alias("h").where(key_range.condition("h"))
        present = set(history.columns)
        in_effect = history.select(
            *[F.col(quote(k)) for k in keys],
            F.col(START_LSN).alias("__bw_h_start_lsn"),
            F.col(START_SEQ).alias("__bw_h_start_seq"),
            F.col(END_LSN).alias("__bw_h_end_lsn"),
            F.col(END_SEQ).alias("__bw_h_end_seq"),
            F.struct(
                *[
                    (
                        _comparable(c, types[c]).cast(_comparable_type(types[c]))
                        if c in present
                        else F.lit(None).cast(_comparable_type(types[c]))
                    ).alias(c)
                    for c in values
                ],
                F.lit(0).alias("__bw_0"),
            ).alias("__bw_h_values"),
        )
        firsts = marked.where(~F.col(_HAS_PREV) & F.col(_FULL)).select(
            *[F.col(quote(k)) for k in keys], F.col(layout.LSN), F.col(layout.SEQ), F.col(_VALUES)
        )
        lsn, seq = F.col(layout.LSN), F.col(layout.SEQ)
        unchanged_firsts = (
            firsts.join(in_effect, on=list(keys), how="inner")
            .where(
                ~newer_than(F.col("__bw_h_start_lsn"), F.col("__bw_h_start_seq"), lsn, seq)
                & newer_than(F.col("__bw_h_end_lsn"), F.col("__bw_h_end_seq"), lsn, seq)
                & F.col(_VALUES).eqNullSafe(F.col("__bw_h_values"))
            )
            .select(*[F.col(quote(k)) for k in keys], lsn, seq)
            .distinct()
        )
        kept = kept.join(unchanged_firsts, on=[*keys, layout.LSN, layout.SEQ], how="left_anti")
    return kept.drop(_VALUES, _PREV_VALUES, _FULL, _PREV_FULL, _HAS_PREV)


def _comparable_type(data_type: DataType) -> DataType:
    from pyspark.sql.types import StringType

    return StringType() if _holds_map(data_type) else data_type


def merge_history(
    spark: SparkSession,
    history_path: str,
    mirror_path: str,
    events: DataFrame,
    *,
    keys: Sequence[str],
    data_columns: Sequence[str],
    toast_columns: Sequence[str],
    truncate: tuple[int, int, datetime | None] | None,
    txn: delta_tables.Txn,
    key_range: KeyRange | None = None,
    features: MirrorFeatures = mirror_features.DEFAULT,
) -> None:
    """MERGE a batch's events into the history table (created with `features` when new). `key_range`:
    a range holding every key of `events` (`key_range.of_batch`): the history's files outside it are
    neither read nor joined, as for the mirror (docs/lakehouse.md, "The key range"); not with a
    TRUNCATE, which ends versions of every key."""
    from delta.tables import DeltaTable
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    # A change the worker published twice (at-least-once, after a restart) must make one version,
    # not a zero-length one plus a duplicate; the copies are identical, so either may stay.
    events = events.dropDuplicates(list(dict.fromkeys([*keys, layout.LSN, layout.SEQ])))
    if delta_tables.table_exists(spark, history_path):
        # Before any frame reads the table: a portable table widens a column by a rewrite, and a
        # frame analysed before it would read the rewritten files with the old type.
        delta_tables.add_missing_columns(
            spark, history_path, [(c, events.schema[c].dataType) for c in data_columns]
        )
    if truncate is None:
        events = _drop_unchanged(
            spark, history_path, events, keys=keys, data_columns=data_columns, key_range=key_range
        )
    key_cols = [F.col(quote(k)) for k in keys]
    ordered = Window.partitionBy(*key_cols).orderBy(F.col(layout.LSN), F.col(layout.SEQ))
    with_next = (
        events.withColumn(END_LSN, F.lead(layout.LSN).over(ordered))
        .withColumn(END_SEQ, F.lead(layout.SEQ).over(ordered))
        .withColumn(END_AT, F.lead(layout.COMMIT_TS).over(ordered))
        .withColumn("__bw_first", F.row_number().over(ordered) == 1)
    )
    closer_end = [F.col(layout.LSN), F.col(layout.SEQ), F.col(layout.COMMIT_TS)]
    if truncate is not None:
        # A TRUNCATE in the batch ends every version that started before it and outlived it.
        t_lsn, t_seq, t_at = truncate
        at = F.lit(t_at).cast("timestamp")
        started_before = ~newer_than(F.col(layout.LSN), F.col(layout.SEQ), F.lit(t_lsn), F.lit(t_seq))
        ends_after = F.col(END_LSN).isNull() | newer_than(
            F.col(END_LSN), F.col(END_SEQ), F.lit(t_lsn), F.lit(t_seq)
        )
        with_next = with_next.withColumn("__bw_cut", started_before & ends_after)
        for name, value in ((END_LSN, F.lit(t_lsn)), (END_SEQ, F.lit(t_seq)), (END_AT, at)):
            with_next = with_next.withColumn(name, F.when(F.col("__bw_cut"), value).otherwise(F.col(name)))
        # A key whose first change in the batch follows the TRUNCATE had its open version ended by it.
        after = ~started_before
        closer_end = [
            F.when(after, F.lit(t_lsn)).otherwise(F.col(layout.LSN)),
            F.when(after, F.lit(t_seq)).otherwise(F.col(layout.SEQ)),
            F.when(after, at).otherwise(F.col(layout.COMMIT_TS)),
        ]
    versions = with_next.where(F.col(layout.OP) != F.lit("d"))
    if toast_columns and delta_tables.table_exists(spark, mirror_path):
        current = (
            spark.read.format("delta")
            .load(mirror_path)
            .select(*key_cols, *[F.col(quote(c)).alias(f"__bw_cur_{i}") for i, c in enumerate(toast_columns)])
        )
        versions = versions.join(current, on=list(keys), how="left")
        unchanged = F.coalesce(F.col(layout.UNCHANGED), F.array().cast("array<string>"))
        for i, name in enumerate(toast_columns):
            versions = versions.withColumn(
                name,
                F.when(F.array_contains(unchanged, name), F.col(f"__bw_cur_{i}")).otherwise(
                    F.col(quote(name))
                ),
            )
    data = [F.col(quote(c)) for c in data_columns]
    version_rows = versions.select(
        *data,
        F.col(layout.LSN).alias(START_LSN),
        F.col(layout.SEQ).alias(START_SEQ),
        F.col(layout.COMMIT_TS).alias(START_AT),
        F.col(END_LSN),
        F.col(END_SEQ),
        F.col(END_AT),
        F.lit(VERSION).alias(_KIND),
    )
    closers = with_next.where(F.col("__bw_first")).select(
        *[
            F.col(quote(c)) if c in keys else F.lit(None).cast(events.schema[c].dataType).alias(c)
            for c in data_columns
        ],
        F.lit(None).cast("bigint").alias(START_LSN),
        F.lit(None).cast("bigint").alias(START_SEQ),
        F.lit(None).cast("timestamp").alias(START_AT),
        closer_end[0].alias(END_LSN),
        closer_end[1].alias(END_SEQ),
        closer_end[2].alias(END_AT),
        F.lit(CLOSER).alias(_KIND),
    )
    source = version_rows.unionByName(closers)
    if not delta_tables.table_exists(spark, history_path):
        schema = source.drop(_KIND).schema
        delta_tables.create_table(
            spark,
            history_path,
            schema,
            {layout.KEY_PROPERTY: layout.encode_key_columns(tuple(keys))},
            features,
        )
    else:
        delta_tables.add_missing_columns(
            spark, history_path, [(f.name, f.dataType) for f in source.drop(_KIND).schema.fields]
        )

    def t(name: str) -> Column:
        return F.col(column("t", name))

    def s(name: str) -> Column:
        return F.col(column("s", name))

    same_key = t(keys[0]) == s(keys[0])
    for k in keys[1:]:
        same_key = same_key & (t(k) == s(k))
    if key_range is not None and truncate is None:
        same_key = same_key & key_range.condition("t")
    is_version = s(_KIND) == F.lit(VERSION)
    same_version = is_version & (t(START_LSN) == s(START_LSN)) & (t(START_SEQ) == s(START_SEQ))
    closes = (
        (s(_KIND) == F.lit(CLOSER))
        & t(END_LSN).isNull()
        & newer_than(s(END_LSN), s(END_SEQ), t(START_LSN), t(START_SEQ))
    )
    end: dict[str, str | Column] = {
        quote(END_LSN): s(END_LSN),
        quote(END_SEQ): s(END_SEQ),
        quote(END_AT): s(END_AT),
    }
    merge = (
        DeltaTable.forPath(spark, history_path)
        .alias("t")
        .merge(source.alias("s"), same_key & (same_version | closes))
        .whenMatchedUpdate(condition=is_version & s(END_LSN).isNotNull() & t(END_LSN).isNull(), set=end)
        .whenMatchedUpdate(condition=~is_version, set=end)
        .whenNotMatchedInsert(
            condition=is_version, values={quote(c): s(c) for c in source.drop(_KIND).columns}
        )
    )
    if truncate is not None:
        lsn, seq, truncated_at = truncate
        open_and_older = t(END_LSN).isNull() & ~newer_than(t(START_LSN), t(START_SEQ), F.lit(lsn), F.lit(seq))
        merge = merge.whenNotMatchedBySourceUpdate(
            condition=open_and_older,
            set={
                quote(END_LSN): F.lit(lsn),
                quote(END_SEQ): F.lit(seq),
                quote(END_AT): F.lit(truncated_at).cast("timestamp"),
            },
        )
    with delta_tables.idempotent(spark, txn):
        merge.execute()
