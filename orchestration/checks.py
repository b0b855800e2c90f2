"""Asset checks of the Delta tables, from `spark_jobs.quality`: key uniqueness, non-null keys,
freshness and schema drift run with every merge; reconciliation with Postgres runs in the
`reconcile` job, because it compares a moving source and is only meaningful when the source is
quiet or the range no longer changes (spark_jobs.quality says so too)."""

# No `from __future__ import annotations`: Dagster reads the resource types of the check function's
# parameters from their annotations at definition time.

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import dagster as dg
from pyspark.sql import SparkSession

from orchestration.resources import DeltaWarehouseResource, PostgresResource, SparkResource
from spark_jobs import quality
from spark_jobs.lake.mirror_versions import lake_watermark
from spark_jobs.lake.table_state import TablePaths, read_state

MERGE_CHECKS = ("key_uniqueness", "non_null_keys", "freshness", "schema_drift")
RECONCILIATION = "reconciliation"
# An unkeyed table (captured with --allow-unkeyed) has no key to check, and its deletes are not
# published, so it cannot reconcile either.
KEYED_ONLY = frozenset({"key_uniqueness", "non_null_keys", RECONCILIATION})
DESCRIPTIONS = {
    "key_uniqueness": "No two rows share a key.",
    "non_null_keys": "No key column is NULL.",
    "freshness": "The lake's common watermark (every table complete up to it) was proven within the "
    "limit; before there is one, the table's own newest change or watermark.",
    "schema_drift": "The Delta columns match the Postgres columns (added, retyped).",
    RECONCILIATION: "Row count and an order-independent checksum equal Postgres's (run when quiet).",
}

Check = Callable[[SparkSession, str, str, timedelta, quality.LakePosition | None], quality.CheckResult]
RUNNERS: Mapping[str, Check] = {
    "key_uniqueness": lambda spark, path, _dsn, _lag, _lake: quality.key_uniqueness(spark, path),
    "non_null_keys": lambda spark, path, _dsn, _lag, _lake: quality.non_null_keys(spark, path),
    "freshness": lambda spark, path, _dsn, lag, lake: quality.freshness(spark, path, lag, lake=lake),
    "schema_drift": lambda spark, path, dsn, _lag, _lake: quality.schema_drift(spark, path, dsn),
    RECONCILIATION: lambda spark, path, dsn, _lag, _lake: quality.reconciliation(spark, path, dsn),
}


def lake_position(
    spark: SparkSession, warehouse: str, assets: Iterable[dg.AssetKey]
) -> quality.LakePosition | None:
    """The common watermark of every Delta asset (`delta/<schema>/<table>`), None before there is one."""
    common = lake_watermark(spark, warehouse, [f"{k.path[1]}.{k.path[2]}" for k in assets])
    position, proven_at = common["common_watermark"], common["common_watermark_proven_at"]
    if position is None or proven_at is None:
        return None
    return quality.LakePosition(int(position), datetime.fromtimestamp(float(proven_at), UTC))


def _metadata(values: Mapping[str, Any]) -> dict[str, Any]:
    """Lists and dicts as JSON metadata; scalars as they are."""
    return {k: dg.MetadataValue.json(v) if isinstance(v, list | dict) else v for k, v in values.items()}


def check_keys(keyed: Mapping[dg.AssetKey, bool], names: Sequence[str]) -> list[dg.AssetCheckKey]:
    """The checks named `names` that apply to each Delta asset (`keyed`: whether its table has a key)."""
    return [
        dg.AssetCheckKey(key, name)
        for key, has_key in keyed.items()
        for name in names
        if has_key or name not in KEYED_ONLY
    ]


def build_quality_checks(
    keyed: Mapping[dg.AssetKey, bool], freshness_limit_s: float
) -> dg.AssetChecksDefinition:
    specs = [
        dg.AssetCheckSpec(key.name, asset=key.asset_key, description=DESCRIPTIONS[key.name])
        for key in check_keys(keyed, (*MERGE_CHECKS, RECONCILIATION))
    ]
    max_lag = timedelta(seconds=freshness_limit_s)

    @dg.multi_asset_check(
        name="delta_quality",
        specs=specs,
        can_subset=True,
        op_tags={"bottledwater/spark": "quality"},
        description="spark_jobs.quality on each selected Delta table.",
    )
    def delta_quality(
        context: dg.AssetCheckExecutionContext,
        spark: SparkResource,
        warehouse: DeltaWarehouseResource,
        postgres: PostgresResource,
    ) -> Iterator[dg.AssetCheckResult]:
        session = spark.spark_session
        selected = context.selected_asset_check_keys
        # The lake's, once: the freshness of every table is that of the consistent whole.
        lake = (
            lake_position(session, warehouse.root, keyed)
            if any(k.name == "freshness" for k in selected)
            else None
        )
        for check_key in sorted(selected, key=str):
            schema, table = check_key.asset_key.path[1:]
            path = warehouse.table_path(schema, table)
            if not read_state(session, TablePaths(path)).exists:
                yield dg.AssetCheckResult(
                    asset_key=check_key.asset_key,
                    check_name=check_key.name,
                    passed=False,
                    severity=dg.AssetCheckSeverity.WARN,
                    description=f"no Delta table at {path} yet: run the merge job",
                )
                continue
            result = RUNNERS[check_key.name](session, path, postgres.dsn, max_lag, lake)
            yield dg.AssetCheckResult(
                asset_key=check_key.asset_key,
                check_name=check_key.name,
                passed=result.passed,
                severity=dg.AssetCheckSeverity(result.severity.value),
                description=result.description,
                metadata=_metadata(result.metadata),
            )

    return delta_quality
