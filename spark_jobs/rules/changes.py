"""A micro-batch of decoded events -> one change per key, ready to MERGE.

Three steps, in this order:
1. unchanged TOAST columns are filled from an earlier event of the same key in the batch (an update
   that leaves a TOASTed value alone follows the insert or update that carried it); the ones still
   unresolved keep the target's value in the MERGE;
2. events older than the newest TRUNCATE (from this batch or an earlier one) are dropped;
3. the newest event per key by (lsn, seq) is kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from spark_jobs.rules import layout
from spark_jobs.rules.names import quote, select

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

_GONE = "gone"
_VALUE = "value"
NEWEST = "__bw_newest"
# The newest event of a group, the whole row as one struct, by (lsn, seq).
_NEWEST_SQL = f"max_by(struct(*), struct({quote(layout.LSN)}, {quote(layout.SEQ)})) AS {quote(NEWEST)}"


def newer_than(lsn: Column, seq: Column, other_lsn: Column, other_seq: Column) -> Column:
    """(lsn, seq) > (other_lsn, other_seq); an unknown other position counts as older than any."""
    from pyspark.sql import functions as F

    return F.coalesce(
        (lsn > other_lsn) | ((lsn == other_lsn) & (seq > other_seq)),
        F.lit(True),
    )


def newer_than_sql(lsn: str, seq: str, other_lsn: str, other_seq: str) -> str:
    """`newer_than` as Spark SQL text over the given (quoted) column references: one expression the
    JVM parses, where the Column form is a round trip to it per operator."""
    return f"coalesce({lsn} > {other_lsn} OR ({lsn} = {other_lsn} AND {seq} > {other_seq}), true)"


def carry_unchanged(events: DataFrame, keys: Sequence[str], unchanged_columns: Sequence[str]) -> DataFrame:
    """Fill each unchanged TOAST column from the key's latest earlier event that carried it.

    A delete in between means the value is gone (never carried across it). Filled columns are removed
    from `_bw_unchanged`, so only the unresolved ones fall back to the target's value.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    if not unchanged_columns:
        return events
    earlier = (
        Window.partitionBy(*[F.col(quote(k)) for k in keys])
        .orderBy(F.col(layout.LSN), F.col(layout.SEQ))
        .rowsBetween(Window.unboundedPreceding, -1)
    )
    unchanged = F.coalesce(F.col(layout.UNCHANGED), F.array().cast("array<string>"))
    is_delete = F.col(layout.OP) == F.lit("d")
    filled = events
    resolved: list[Column] = []
    for name in unchanged_columns:
        value = F.col(quote(name))
        # A struct, so that a carried NULL is still a value and `ignorenulls` skips only "no value here".
        carried = F.last(
            F.when(
                is_delete,
                F.struct(
                    F.lit(True).alias(_GONE), F.lit(None).cast(events.schema[name].dataType).alias(_VALUE)
                ),
            ).when(
                ~F.array_contains(unchanged, name), F.struct(F.lit(False).alias(_GONE), value.alias(_VALUE))
            ),
            ignorenulls=True,
        ).over(earlier)
        marker = f"__bw_carried_{len(resolved)}"
        filled = filled.withColumn(marker, carried)
        can_fill = F.array_contains(unchanged, name) & F.col(marker).isNotNull() & ~F.col(f"{marker}.{_GONE}")
        filled = filled.withColumn(name, F.when(can_fill, F.col(f"{marker}.{_VALUE}")).otherwise(value))
        filled = filled.withColumn(
            layout.UNCHANGED,
            F.when(can_fill, F.array_remove(F.col(layout.UNCHANGED), name)).otherwise(
                F.col(layout.UNCHANGED)
            ),
        )
        resolved.append(F.col(marker))
    return filled.drop(*[f"__bw_carried_{i}" for i in range(len(resolved))])


def drop_truncated(events: DataFrame, truncated_before: tuple[int, int] | None) -> DataFrame:
    """Events at or before the newest TRUNCATE's position are stale: the TRUNCATE removed their rows."""
    from pyspark.sql import functions as F

    if truncated_before is None:
        return events
    lsn, seq = truncated_before
    return events.where(newer_than(F.col(layout.LSN), F.col(layout.SEQ), F.lit(lsn), F.lit(seq)))


def newest_per_key(events: DataFrame, keys: Sequence[str]) -> DataFrame:
    """One row per key: the event with the greatest (lsn, seq). Replayed copies are identical, so a
    tie picks either."""
    from pyspark.sql import functions as F

    return newest_per_key_nested(events, keys).select(F.col(f"{NEWEST}.*"))


def newest_per_key_nested(events: DataFrame, keys: Sequence[str]) -> DataFrame:
    """`newest_per_key` before the newest event is expanded into columns: a row per key of the key's
    columns, named `key_column(i)`, and `NEWEST`, the event as one struct. A join reads the struct's
    fields by name, sparing the projection that expands it (a plan step of every table a consistent
    read builds, each analyzed by the JVM)."""
    from pyspark.sql import functions as F

    # The whole row as `struct(*)`, and every expression as text: one JVM call each, whatever the
    # width, where Columns cost one per operator.
    grouped = events.groupBy(*[F.expr(text) for text in _grouping_sql(keys)])
    return grouped.agg(F.expr(_NEWEST_SQL))


def newest_per_key_nested_sql(events: str, keys: Sequence[str]) -> str:
    """`newest_per_key_nested` as one Spark SQL SELECT over the relation `events` (a quoted view name
    or a parenthesized query)."""
    grouping = [quote(k) for k in keys]
    return select([*_grouping_sql(keys), _NEWEST_SQL], events, group_by=grouping)


def drop_truncated_sql(events: str, truncated_before: tuple[int, int] | None) -> str:
    """`drop_truncated` over the relation `events`, as a relation (the relation itself when nothing
    was truncated)."""
    if truncated_before is None:
        return events
    lsn, seq = truncated_before
    newer = newer_than_sql(quote(layout.LSN), quote(layout.SEQ), str(lsn), str(seq))
    return f"({select(['*'], events, where=newer)})"


def _grouping_sql(keys: Sequence[str]) -> list[str]:
    return [f"{quote(k)} AS {quote(key_column(i))}" for i, k in enumerate(keys)]


def key_column(index: int) -> str:
    """The name of the `index`-th key column of `newest_per_key_nested`."""
    return f"__bw_key_{index}"
