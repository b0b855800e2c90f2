"""Data-quality checks of a Delta mirror, each returning a `CheckResult` Dagster can report as is.

- key uniqueness: no two rows share a key (a broken MERGE or a manual write would do that);
- non-null keys: no key column is NULL;
- freshness: now - the newest `_bw_commit_ts` (an idle source looks stale too, hence WARN);
- schema drift: the Postgres columns against the Delta columns (missing, retyped, dropped);
- reconciliation: row count and an order-independent checksum over all columns, both sides over the
  same key range (see `rowhash` for why the two sides hash alike).

    spark-submit --py-files bottledwater.zip spark_jobs/quality.py --warehouse /lake \
        --postgres postgres://... --table public.people
"""

from __future__ import annotations

import enum
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from shared_connections.spark_session import build_session
from spark_jobs import option_parser, options
from spark_jobs.connections import postgres_catalog
from spark_jobs.job_main import exit_on_error
from spark_jobs.lake import delta_tables, fingerprints, watermark_io
from spark_jobs.rules import layout
from spark_jobs.rules.names import quote
from spark_jobs.rules.watermark import newer, parse_mark

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

SAMPLE_KEYS = 10
DEFAULT_MAX_LAG = timedelta(seconds=options.DEFAULT_MAX_LAG_S)


class Severity(enum.StrEnum):
    """Dagster's AssetCheckSeverity values."""

    WARN = "WARN"
    ERROR = "ERROR"


@dataclass(frozen=True)
class CheckResult:
    name: str
    passed: bool
    severity: Severity
    description: str
    metadata: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _keys(spark: SparkSession, path: str, keys: Sequence[str] | None) -> tuple[str, ...]:
    if keys:
        return tuple(keys)
    found = layout.decode_key_columns(delta_tables.table_properties(spark, path).get(layout.KEY_PROPERTY))
    if not found:
        raise ValueError(f"{path} has no {layout.KEY_PROPERTY} property: pass the key columns")
    return found


def key_uniqueness(spark: SparkSession, path: str, keys: Sequence[str] | None = None) -> CheckResult:
    from pyspark.sql import functions as F

    key = _keys(spark, path, keys)
    grouped = (
        spark.read.format("delta")
        .load(path)
        .groupBy(*[F.col(quote(k)) for k in key])
        .count()
        .where("count > 1")
    )
    duplicates = grouped.count()
    sample = [r.asDict() for r in grouped.limit(SAMPLE_KEYS).collect()]
    return CheckResult(
        "key_uniqueness",
        duplicates == 0,
        Severity.ERROR,
        f"{duplicates} key(s) held by more than one row" if duplicates else "every key is unique",
        {
            "duplicate_keys": duplicates,
            "sample": json.loads(json.dumps(sample, default=str)),
            "key": list(key),
        },
    )


def non_null_keys(spark: SparkSession, path: str, keys: Sequence[str] | None = None) -> CheckResult:
    from pyspark.sql import functions as F

    key = _keys(spark, path, keys)
    condition = F.lit(False)
    for k in key:
        condition = condition | F.col(quote(k)).isNull()
    nulls = spark.read.format("delta").load(path).where(condition).count()
    return CheckResult(
        "non_null_keys",
        nulls == 0,
        Severity.ERROR,
        f"{nulls} row(s) with a NULL key column" if nulls else "no key column is NULL",
        {"null_key_rows": nulls, "key": list(key)},
    )


@dataclass(frozen=True)
class LakePosition:
    """The lake's common watermark (`mirror_versions.lake_watermark`): the newest position every
    table can be read at, and when the worker proved it."""

    watermark: int
    proven_at: datetime


def freshness(
    spark: SparkSession,
    path: str,
    max_lag: timedelta = DEFAULT_MAX_LAG,
    now: datetime | None = None,
    lake: LakePosition | None = None,
) -> CheckResult:
    """With `lake`, the lag is the common watermark's (now - when the worker proved it: at that time
    the source was past it): what a consistent reader of the lake sees, held back by its slowest
    table. Without, the table's own: its newest change, or the proof of its own watermark."""
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    newest = spark.read.format("delta").load(path).agg(F.max(layout.COMMIT_TS)).head()
    newest_commit: datetime | None = newest[0] if newest else None
    last_write = DeltaTable.forPath(spark, path).history(1).select("timestamp", "userMetadata").head()
    now = now or datetime.now(UTC)
    # The source watermark (docs/lakehouse.md): when the worker proved the table complete. A table
    # whose source is idle is fresh as long as that proof is recent.
    mark = parse_mark(last_write[1]) if last_write else None
    idle = watermark_io.newest_idle_mark(spark, path)  # an idle table's marks are not its commits
    mark = idle if mark is None else newer(mark, idle)
    proven = None if mark is None or mark.at is None else datetime.fromtimestamp(mark.at / 1e6, UTC)
    if newest_commit is None:
        return CheckResult(
            "freshness",
            False,
            Severity.WARN,
            "the table holds no rows",
            {"max_lag_s": max_lag.total_seconds()},
        )
    if newest_commit.tzinfo is None:  # Spark hands back session-time (UTC) naive datetimes
        newest_commit = newest_commit.replace(tzinfo=UTC)
    own = now - newest_commit if proven is None else min(now - newest_commit, now - proven)
    said = "newest change committed" if proven is None else "complete as of the source"
    lag = own
    if lake is not None:
        lag, said = max(timedelta(0), now - lake.proven_at), "the lake's common watermark proven"
    return CheckResult(
        "freshness",
        lag <= max_lag,
        Severity.WARN,
        f"{said} {lag.total_seconds():.0f}s ago (limit {max_lag.total_seconds():.0f}s)",
        {
            "lag_s": lag.total_seconds(),
            "max_lag_s": max_lag.total_seconds(),
            "table_lag_s": own.total_seconds(),
            "newest_commit_ts": newest_commit.isoformat(),
            "last_delta_write": str(last_write[0]) if last_write else None,
            "source_watermark": None if mark is None else mark.watermark,
            "common_watermark": None if lake is None else lake.watermark,
        },
    )


def schema_drift(spark: SparkSession, path: str, dsn: str) -> CheckResult:
    """Postgres columns the lake lacks or types differently fail (ERROR); columns dropped in Postgres
    but kept in the lake are reported only (the merge never drops columns)."""
    properties = delta_tables.table_properties(spark, path)
    schema, table = postgres_catalog.split_qualified(properties.get(layout.SOURCE_PROPERTY, ""))
    pg = {c.name: c for c in postgres_catalog.table_columns(dsn, schema, table)}
    delta = {f.name: f.dataType for f in spark.read.format("delta").load(path).schema.fields}
    missing = [n for n in pg if n not in delta]
    retyped = {
        n: {
            "postgres": pg[n].declared_type,
            "expected": pg[n].spark_type.simpleString(),
            "delta": delta[n].simpleString(),
        }
        for n in pg
        if n in delta and pg[n].spark_type != delta[n]
    }
    dropped = [n for n in delta if n not in pg and n not in layout.META_COLUMNS]
    passed = not missing and not retyped
    return CheckResult(
        "schema_drift",
        passed,
        Severity.ERROR,
        "the Delta columns match Postgres"
        if passed
        else f"{len(missing)} missing, {len(retyped)} retyped column(s)",
        {"missing_in_delta": missing, "retyped": retyped, "dropped_in_postgres": dropped},
    )


def reconciliation(
    spark: SparkSession, path: str, dsn: str, key_range: fingerprints.KeyRange | None = None
) -> CheckResult:
    """Count and checksum of both sides over the same columns and key range. Run it when the source
    is quiet or on a range that no longer changes: in-flight changes differ legitimately."""
    spec = fingerprints.comparable(spark, path, dsn)
    lake = fingerprints.delta_fingerprint(spark, path, spec, key_range)
    source = fingerprints.postgres_fingerprint(dsn, spec, key_range)
    passed = (lake.count, lake.checksum) == (source.count, source.checksum)
    checksums = "match" if lake.checksum == source.checksum else "differ"
    description = (
        "Delta and Postgres hold the same rows"
        if passed
        else f"Delta has {lake.count} rows, Postgres {source.count}; checksums {checksums}"
    )
    return CheckResult(
        "reconciliation",
        passed,
        Severity.ERROR,
        description,
        {
            "delta_rows": lake.count,
            "postgres_rows": source.count,
            "delta_checksum": f"{lake.checksum:016x}",
            "postgres_checksum": f"{source.checksum:016x}",
            "columns": spec.columns,
            "key_range": list(key_range) if key_range else None,
        },
    )


def run_checks(
    spark: SparkSession, path: str, dsn: str | None, max_lag: timedelta = DEFAULT_MAX_LAG
) -> list[CheckResult]:
    results = [key_uniqueness(spark, path), non_null_keys(spark, path), freshness(spark, path, max_lag)]
    if dsn:
        results += [schema_drift(spark, path, dsn), reconciliation(spark, path, dsn)]
    return results


@exit_on_error
def main(argv: Sequence[str] | None = None) -> int:
    args = option_parser.build_parser("quality", "Data-quality checks of Delta mirrors.").parse_args(argv)
    spark = build_session(option_parser.spark_settings(args, "bottledwater-quality"))
    failed = False
    for qualified in args.table:
        schema, table = postgres_catalog.split_qualified(qualified)
        path = layout.TableLocation("", schema, table).path(args.warehouse)
        for result in run_checks(spark, path, args.postgres, timedelta(seconds=args.max_lag)):
            failed |= not result.passed and result.severity == Severity.ERROR
            print(json.dumps({"table": qualified, **result.as_dict()}, default=str))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
