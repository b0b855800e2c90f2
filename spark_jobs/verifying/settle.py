"""Settling the keys that differ, as CDC users check a live replica: the lake read as its freshest
consistent state (`first_read`), then in rounds Postgres read again for the differing keys only,
the WAL position after that read noted, and the lake read at that position once it proves it, so
both sides show the same transactions; keys that agree are dropped (`settle`, `recompare`)."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Iterator, Sequence
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from spark_jobs.connections import postgres_connect, postgres_rows
from spark_jobs.lake import delta_tables, fingerprints
from spark_jobs.rules import multiset
from spark_jobs.rules.rowhash import RowHasher, key_text
from spark_jobs.verifying.compare import DUPLICATE, KINDS, Compared, fill_keyless, key_hashes, per_row

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from spark_jobs.reading.result import ConsistentRead

# Between looks at the lake's position while settling (a look is a consistent read, about a second).
POLL_S = 1.0
# While waiting, a line every this many seconds says where the lake is.
SAY_EVERY_S = 10.0
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


def first_read(spark: SparkSession, root: str, names: Sequence[str], tell: Say) -> ConsistentRead | None:
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


def lake_frame(
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


def settle(
    spark: SparkSession,
    root: str,
    dsn: str,
    pending: dict[str, Compared],
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
            recompare(c, sources[name], _lake_side(read.frame(name), c), shown)
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


def _source_side(dsn: str, c: Compared) -> dict[str, Any]:
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
        values = [key_values(k, spec.keys, types) for k in c.keys]
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


def key_values(text: str, names: Sequence[str], types: Sequence[type]) -> tuple[Any, ...] | None:
    """A key's values from its report text, as `key_lookup_types` says; None for a key with a NULL
    (Postgres holds no such key)."""
    parsed = json.loads(text)
    values = [parsed[n] for n in names]
    if any(v is None for v in values):
        return None
    return tuple(Decimal(str(v)) if t is Decimal else t(v) for v, t in zip(values, types, strict=True))


def _lake_side(frame: DataFrame, c: Compared) -> dict[str, Any]:
    """The lake's side of the pending keys: key -> its rows' hashes (keyed), or row hash -> (count,
    text)."""
    from pyspark.sql import functions as F

    spec = c.spec
    assert spec is not None
    if c.rows:
        whole_rows = dataclasses.replace(spec, keys=tuple(spec.columns))
        hashes = list(c.rows)
        rows = per_row(key_hashes(frame, whole_rows)).where(F.col("h").isin(hashes)).collect()
        return {str(r["h"]): (int(r["n"]), r["t"]) for r in rows}
    hashed = key_hashes(frame, spec).where(F.col("k").isin(c.keys)).collect()
    found: dict[str, Any] = {}
    for r in hashed:
        found.setdefault(r["k"], []).append(int(r["h"]))
    return found


def recompare(c: Compared, source: dict[str, Any], lake: dict[str, Any], shown: int) -> None:
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
        fill_keyless(diff, multiset.compare(sorted(counts, key=lambda rc: rc.text), shown))
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
