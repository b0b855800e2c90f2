"""Verify: every mirror under a warehouse against its Postgres table; prints the rows that differ.

Each row is hashed on both sides (see `rowhash`). A keyed table's rows are joined by key and reported
as missing in Delta, extra in Delta, or different. A table without a key (`--allow-unkeyed`) is
compared as a multiset of rows, duplicates counted (`rules.multiset`), while its mirror is insert-only;
one whose topic carried updates cannot be compared by value and is reported so in one line.

The lake side is its freshest consistent state (`reading.consistent.read_consistent`: the mirrors plus
the changelog's tail, all tables at one source position), what a reader of the lake gets. A source
that is written to runs ahead of it, so the keys that differ are settled, as CDC users check a live
replica: Postgres is read again for those keys only, the WAL position after that read noted (every
transaction the read saw committed before it), and once the lake proves that position they are read
there, so both sides show the same transactions; keys that agree are dropped, and only differences
that persist for `--settle-seconds` are reported. A mirror that holds commits the merge did not write
(by hand, say) is compared as it is, unsettled.

Exit status: 0 when every table is equal; 1 when any table differs or cannot be compared, or when the
warehouse holds no mirror (2: a usage error, as argparse exits).

    spark-submit --py-files bottledwater.zip spark_jobs/verify.py --warehouse /lake --postgres postgres://...
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from shared_connections.spark_session import build_session
from spark_jobs import option_parser, options
from spark_jobs.connections import postgres_connect, postgres_rows
from spark_jobs.errors import ConfigurationError
from spark_jobs.job_main import exit_on_error
from spark_jobs.lake import delta_tables, fingerprints, warehouse
from spark_jobs.rules import layout, multiset
from spark_jobs.rules.names import quote
from spark_jobs.rules.rowhash import RowHasher, key_text

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, Row, SparkSession

    from spark_jobs.reading.result import ConsistentRead

DEFAULT_SHOWN_KEYS = options.DEFAULT_SHOWN_KEYS
DEFAULT_SETTLE_S = options.DEFAULT_SETTLE_S
DUPLICATE = "duplicate_in_delta"
KINDS = ("missing_in_delta", "extra_in_delta", "different", DUPLICATE)
# Between looks at the lake's position while settling (a look is a consistent read, about a second).
POLL_S = 1.0
# While waiting, a line every this many seconds says where the lake is.
SAY_EVERY_S = 10.0
# A table differing in more keys than this is not settled: a lake that far behind is not changes in
# flight, and the keys would have to be held in the driver.
MAX_SETTLE_KEYS = 100_000
# Delta operations that change a mirror's rows: one of these in a commit without the merge's mark
# was written by something else (a hand-made fix, a test), which a consistent read does not see.
DATA_OPERATIONS = frozenset(
    {
        "WRITE",
        "DELETE",
        "UPDATE",
        "MERGE",
        "STREAMING UPDATE",
        "RESTORE",
        "TRUNCATE",
        "CREATE OR REPLACE TABLE AS SELECT",
        "REPLACE TABLE AS SELECT",
    }
)
Say = Callable[[str], None]


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
class _Compared:
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
    return _compare(spark, path, dsn, shown, frame, keep_keys=False).diff


def _compare(
    spark: SparkSession, path: str, dsn: str, shown: int, frame: DataFrame | None, *, keep_keys: bool
) -> _Compared:
    from pyspark.sql import functions as F

    spec = fingerprints.comparable(spark, path, dsn)
    lake_rows = spark.read.format("delta").load(path) if frame is None else frame
    if not spec.keys:
        return _compare_keyless(spark, path, dsn, spec, shown=shown, lake_rows=lake_rows, keep_keys=keep_keys)
    if not fingerprints.key_columns_present(spec):
        missing = [k for k in spec.keys if k not in spec.columns]
        return _Compared(
            TableDiff(
                path,
                f"{spec.schema}.{spec.table}",
                unreconcilable=f"key column(s) {', '.join(missing)} not in both Postgres and Delta (renamed "
                "or dropped?): the rows cannot be matched by key",
            )
        )
    lake = _key_hashes(lake_rows, spec).alias("d")
    source = fingerprints.postgres_key_hashes(spark, dsn, spec).alias("p")
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
        return _Compared(diff, spec, keys)
    finally:
        differing.unpersist()


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
) -> _Compared:
    from pyspark.sql import functions as F

    source = f"{spec.schema}.{spec.table}"
    # The mirror's own ops are the only record of what its topic carried (the worker publishes no
    # delete of an unkeyed table, and an update arrives as a row like an insert): reading the one
    # column is cheap, and settles whether a comparison by value means anything.
    ops = lake_rows.groupBy(F.coalesce(F.col(layout.OP), F.lit("?"))).count()
    op_counts = {str(r[0]): int(r[1]) for r in ops.collect()}
    reason = multiset.unreconcilable_reason(op_counts)
    if reason is not None:
        return _Compared(
            TableDiff(path, source, sum(op_counts.values()), keyless=True, unreconcilable=reason)
        )
    # The whole row is its identity: the per-key hashing with every column as the key gives each
    # row's hash (to match on) and its text (to show).
    whole_rows = dataclasses.replace(spec, keys=tuple(spec.columns))
    lake = _per_row(_key_hashes(lake_rows, whole_rows)).alias("d")
    pg = _per_row(fingerprints.postgres_key_hashes(spark, dsn, whole_rows)).alias("p")
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
    _fill_keyless(diff, found)
    return _Compared(diff, spec, rows=kept)


def _fill_keyless(diff: TableDiff, found: multiset.MultisetDiff) -> None:
    diff.missing_in_delta, diff.extra_in_delta = found.missing_rows, found.extra_rows
    diff.counts = {kind: 0 for kind in KINDS}
    diff.counts.update(missing_in_delta=found.missing_in_delta, extra_in_delta=found.extra_in_delta)
    diff.shown_counts = {"missing_in_delta": found.missing_shown, "extra_in_delta": found.extra_shown}


def _key_hashes(frame: DataFrame, spec: fingerprints.Comparable) -> DataFrame:
    """(k: the key as text, h: the row's hash) for every row of a read of the mirror (the hashing of
    `fingerprints.delta_key_hashes`, on any frame of the mirror's columns)."""
    from pyspark.sql import functions as F

    return fingerprints.frame_key_hashes(frame.select(*[F.col(quote(c)) for c in spec.columns]), spec)


def _per_row(hashes: DataFrame) -> DataFrame:
    """(h, n: how often the row occurs, t: its text) from (k: the row's text, h: its hash)."""
    from pyspark.sql import functions as F

    return hashes.groupBy("h").agg(F.count(F.lit(1)).alias("n"), F.min("k").alias("t"))


def _row_counts(rows: Iterator[Row]) -> Iterator[multiset.RowCount]:
    for row in rows:
        yield multiset.RowCount(row["t"], row["d"], row["p"])


def verify_warehouse(
    spark: SparkSession,
    root: str,
    dsn: str,
    tables: Sequence[str] = (),
    shown: int = DEFAULT_SHOWN_KEYS,
    *,
    settle_s: float = 0.0,
    say: Say | None = None,
) -> list[TableDiff]:
    """Every mirror under `root` (or only `tables`, as schema.table safe names), read as the lake's
    freshest consistent state, its differing keys settled for up to `settle_s` seconds (0: none).
    `say` gets the progress lines."""
    tell: Say = say or (lambda _line: None)
    locations = warehouse.list_tables(spark, root)
    if tables:
        locations = [t for t in locations if t.qualified_safe_name in set(tables)]
    names = [t.qualified_safe_name for t in locations]
    read = _first_read(spark, root, names, tell) if names else None
    compared: dict[str, _Compared] = {}
    for number, location in enumerate(locations, 1):
        path, name = location.path(root), location.qualified_safe_name
        frame, note = _lake_frame(spark, path, name, read)
        done = _compare(spark, path, dsn, shown, frame, keep_keys=settle_s > 0 and note is None)
        done.diff.note = note
        compared[name] = done
        tell(_progress_line(done, f"{number}/{len(locations)} tables"))
    pending = [
        (name, c)
        for name, c in compared.items()
        if not c.diff.equal and 0 < len(c.keys) + len(c.rows) <= MAX_SETTLE_KEYS
    ]
    for c in compared.values():
        if settle_s > 0 and not c.diff.equal and len(c.keys) + len(c.rows) > MAX_SETTLE_KEYS:
            c.diff.note = f"not settled: more than {MAX_SETTLE_KEYS:,} keys differ (a lake that far behind)"
    if pending:
        _settle(spark, root, dsn, dict(pending), shown=shown, settle_s=settle_s, tell=tell)
    return [c.diff for c in compared.values()]


def _progress_line(done: _Compared, where: str) -> str:
    diff = done.diff
    if diff.unreconcilable is not None:
        return f"verify: {diff.source}: cannot be compared ({where})"
    differing = sum(diff.counts.values())
    what = "rows" if diff.keyless else "keys"
    state = "equal" if diff.equal else f"{differing:,} {what} differ"
    return (
        f"verify: {diff.source}: {diff.postgres_rows:,} Postgres rows compared with {diff.delta_rows:,} "
        f"in Delta, {state} ({where})"
    )


def _first_read(spark: SparkSession, root: str, names: Sequence[str], tell: Say) -> ConsistentRead | None:
    """The lake's freshest consistent state, or None (then the mirrors are compared as they are,
    unsettled) when it proves no position yet."""
    from spark_jobs.reading.consistent import NoCommonWatermark, read_consistent

    try:
        read = read_consistent(spark, root, names)
    except NoCommonWatermark as exc:
        tell(f"verify: no consistent read of the lake ({exc}): its mirrors compared as they are, unsettled")
        return None
    how = "through the changelog"
    if read.not_fresh is not None:
        how = f"at the mirrors' position ({read.not_fresh})"
    tell(f"verify: the lake read at position {format_lsn(read.position)}, {how}")
    return read


def _lake_frame(
    spark: SparkSession, path: str, name: str, read: ConsistentRead | None
) -> tuple[DataFrame | None, str | None]:
    """The table's frame in `read`, or None (the mirror as it is) with why, when the mirror holds
    commits the merge did not write after the version the read starts from: a consistent read
    reads marked versions, and would not show them."""
    if read is None:
        return None, "the lake proves no position yet: its mirror compared as it is, unsettled"
    table = read.tables[name]
    if table.version is None:
        return table.frame, None
    foreign = _written_outside_merge(spark, path, table.version)
    if foreign is None:
        return table.frame, None
    return (
        None,
        f"its mirror holds a commit the merge did not write ({foreign}): compared as it is, unsettled",
    )


def _written_outside_merge(spark: SparkSession, path: str, base: int) -> str | None:
    """The newest commit after `base` that changed rows and carries no merge mark ("version N:
    OPERATION"), or None."""
    from delta.tables import DeltaTable

    from spark_jobs.lake.watermark_io import marked_versions

    newer = delta_tables.newest_version(spark, path) - base
    if newer <= 0:
        return None
    marked = {v.version for v in marked_versions(spark, path, newer)}
    history = DeltaTable.forPath(spark, path).history(newer).select("version", "operation").collect()
    foreign = sorted(
        (int(r["version"]), str(r["operation"]))
        for r in history
        if int(r["version"]) > base and int(r["version"]) not in marked and r["operation"] in DATA_OPERATIONS
    )
    return None if not foreign else f"version {foreign[-1][0]}: {foreign[-1][1]}"


def source_lsn(dsn: str) -> int:
    """A WAL position past every transaction a read of `dsn` that ended before this call saw: a
    transaction's commit record is in the WAL before it becomes visible (the insert position,
    not the flushed one: an asynchronous commit is visible before its record is flushed)."""
    conn = postgres_connect.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute(
                "SELECT (CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() "
                "ELSE pg_current_wal_insert_lsn() END - '0/0'::pg_lsn)::bigint"
            )
            return int(cur.fetchone()[0])
    finally:
        conn.close()


def format_lsn(lsn: int) -> str:
    """An LSN as Postgres prints it (X/Y)."""
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def _settle(
    spark: SparkSession,
    root: str,
    dsn: str,
    pending: dict[str, _Compared],
    *,
    shown: int,
    settle_s: float,
    tell: Say,
) -> None:
    """Rounds until the differing keys agree or `settle_s` runs out: Postgres read again for those
    keys, its position noted, the lake read at that position once it proves it, the keys that agree
    dropped. The lake is read at the position itself (not its newest): a key written since would
    differ again, and one written often never settle."""
    started = time.monotonic()
    deadline = started + settle_s
    first = {name: len(c.keys) + len(c.rows) for name, c in pending.items()}
    tell(
        f"verify: {sum(first.values()):,} keys (rows) of {len(pending)} table(s) differ; settling them "
        f"(up to {settle_s:g} s, --settle-seconds)"
    )
    lake_at: int | None = None
    while pending:
        sources = {name: _source_side(dsn, c) for name, c in pending.items()}
        lsn = source_lsn(dsn)
        read, lake_at = _read_at(spark, root, list(pending), lsn, deadline=deadline, tell=tell)
        if read is None:
            break
        for name, c in list(pending.items()):
            _recompare(c, sources[name], _lake_side(read.frame(name), c), shown)
            if c.diff.equal:
                del pending[name]
        left = sum(len(c.keys) + len(c.rows) for c in pending.values())
        tell(
            f"verify: at {format_lsn(lsn)}: {left:,} keys (rows) still differ "
            f"({time.monotonic() - started:.1f} s)"
        )
        if time.monotonic() >= deadline:
            break
    for name, c in pending.items():
        reached = "" if lake_at is None else f", the lake at {format_lsn(lake_at)}"
        c.diff.note = (
            f"still different after settling {settle_s:g} s (the source at "
            f"{format_lsn(source_lsn(dsn))}{reached})"
        )
        c.diff.settled = first[name] - len(c.keys) - len(c.rows)
    for name, count in first.items():
        if name not in pending:
            tell(f"verify: {name}: its {count:,} differing keys (rows) were in flight: equal at one position")


def _read_at(
    spark: SparkSession, root: str, names: list[str], lsn: int, *, deadline: float, tell: Say
) -> tuple[ConsistentRead | None, int | None]:
    """The lake at `lsn` once it proves it (at its newest, at or past it, when the read is of the
    mirrors only: their versions need not meet at `lsn` exactly), or None at the deadline; and the
    newest position seen."""
    from spark_jobs.reading.consistent import NoCommonWatermark, read_consistent

    said = time.monotonic()
    seen: int | None = None
    while True:
        try:
            read = read_consistent(spark, root, names, at_lsn=lsn)
            if read.position < lsn and read.not_fresh is not None:
                read = read_consistent(spark, root, names)
            seen = max(seen or 0, read.position)
            if read.position >= lsn:
                return read, seen
        except NoCommonWatermark:
            pass
        now = time.monotonic()
        if now >= deadline:
            return None, seen
        if now - said >= SAY_EVERY_S:
            where = "no position" if seen is None else format_lsn(seen)
            tell(f"verify: waiting for the lake to reach {format_lsn(lsn)} (it is at {where})")
            said = now
        time.sleep(min(POLL_S, max(0.0, deadline - now)))


def _source_side(dsn: str, c: _Compared) -> dict[str, Any]:
    """Postgres's side of the pending keys: key -> row hash (keyed), or row hash -> (count, text)."""
    spec = c.spec
    assert spec is not None
    hasher = RowHasher(spec.types)
    if c.rows:
        counts: dict[str, Any] = {}
        # No key to look rows up by: the table is read whole, only the pending rows kept.
        for row in postgres_rows.fetch_rows(dsn, spec.schema, spec.table, spec.pg_columns):
            h = fingerprints.signed(hasher.hash(row))
            if h in c.rows:
                n, _ = counts.get(str(h), (0, ""))
                counts[str(h)] = (n + 1, key_text(spec.columns, row))
        return counts
    positions = [spec.columns.index(k) for k in spec.keys]
    key_columns = [spec.pg_columns[i] for i in positions]
    types = postgres_rows.key_lookup_types(key_columns)
    wanted = set(c.keys)
    if types is None:
        rows: Iterator[list[Any]] = postgres_rows.fetch_rows(dsn, spec.schema, spec.table, spec.pg_columns)
    else:
        values = [_key_values(k, spec.keys, types) for k in c.keys]
        lookups = [v for v in values if v is not None]
        rows = postgres_rows.fetch_rows_by_keys(
            dsn, spec.schema, spec.table, spec.pg_columns, key_columns=key_columns, keys=lookups
        )
    found: dict[str, Any] = {}
    for row in rows:
        k = key_text(spec.keys, [row[i] for i in positions])
        if k in wanted:
            found[k] = fingerprints.signed(hasher.hash(row))
    return found


def _key_values(text: str, names: Sequence[str], types: Sequence[type]) -> tuple[Any, ...] | None:
    """A key's values from its report text, as `key_lookup_types` says; None for a key with a NULL
    (Postgres holds no such key)."""
    parsed = json.loads(text)
    values = [parsed[n] for n in names]
    if any(v is None for v in values):
        return None
    return tuple(Decimal(str(v)) if t is Decimal else t(v) for v, t in zip(values, types, strict=True))


def _lake_side(frame: DataFrame, c: _Compared) -> dict[str, Any]:
    """The lake's side of the pending keys: key -> its rows' hashes (keyed), or row hash -> (count,
    text)."""
    from pyspark.sql import functions as F

    spec = c.spec
    assert spec is not None
    if c.rows:
        whole_rows = dataclasses.replace(spec, keys=tuple(spec.columns))
        hashes = list(c.rows)
        rows = _per_row(_key_hashes(frame, whole_rows)).where(F.col("h").isin(hashes)).collect()
        return {str(r["h"]): (int(r["n"]), r["t"]) for r in rows}
    hashed = _key_hashes(frame, spec).where(F.col("k").isin(c.keys)).collect()
    found: dict[str, Any] = {}
    for r in hashed:
        found.setdefault(r["k"], []).append(int(r["h"]))
    return found


def _recompare(c: _Compared, source: dict[str, Any], lake: dict[str, Any], shown: int) -> None:
    """The pending keys compared again, from both sides' reads at one position: those that agree
    leave `c`, the diff says the rest."""
    diff = c.diff
    if c.rows:
        counts = []
        for h, text in c.rows.items():
            d, d_text = lake.get(str(h), (0, text))
            n, p_text = source.get(str(h), (0, text))
            counts.append(multiset.RowCount(d_text if d >= n else p_text, d, n))
        c.rows = {h: c.rows[h] for h, rc in zip(c.rows, counts, strict=True) if rc.delta != rc.postgres}
        _fill_keyless(diff, multiset.compare(sorted(counts, key=lambda rc: rc.text), shown))
        return
    kinds: dict[str, list[str]] = {kind: [] for kind in KINDS}
    still = []
    for k in c.keys:
        held, source_hash = lake.get(k, []), source.get(k)
        if len(held) > 1:
            kinds[DUPLICATE].append(k)
        kind: str | None
        if not held and source_hash is None:
            kind = None  # deleted meanwhile, on both sides
        elif not held:
            kind = "missing_in_delta"
        elif source_hash is None:
            kind = "extra_in_delta"
        else:
            kind = "different" if any(x != source_hash for x in held) else None
        if kind is not None:
            kinds[kind].append(k)
        if kind is not None or len(held) > 1:
            still.append(k)
    c.keys = still
    diff.counts = {kind: len(keys) for kind, keys in kinds.items()}
    for kind, keys in kinds.items():
        setattr(diff, kind, sorted(keys)[:shown])


def report(diff: TableDiff) -> str:
    if diff.unreconcilable is not None:
        return f"{diff.source} ({diff.path}): CANNOT VERIFY: {diff.unreconcilable}"
    head = f"{diff.source} ({diff.path}): Delta {diff.delta_rows} rows, Postgres {diff.postgres_rows} rows"
    if diff.keyless:
        head += " (no key: compared as multisets of rows)"
    if diff.equal:
        return head + ": equal"
    lines = [head + ": DIFFERENT"]
    for kind in KINDS:
        keys: list[str] = getattr(diff, kind)
        if diff.counts[kind]:
            more = diff.counts[kind] - diff.shown_counts.get(kind, len(keys))
            lines.append(
                f"  {kind} ({diff.counts[kind]}): "
                + ", ".join(keys)
                + (f" … and {more} more" if more else "")
            )
    if diff.keyless:
        lines.append(f"  {multiset.UNCAPTURED_HINT}")
    if diff.note is not None:
        lines.append(f"  ({diff.note})")
    return "\n".join(lines)


DESCRIPTION = (
    "Compare every Delta mirror under --warehouse with its Postgres table and print what differs: "
    "the keys of a keyed table; for a table without a key, the rows (compared as multisets, while its "
    "topic is insert-only). The lake is read as its freshest consistent state (the mirrors plus the "
    "changelog's tail, at one source position), and keys that differ are settled: read again on both "
    "sides at one source position once the lake proves it, for up to --settle-seconds, so changes in "
    "flight are not reported. Exit status 0 when every table is equal, 1 when one differs or cannot be "
    "compared, or when the warehouse holds no table."
)


@exit_on_error
def main(argv: Sequence[str] | None = None) -> int:
    args = option_parser.build_parser("verify", DESCRIPTION).parse_args(argv)
    if args.settle_seconds < 0:
        raise ConfigurationError(f"--settle-seconds {args.settle_seconds:g}: expected 0 or more")
    spark = build_session(option_parser.spark_settings(args, "bottledwater-verify"))
    diffs = verify_warehouse(
        spark,
        args.warehouse,
        args.postgres,
        args.table,
        args.show,
        settle_s=args.settle_seconds,
        say=lambda line: print(line, file=sys.stderr, flush=True),
    )
    for diff in diffs:
        print(report(diff))
    if not diffs:
        print(f"no Delta tables under {args.warehouse}", file=sys.stderr)
        return 1
    return 0 if all(d.equal for d in diffs) else 1


__all__ = [
    "TableDiff",
    "format_lsn",
    "layout",
    "main",
    "source_lsn",
    "verify_keyless",
    "verify_table",
    "verify_warehouse",
]

if __name__ == "__main__":
    sys.exit(main())
