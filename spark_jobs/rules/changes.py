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
from spark_jobs.rules.names import quote

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

_GONE = "gone"
_VALUE = "value"
_NEWEST = "__bw_newest"


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

    # The whole row as `struct(*)` and back with `newest.*`: two expressions whatever the width, not
    # two JVM calls per column (each table's plan of a consistent read builds this).
    newest = F.max_by(F.struct(F.col("*")), F.struct(F.col(layout.LSN), F.col(layout.SEQ)))
    return (
        events.groupBy(*[F.col(quote(k)) for k in keys])
        .agg(newest.alias(_NEWEST))
        .select(F.col(f"{_NEWEST}.*"))
    )
