"""A mirror as of a source position it has not reached: its version plus its changelog tail.

A mirror version whose mark says `applied <= X` holds nothing after X and every transaction up to
its `watermark` W. The lake's changelog (`lake.changelog`) holds every transaction up to its head's
proven watermark, so for any X up to that head the table as of X is the version with the changelog's
changes at positions in (W, X] applied on top, the way the merge would apply them:

- the tail's events are decoded by the merge's own decoding (`TableMerger.decode`), unchanged TOAST
  values carried from earlier events of the key, events at or before the newest TRUNCATE up to X
  dropped, and the newest event per key kept (`rules.changes`);
- each key then takes the newer of the mirror's row and the tail's event, as the MERGE's (lsn, seq)
  guard does: a delete removes the row, an update keeps the mirror's value of a TOAST column it left
  unchanged, and a TRUNCATE in the tail removes every mirror row older than it.

Events in (W, applied] may be in the version already (a transaction split across batches): applying
them again is harmless, the newer-by-(lsn, seq) choice keeps whichever is newer. A stale event cannot
bring back a key the version deleted: a key's events lie in one partition in commit order, so an event
older than the version's delete was in the same or an earlier batch, not in the tail (the changelog
holds each record once, `changelog.read`).

Nothing is written: the result is a plan Spark runs when the frame is read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from kafka_contract import control
from spark_jobs.lake import changelog
from spark_jobs.merging import batch_schema, truncates
from spark_jobs.merging.merge_batch import MergeOptions, TableMerger
from spark_jobs.rules import changes, layout
from spark_jobs.rules.changes import newer_than
from spark_jobs.rules.names import quote

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

_MIRROR = "__bw_mirror"
_TAIL = "__bw_tail"


@dataclass(frozen=True)
class Tail:
    """A table's changelog records in (after, upto] and the control events that concern it."""

    records: DataFrame
    after: int
    upto: int


def position() -> Column:
    """A changelog row's source position, counted as the merge counts `applied`: a snapshot row shows
    the table just before its LSN."""
    from pyspark.sql import functions as F

    lsn = F.col(layout.LSN)
    return F.when((F.col(layout.OP) == F.lit("r")) & F.col("value").isNotNull(), lsn - F.lit(1)).otherwise(
        lsn
    )


def tails(
    spark: SparkSession,
    warehouse: str,
    afters: Mapping[str, int],
    control_topic: str,
    *,
    upto: int,
    version: int,
    output_format: str,
) -> dict[str, tuple[Tail, batch_schema.BatchSummary]]:
    """Several tables' changelog records at positions in (after, upto] (topic -> after, its
    version's watermark), as of changelog `version`, each with the control topic's table events
    (TRUNCATE, DDL; not the progress events), and their summaries: one read of the changelog and one
    aggregate for all (a summary per table would be a Spark job each). The control events are those
    of the widest range: a TRUNCATE at or before a table's own
    `after` is in its version already, so it removes nothing more, and it is older than every event
    of the tail."""
    from pyspark.sql import functions as F

    read = changelog.read(spark, warehouse, [*afters, control_topic], version, extra=(layout.LSN, layout.OP))
    after = F.element_at(F.create_map(*[F.lit(x) for t, a in afters.items() for x in (t, a)]), F.col("topic"))
    is_control = F.col("topic") == F.lit(control_topic)
    widest = (position() > F.lit(min(afters.values()))) & (position() <= F.lit(upto))
    not_progress = F.col("key") != F.lit(control.PROGRESS_KEY.encode())
    in_range = (position() > after) & (position() <= F.lit(upto))
    wanted = F.when(is_control, not_progress & F.coalesce(widest, F.lit(True))).otherwise(in_range)
    records = read.where(wanted).drop(layout.LSN, layout.OP)
    summaries, control_only = batch_schema.summarize_topics(records, control_topic, output_format)
    return {
        topic: (
            Tail(records.where((F.col("topic") == F.lit(topic)) | is_control), since, upto),
            summaries.get(topic, control_only),
        )
        for topic, since in afters.items()
    }


def with_tail(
    spark: SparkSession,
    mirror: DataFrame,
    tail: Tail,
    *,
    location: layout.TableLocation,
    options: MergeOptions,
    properties: dict[str, str],
    summary: batch_schema.BatchSummary,
) -> DataFrame:
    """The mirror frame (a version whose mark's watermark is `tail.after`) with the tail (`tails`,
    with its `summary`) applied, as of `tail.upto`; the mirror itself when the tail holds nothing of
    the table."""
    from pyspark.sql import functions as F

    merger = TableMerger(location, replace(options, changelog=False))
    truncate = truncates.newest_truncate(
        merger.control_decoder, location.topic, summary.control_records, at_most=tail.upto
    )
    if summary.table_messages == 0 and truncate is None:
        return mirror
    known = layout.parse_position(properties.get(layout.TRUNCATED_BEFORE_PROPERTY))
    if known is not None and known[0] > tail.upto:
        known = None  # a TRUNCATE after the position read: not in effect there
    cut = max(
        (p for p in (known, None if truncate is None else truncate.position) if p is not None), default=None
    )
    if truncate is not None:
        mirror = mirror.where(
            newer_than(F.col(layout.LSN), F.col(layout.SEQ), F.lit(truncate.lsn), F.lit(truncate.seq))
        )
    if summary.table_messages == 0:
        return mirror
    decoded = merger.decode(tail.records, summary, properties)
    keys = decoded.keys or (layout.LSN, layout.SEQ)
    toast = [c for c in summary.unchanged_columns if c in dict(decoded.columns)] if decoded.keys else []
    events = changes.carry_unchanged(decoded.frame, keys, toast)
    newest = changes.newest_per_key(changes.drop_truncated(events, cut), keys)
    return apply_tail(mirror, newest, keys=keys, toast=toast, columns=[n for n, _ in decoded.columns])


def apply_tail(
    mirror: DataFrame, newest: DataFrame, *, keys: Sequence[str], toast: Sequence[str], columns: Sequence[str]
) -> DataFrame:
    """Each key's newer of the mirror row and the tail's event (the MERGE's guard), deletes dropped."""
    from pyspark.sql import functions as F

    names = list(dict.fromkeys([*mirror.columns, *columns, *layout.META_COLUMNS]))
    joined = mirror.alias(_MIRROR).join(
        newest.alias(_TAIL),
        on=_conjunction([F.col(f"{_MIRROR}.{quote(k)}") == F.col(f"{_TAIL}.{quote(k)}") for k in keys]),
        how="full_outer",
    )

    def m(name: str) -> Column:
        return F.col(f"{_MIRROR}.{quote(name)}") if name in mirror.columns else F.lit(None)

    def t(name: str) -> Column:
        return F.col(f"{_TAIL}.{quote(name)}") if name in newest.columns else F.lit(None)

    has_tail = F.col(f"{_TAIL}.{quote(layout.LSN)}").isNotNull()
    has_mirror = F.col(f"{_MIRROR}.{quote(layout.LSN)}").isNotNull()
    tail_wins = has_tail & (
        ~has_mirror | newer_than(t(layout.LSN), t(layout.SEQ), m(layout.LSN), m(layout.SEQ))
    )
    unchanged = F.coalesce(t(layout.UNCHANGED), F.array().cast("array<string>"))
    picked = []
    for name in names:
        from_tail = t(name)
        if name in toast:
            from_tail = F.when(F.array_contains(unchanged, name), m(name)).otherwise(from_tail)
        key_column = name in keys
        value = (
            F.coalesce(t(name), m(name)) if key_column else F.when(tail_wins, from_tail).otherwise(m(name))
        )
        picked.append(value.alias(name))
    kept = ~(tail_wins & (t(layout.OP) == F.lit("d")))
    return joined.where(kept).select(*picked)


def _conjunction(parts: list[Column]) -> Column:
    condition = parts[0]
    for part in parts[1:]:
        condition = condition & part
    return condition
