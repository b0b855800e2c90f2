"""The optional SCD type 2 history table `<table>__history`: one row per version of each row.

A version starts at the change that wrote it (`__start_lsn`/`__start_seq`/`__start_at`) and ends at
the key's next change or delete, or at a TRUNCATE (`__end_*`, null while current). Versions are
identified by (key, __start_lsn, __start_seq), so replaying a batch matches the versions it wrote
instead of adding them again; all of a batch's changes land in one MERGE.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from spark_jobs.lake import delta_tables
from spark_jobs.lake.mirror_merge import MergeSpec, conjunction
from spark_jobs.rules import layout
from spark_jobs.rules.changes import newer_than
from spark_jobs.rules.key_range import KeyRange
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
    history: DataFrame | None,
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
    if history is not None:
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


def merge_history(spark: SparkSession, events: DataFrame, spec: MergeSpec) -> None:
    """MERGE a batch's events into the history table `spec.path` (created with `spec.features` when
    new). Its key range (`MergeSpec.bounds`): the history's files outside it are neither read nor
    joined, as for the mirror (docs/lakehouse.md, "The key range"); not with a TRUNCATE, which ends
    versions of every key."""
    bounds = spec.bounds(events)
    # A change the worker published twice (at-least-once, after a restart) must make one version,
    # not a zero-length one plus a duplicate; the copies are identical, so either may stay.
    events = events.dropDuplicates(list(dict.fromkeys([*spec.keys, layout.LSN, layout.SEQ])))
    exists = spec.target_exists(spark)
    if exists:
        # Before any frame reads the table: a portable table widens a column by a rewrite, and a
        # frame analysed before it would read the rewritten files with the old type.
        delta_tables.add_missing_columns(
            spark, spec.path, [(c, events.schema[c].dataType) for c in spec.data_columns]
        )
    if spec.truncate is None:
        history = spark.read.format("delta").load(spec.path) if exists else None
        events = _drop_unchanged(
            history, events, keys=spec.keys, data_columns=spec.data_columns, key_range=bounds
        )
    source = _versions_and_closers(spark, events, spec)
    schema = source.drop(_KIND).schema
    if not exists:
        properties = {layout.KEY_PROPERTY: layout.encode_key_columns(spec.keys)}
        delta_tables.create_table(spark, spec.path, schema, properties, spec.features)
    else:
        delta_tables.add_missing_columns(spark, spec.path, [(f.name, f.dataType) for f in schema.fields])
    _merge_versions(spark, source, spec, bounds)


def _versions_and_closers(spark: SparkSession, events: DataFrame, spec: MergeSpec) -> DataFrame:
    """The MERGE's source: a version per non-delete event, ended by the key's next event (or the
    batch's TRUNCATE), and a closer per key, which ends the key's open version at its first event."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    keys = spec.keys
    key_cols = [F.col(quote(k)) for k in keys]
    ordered = Window.partitionBy(*key_cols).orderBy(F.col(layout.LSN), F.col(layout.SEQ))
    with_next = (
        events.withColumn(END_LSN, F.lead(layout.LSN).over(ordered))
        .withColumn(END_SEQ, F.lead(layout.SEQ).over(ordered))
        .withColumn(END_AT, F.lead(layout.COMMIT_TS).over(ordered))
        .withColumn("__bw_first", F.row_number().over(ordered) == 1)
    )
    closer_end = [F.col(layout.LSN), F.col(layout.SEQ), F.col(layout.COMMIT_TS)]
    if spec.truncate is not None:
        with_next, closer_end = _cut_at_truncate(with_next, spec)
    versions = _fill_toast(spark, with_next.where(F.col(layout.OP) != F.lit("d")), spec)
    version_rows = versions.select(
        *[F.col(quote(c)) for c in spec.data_columns],
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
            for c in spec.data_columns
        ],
        F.lit(None).cast("bigint").alias(START_LSN),
        F.lit(None).cast("bigint").alias(START_SEQ),
        F.lit(None).cast("timestamp").alias(START_AT),
        closer_end[0].alias(END_LSN),
        closer_end[1].alias(END_SEQ),
        closer_end[2].alias(END_AT),
        F.lit(CLOSER).alias(_KIND),
    )
    return version_rows.unionByName(closers)


def _cut_at_truncate(with_next: DataFrame, spec: MergeSpec) -> tuple[DataFrame, list[Column]]:
    """A TRUNCATE in the batch ends every version that started before it and outlived it; a key
    whose first change in the batch follows it had its open version ended by it."""
    from pyspark.sql import functions as F

    assert spec.truncate is not None
    t_lsn, t_seq = spec.truncate
    at = F.lit(spec.truncated_at).cast("timestamp")
    started_before = ~newer_than(F.col(layout.LSN), F.col(layout.SEQ), F.lit(t_lsn), F.lit(t_seq))
    ends_after = F.col(END_LSN).isNull() | newer_than(
        F.col(END_LSN), F.col(END_SEQ), F.lit(t_lsn), F.lit(t_seq)
    )
    with_next = with_next.withColumn("__bw_cut", started_before & ends_after)
    for name, value in ((END_LSN, F.lit(t_lsn)), (END_SEQ, F.lit(t_seq)), (END_AT, at)):
        with_next = with_next.withColumn(name, F.when(F.col("__bw_cut"), value).otherwise(F.col(name)))
    after = ~started_before
    closer_end = [
        F.when(after, F.lit(t_lsn)).otherwise(F.col(layout.LSN)),
        F.when(after, F.lit(t_seq)).otherwise(F.col(layout.SEQ)),
        F.when(after, at).otherwise(F.col(layout.COMMIT_TS)),
    ]
    return with_next, closer_end


def _fill_toast(spark: SparkSession, versions: DataFrame, spec: MergeSpec) -> DataFrame:
    """The TOAST values an event left unchanged, taken from `spec.toast_from` (the mirror)."""
    from pyspark.sql import functions as F

    if not spec.toast_columns or spec.toast_from is None:
        return versions
    current = (
        spark.read.format("delta")
        .load(spec.toast_from)
        .select(
            *[F.col(quote(k)) for k in spec.keys],
            *[F.col(quote(c)).alias(f"__bw_cur_{i}") for i, c in enumerate(spec.toast_columns)],
        )
    )
    versions = versions.join(current, on=list(spec.keys), how="left")
    unchanged = F.coalesce(F.col(layout.UNCHANGED), F.array().cast("array<string>"))
    for i, name in enumerate(spec.toast_columns):
        versions = versions.withColumn(
            name,
            F.when(F.array_contains(unchanged, name), F.col(f"__bw_cur_{i}")).otherwise(F.col(quote(name))),
        )
    return versions


def _merge_versions(spark: SparkSession, source: DataFrame, spec: MergeSpec, bounds: KeyRange | None) -> None:
    """One MERGE of the versions and closers: a version is matched by its start (a replay adds
    nothing), a closer ends the key's open version older than it."""
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    def t(name: str) -> Column:
        return F.col(column("t", name))

    def s(name: str) -> Column:
        return F.col(column("s", name))

    same_key = conjunction([t(k) == s(k) for k in spec.keys])
    if bounds is not None:
        same_key = same_key & bounds.condition("t")
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
        DeltaTable.forPath(spark, spec.path)
        .alias("t")
        .merge(source.alias("s"), same_key & (same_version | closes))
        .whenMatchedUpdate(condition=is_version & s(END_LSN).isNotNull() & t(END_LSN).isNull(), set=end)
        .whenMatchedUpdate(condition=~is_version, set=end)
        .whenNotMatchedInsert(
            condition=is_version, values={quote(c): s(c) for c in source.drop(_KIND).columns}
        )
    )
    if spec.truncate is not None:
        lsn, seq = spec.truncate
        open_and_older = t(END_LSN).isNull() & ~newer_than(t(START_LSN), t(START_SEQ), F.lit(lsn), F.lit(seq))
        merge = merge.whenNotMatchedBySourceUpdate(
            condition=open_and_older,
            set={
                quote(END_LSN): F.lit(lsn),
                quote(END_SEQ): F.lit(seq),
                quote(END_AT): F.lit(spec.truncated_at).cast("timestamp"),
            },
        )
    with delta_tables.idempotent(spark, spec.txn):
        merge.execute()
