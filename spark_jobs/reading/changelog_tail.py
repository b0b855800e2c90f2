"""A mirror as of a source position it has not reached: its version plus its changelog tail.

A mirror version whose mark says `applied <= X` holds nothing after X and every transaction up to
its `watermark` W. The lake's changelog (`lake.changelog`) holds every transaction up to its head's
proven watermark, so for any X up to that head the table as of X is the version with the changelog's
changes at positions in (W, X] applied on top, the way the merge would apply them:

- the tail's events are decoded by the merge's own decoding (`TableMerger.decode`, `decode_sql`),
  unchanged TOAST values carried from earlier events of the key, events at or before the newest
  TRUNCATE up to X dropped, and the newest event per key kept (`rules.changes`);
- each key then takes the newer of the mirror's row and the tail's event, as the MERGE's (lsn, seq)
  guard does: a delete removes the row, an update keeps the mirror's value of a TOAST column it left
  unchanged, and a TRUNCATE in the tail removes every mirror row older than it.

Events in (W, applied] may be in the version already (a transaction split across batches): applying
them again is harmless, the newer-by-(lsn, seq) choice keeps whichever is newer. A stale event cannot
bring back a key the version deleted: a key's events lie in one partition in commit order, so an event
older than the version's delete was in the same or an earlier batch, not in the tail (the changelog
holds each record once, `changelog.read`).

Nothing is written: the result is a plan Spark runs when the frame is read. Where the tail's
decoding is all text (Avro) and carries no TOAST column, the plan is one SQL statement the JVM
analyzes once (`with_tail`), else the same text applied step by step.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from kafka_contract import control
from spark_jobs.decoding import spark_envelope
from spark_jobs.lake import changelog
from spark_jobs.merge_options import MergeOptions
from spark_jobs.merging import batch_schema, truncates
from spark_jobs.merging.merge_batch import TableMerger
from spark_jobs.rules import changes, layout
from spark_jobs.rules.changes import newer_than_sql
from spark_jobs.rules.names import column, quote, select, string

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession


# Whether a key's tail event is newer than its mirror row (`_TailJoin`).
TAIL_WINS = "__bw_tail_wins"


@dataclass(frozen=True)
class Tail:
    """A table's changelog records in (after, upto] (its control events are in its summary) with
    their metadata columns, as a Spark SQL relation (over the view `tails` registers)."""

    relation: str
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


@contextmanager
def tails(
    spark: SparkSession,
    warehouse: str,
    afters: Mapping[str, int],
    control_topic: str,
    *,
    upto: int,
    version: int,
    output_format: str,
) -> Iterator[dict[str, tuple[Tail, batch_schema.BatchSummary]]]:
    """Several tables' changelog records at positions in (after, upto] (topic -> after, its
    version's watermark) with their metadata columns (`spark_envelope.with_metadata`), as of changelog
    `version`, and their summaries, which hold the control topic's table events (TRUNCATE, DDL; not
    the progress events): one read of the changelog and one aggregate for all (a summary per table
    would be a Spark job each). The control events are those of the widest range: a TRUNCATE at or
    before a table's own `after` is in its version already, so it removes nothing more, and it is
    older than every event of the tail.

    The records are also a temporary view while the block runs, which each tail's `relation` reads,
    so that a table's frame can be one SQL statement (`with_tail`). A frame built meanwhile keeps its
    plan after the view is dropped (PySpark's `spark.sql(text, frame=...)` works the same way)."""
    from pyspark.sql import functions as F

    read = changelog.read(spark, warehouse, [*afters, control_topic], version, extra=(layout.LSN, layout.OP))
    # One expression of text: a literal each as Columns is a JVM round trip per table.
    after = F.expr(f"element_at(map({', '.join(f'{string(t)}, {a}L' for t, a in afters.items())}), topic)")
    is_control = F.col("topic") == F.lit(control_topic)
    widest = (position() > F.lit(min(afters.values()))) & (position() <= F.lit(upto))
    not_progress = F.col("key") != F.lit(control.PROGRESS_KEY.encode())
    in_range = (position() > after) & (position() <= F.lit(upto))
    wanted = F.when(is_control, not_progress & F.coalesce(widest, F.lit(True))).otherwise(in_range)
    records = read.where(wanted).drop(layout.LSN, layout.OP)
    summaries, control_only = batch_schema.summarize_topics(records, control_topic, output_format)
    view = f"_bw_tails_{uuid.uuid4().hex}"
    # The tables' records with their metadata read from the headers once for all: in each table's
    # statement it was a sixth of the JVM's analysis (docs/lakehouse.md, "Many tables").
    spark_envelope.with_metadata(records.where(~is_control)).createOrReplaceTempView(view)
    try:
        yield {
            topic: (
                Tail(f"({select(['*'], quote(view), where=f'topic = {string(topic)}')})", since, upto),
                summaries.get(topic, control_only),
            )
            for topic, since in afters.items()
        }
    finally:
        spark.catalog.dropTempView(view)


@dataclass(frozen=True)
class MirrorVersion:
    """A mirror's version as a Spark SQL relation (`sql`: delta.`path` VERSION AS OF n) and its
    `columns`: the frame is built on the relation, so that the JVM resolves the version once (a
    sixth of a table's read) and, where the frame is one statement, analyzes the frame once."""

    sql: str
    columns: Sequence[str]


def with_tail(
    spark: SparkSession,
    mirror: MirrorVersion,
    tail: Tail,
    *,
    location: layout.TableLocation,
    options: MergeOptions,
    properties: dict[str, str],
    summary: batch_schema.BatchSummary,
) -> DataFrame:
    """The mirror's version (whose mark's watermark is `tail.after`) with the tail (`tails`, with its
    `summary`) applied, as of `tail.upto`; the mirror itself when the tail holds nothing of the
    table."""
    merger = TableMerger(location, replace(options, changelog=False))
    truncate = truncates.newest_truncate(
        merger.control_decoder, location.topic, summary.control_records, at_most=tail.upto
    )
    if summary.table_messages == 0 and truncate is None:
        return spark.sql(select(["*"], mirror.sql))
    known = layout.parse_position(properties.get(layout.TRUNCATED_BEFORE_PROPERTY))
    if known is not None and known[0] > tail.upto:
        known = None  # a TRUNCATE after the position read: not in effect there
    cut = max(
        (p for p in (known, None if truncate is None else truncate.position) if p is not None), default=None
    )
    # A TRUNCATE in the tail removes every mirror row older than it.
    relation = changes.drop_truncated_sql(mirror.sql, None if truncate is None else truncate.position)
    if summary.table_messages == 0:
        return spark.sql(select(["*"], relation))
    text = merger.decode_sql(tail.relation, summary, properties)
    if text is not None and not (set(summary.unchanged_columns) & {n for n, _ in text.columns}):
        # The whole frame as one statement, analyzed once: a read builds hundreds, and the JVM's
        # analysis of each plan step was most of a table's time (docs/lakehouse.md, "Many tables"). TOAST
        # carry-over (a window per column) and the formats not decoded as text take the steps below.
        kept = changes.drop_truncated_sql(f"({text.sql})", cut)
        newest = changes.newest_per_key_nested_sql(kept, text.keys)
        return spark.sql(
            apply_tail_sql(
                relation,
                mirror.columns,
                f"({newest})",
                tail_columns=text.names,
                keys=text.keys,
                columns=[n for n, _ in text.columns],
            )
        )
    decoded = merger.decode(spark.sql(select(["*"], tail.relation)), summary, properties)
    keys = decoded.keys or (layout.LSN, layout.SEQ)
    toast = [c for c in summary.unchanged_columns if c in dict(decoded.columns)] if decoded.keys else []
    events = changes.carry_unchanged(decoded.frame, keys, toast)
    newest_events = changes.newest_per_key_nested(changes.drop_truncated(events, cut), keys)
    return apply_tail(
        spark.sql(select(["*"], relation)),
        newest_events,
        tail_columns=events.columns,
        keys=keys,
        toast=toast,
        columns=[n for n, _ in decoded.columns],
    )


def apply_tail(
    mirror: DataFrame,
    newest: DataFrame,
    *,
    tail_columns: Sequence[str],
    keys: Sequence[str],
    toast: Sequence[str],
    columns: Sequence[str],
) -> DataFrame:
    """Each key's newer of the mirror row and the tail's event (the MERGE's guard), deletes dropped;
    `newest` is the tail's newest event per key as `changes.newest_per_key_nested` gives it, whose
    struct has the `tail_columns`.

    The join condition, the filter and every picked column are Spark SQL text (`_TailJoin`): a read
    applies a tail to hundreds of tables, and the JVM parses one expression in one round trip where
    building it with Columns is a round trip per operator (a third of a table's read,
    docs/lakehouse.md, "Many tables")."""
    from pyspark.sql import functions as F

    join = _TailJoin.of(mirror.columns, tail_columns, keys=keys, toast=toast, columns=columns)
    joined = mirror.join(newest, on=F.expr(join.on), how="full_outer")
    return joined.selectExpr("*", join.tail_wins).where(join.kept).selectExpr(*join.picked)


def apply_tail_sql(
    mirror: str,
    mirror_columns: Sequence[str],
    newest: str,
    *,
    tail_columns: Sequence[str],
    keys: Sequence[str],
    columns: Sequence[str],
) -> str:
    """`apply_tail` (no TOAST column) as one SELECT over the relations `mirror` (with the
    `mirror_columns`) and `newest` (`changes.newest_per_key_nested_sql`)."""
    join = _TailJoin.of(mirror_columns, tail_columns, keys=keys, toast=(), columns=columns)
    joined = select(["*", join.tail_wins], f"{mirror} FULL OUTER JOIN {newest} ON {join.on}")
    return select(join.picked, f"({joined})", where=join.kept)


@dataclass(frozen=True)
class _TailJoin:
    """The mirror joined to the tail's newest events (full outer, on the key): `tail_wins` names
    whether the tail's side is newer (a column of its own: every picked column reads it, and the JVM
    analyzed it once per column when each repeated it), `kept` where the newer side is not a delete,
    `picked` from the newer side.

    The mirror's columns are named unqualified and the tail's read from the struct: no alias on
    either side and no projection expanding the struct, each a plan the JVM analyzes. The other
    side's names are the `__bw_` ones the merge's own steps use (`changes`): a source column named
    so would collide there too."""

    on: str
    tail_wins: str
    kept: str
    picked: list[str]

    @classmethod
    def of(
        cls,
        mirror_columns: Sequence[str],
        tail_columns: Sequence[str],
        *,
        keys: Sequence[str],
        toast: Sequence[str],
        columns: Sequence[str],
    ) -> _TailJoin:
        in_mirror, in_tail = set(mirror_columns), set(tail_columns)
        names = list(dict.fromkeys([*mirror_columns, *columns, *layout.META_COLUMNS]))

        def m(name: str) -> str:
            return quote(name) if name in in_mirror else "NULL"

        def t(name: str) -> str:
            return column(changes.NEWEST, name) if name in in_tail else "NULL"

        on = " AND ".join(f"{m(k)} = {quote(changes.key_column(i))}" for i, k in enumerate(keys))
        wins = (
            f"({t(layout.LSN)} IS NOT NULL AND ({m(layout.LSN)} IS NULL"
            f" OR {newer_than_sql(t(layout.LSN), t(layout.SEQ), m(layout.LSN), m(layout.SEQ))}))"
        )
        tail_wins = quote(TAIL_WINS)
        unchanged = f"coalesce({t(layout.UNCHANGED)}, CAST(array() AS array<string>))"

        def picked(name: str) -> str:
            if name in keys:
                return f"coalesce({t(name)}, {m(name)}) AS {quote(name)}"
            from_tail = t(name)
            if name in toast:
                from_tail = (
                    f"CASE WHEN array_contains({unchanged}, {string(name)}) THEN {m(name)} ELSE {t(name)} END"
                )
            return f"CASE WHEN {tail_wins} THEN {from_tail} ELSE {m(name)} END AS {quote(name)}"

        kept = f"NOT ({tail_wins} AND {t(layout.OP)} = 'd')"
        return cls(on, f"{wins} AS {tail_wins}", kept, [picked(name) for name in names])
