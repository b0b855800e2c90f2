"""A mirror against its Postgres table, once: a keyed table's rows joined by key and hashed on both
sides (`rowhash`), a keyless one's compared as multisets of rows (`rules.multiset`); what differs is a
`TableDiff`, and what settling needs of it (the differing keys) a `Compared`."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from spark_jobs import options
from spark_jobs.lake import fingerprints
from spark_jobs.rules import layout, multiset
from spark_jobs.rules.names import quote

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, Row, SparkSession

DEFAULT_SHOWN_KEYS = options.DEFAULT_SHOWN_KEYS
DUPLICATE = "duplicate_in_delta"
KINDS = ("missing_in_delta", "extra_in_delta", "different", DUPLICATE)
# A table differing in more keys than this is not settled: a lake that far behind is not changes in
# flight, and the keys would have to be held in the driver.
MAX_SETTLE_KEYS = 100_000


@dataclass
class TableDiff:
    """A keyed table's lists hold keys; a keyless one's (`keyless`) hold rows, `×n` after a row off
    by n occurrences, and its counts count occurrences. `unreconcilable` says why the table could not
    be compared at all (then nothing else is filled in but `delta_rows`). `note`: how the lake side
    was read when not as usual, or why differences were not settled."""

    path: str
    source: str
    delta_rows: int = 0
    postgres_rows: int = 0
    missing_in_delta: list[str] = field(default_factory=list)
    extra_in_delta: list[str] = field(default_factory=list)
    different: list[str] = field(default_factory=list)
    duplicate_in_delta: list[str] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    keyless: bool = False
    unreconcilable: str | None = None
    # Per kind, the occurrences its listed rows stand for (a keyless table's); else one per key.
    shown_counts: dict[str, int] = field(default_factory=dict)
    note: str | None = None
    # Keys (rows) that differed at first and agreed once the lake reached the source's position.
    settled: int = 0

    @property
    def equal(self) -> bool:
        return self.unreconcilable is None and not any(self.counts.values())


@dataclass
class Compared:
    """One table's comparison, and what settling needs of it: the keys that differ (a keyless
    table's: its differing rows' hashes, with their text)."""

    diff: TableDiff
    spec: fingerprints.Comparable | None = None
    keys: list[str] = field(default_factory=list)
    rows: dict[int, str] = field(default_factory=dict)


def verify_table(
    spark: SparkSession,
    path: str,
    dsn: str,
    shown: int = DEFAULT_SHOWN_KEYS,
    frame: DataFrame | None = None,
) -> TableDiff:
    """The mirror at `path` (or `frame`, a read of it: a consistent read's) against its Postgres table,
    unsettled: run it with the source quiet."""
    return compare(spark, path, dsn, shown, frame, keep_keys=False).diff


def compare(
    spark: SparkSession, path: str, dsn: str, shown: int, frame: DataFrame | None, *, keep_keys: bool
) -> Compared:
    from pyspark.sql import functions as F

    spec = fingerprints.comparable(spark, path, dsn)
    lake_rows = spark.read.format("delta").load(path) if frame is None else frame
    if not spec.keys:
        return _compare_keyless(spark, path, dsn, spec, shown=shown, lake_rows=lake_rows, keep_keys=keep_keys)
    if not fingerprints.key_columns_present(spec):
        missing = [k for k in spec.keys if k not in spec.columns]
        return Compared(
            TableDiff(
                path,
                f"{spec.schema}.{spec.table}",
                unreconcilable=f"key column(s) {', '.join(missing)} not in both Postgres and Delta (renamed "
                "or dropped?): the rows cannot be matched by key",
            )
        )
    # Both sides once: the counts, the differing keys and the duplicates below are separate Spark
    # jobs, and each would otherwise read the mirror (through its changelog tail) and hash it again.
    lake_hashes = key_hashes(lake_rows, spec).cache()
    source_hashes = fingerprints.postgres_key_hashes(spark, dsn, spec).cache()
    lake, source = lake_hashes.alias("d"), source_hashes.alias("p")
    joined = lake.join(source, F.col("d.k") == F.col("p.k"), "full_outer").select(
        F.coalesce(F.col("d.k"), F.col("p.k")).alias("k"),
        F.when(F.col("d.k").isNull(), "missing_in_delta")
        .when(F.col("p.k").isNull(), "extra_in_delta")
        .when(F.col("d.h") != F.col("p.h"), "different")
        .alias("kind"),
    )
    # A key held by several Delta rows (a broken table) is reported once as a duplicate.
    duplicates = lake.groupBy("k").count().where("count > 1").select("k", F.lit(DUPLICATE).alias("kind"))
    differing = joined.where(F.col("kind").isNotNull()).unionByName(duplicates).distinct().cache()
    try:
        counts = {r["kind"]: r["count"] for r in differing.groupBy("kind").count().collect()}
        diff = TableDiff(path, f"{spec.schema}.{spec.table}", lake.count(), source.count())
        diff.counts = {kind: counts.get(kind, 0) for kind in KINDS}
        for row in differing.orderBy("kind", "k").limit(shown * len(KINDS)).collect():
            bucket: list[str] = getattr(diff, row["kind"])
            if len(bucket) < shown:
                bucket.append(row["k"])
        keys: list[str] = []
        if keep_keys and not diff.equal:
            keys = [r["k"] for r in differing.select("k").distinct().limit(MAX_SETTLE_KEYS + 1).collect()]
        return Compared(diff, spec, keys)
    finally:
        for cached in (differing, lake_hashes, source_hashes):
            cached.unpersist()


def verify_keyless(
    spark: SparkSession, path: str, dsn: str, spec: fingerprints.Comparable, shown: int = DEFAULT_SHOWN_KEYS
) -> TableDiff:
    """A table without a key: its rows as multisets on both sides, or the reason it cannot be."""
    lake_rows = spark.read.format("delta").load(path)
    return _compare_keyless(spark, path, dsn, spec, shown=shown, lake_rows=lake_rows, keep_keys=False).diff


def _compare_keyless(
    spark: SparkSession,
    path: str,
    dsn: str,
    spec: fingerprints.Comparable,
    *,
    shown: int,
    lake_rows: DataFrame,
    keep_keys: bool,
) -> Compared:
    from pyspark.sql import functions as F

    source = f"{spec.schema}.{spec.table}"
    # The mirror's own ops are the only record of what its topic carried (the worker publishes no
    # delete of an unkeyed table, and an update arrives as a row like an insert): reading the one
    # column is cheap, and settles whether a comparison by value means anything.
    ops = lake_rows.groupBy(F.coalesce(F.col(layout.OP), F.lit("?"))).count()
    op_counts = {str(r[0]): int(r[1]) for r in ops.collect()}
    reason = multiset.unreconcilable_reason(op_counts)
    if reason is not None:
        return Compared(TableDiff(path, source, sum(op_counts.values()), keyless=True, unreconcilable=reason))
    # The whole row is its identity: the per-key hashing with every column as the key gives each
    # row's hash (to match on) and its text (to show).
    whole_rows = dataclasses.replace(spec, keys=tuple(spec.columns))
    lake = per_row(key_hashes(lake_rows, whole_rows)).alias("d")
    pg = per_row(fingerprints.postgres_key_hashes(spark, dsn, whole_rows)).alias("p")
    in_delta, in_postgres = F.coalesce(F.col("d.n"), F.lit(0)), F.coalesce(F.col("p.n"), F.lit(0))
    rows = (
        lake.join(pg, F.col("d.h") == F.col("p.h"), "full_outer")
        .select(
            F.coalesce(F.col("d.h"), F.col("p.h")).alias("h"),
            # Shown as the side that holds more of it reads it.
            F.when(in_delta >= in_postgres, F.col("d.t")).otherwise(F.col("p.t")).alias("t"),
            in_delta.alias("d"),
            in_postgres.alias("p"),
        )
        .cache()
    )
    try:
        totals = rows.agg(F.sum("d"), F.sum("p")).first() or (0, 0)
        differing = rows.where(F.col("d") != F.col("p"))
        found = multiset.compare(_row_counts(differing.orderBy("t").toLocalIterator()), shown)
        kept: dict[int, str] = {}
        if keep_keys and not found.equal:
            pending = differing.select("h", "t").limit(MAX_SETTLE_KEYS + 1).collect()
            kept = {int(r["h"]): str(r["t"]) for r in pending}
    finally:
        rows.unpersist()
    diff = TableDiff(path, source, int(totals[0] or 0), int(totals[1] or 0), keyless=True)
    fill_keyless(diff, found)
    return Compared(diff, spec, rows=kept)


def fill_keyless(diff: TableDiff, found: multiset.MultisetDiff) -> None:
    diff.missing_in_delta, diff.extra_in_delta = found.missing_rows, found.extra_rows
    diff.counts = {kind: 0 for kind in KINDS}
    diff.counts.update(missing_in_delta=found.missing_in_delta, extra_in_delta=found.extra_in_delta)
    diff.shown_counts = {"missing_in_delta": found.missing_shown, "extra_in_delta": found.extra_shown}


def key_hashes(frame: DataFrame, spec: fingerprints.Comparable) -> DataFrame:
    """(k: the key as text, h: the row's hash) for every row of a read of the mirror (the hashing of
    `fingerprints.delta_key_hashes`, on any frame of the mirror's columns)."""
    from pyspark.sql import functions as F

    return fingerprints.frame_key_hashes(frame.select(*[F.col(quote(c)) for c in spec.columns]), spec)


def per_row(hashes: DataFrame) -> DataFrame:
    """(h, n: how often the row occurs, t: its text) from (k: the row's text, h: its hash)."""
    from pyspark.sql import functions as F

    return hashes.groupBy("h").agg(F.count(F.lit(1)).alias("n"), F.min("k").alias("t"))


def _row_counts(rows: Iterator[Row]) -> Iterator[multiset.RowCount]:
    for row in rows:
        yield multiset.RowCount(row["t"], row["d"], row["p"])
