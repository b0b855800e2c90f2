"""The lake's changelog in Dagster (BW_CHANGELOG=on): an asset the merge materializes with every run,
its position and lag, each mirror's lag behind it, and two checks.

The changelog holds every merge batch's records of every table in one Delta commit (docs/lakehouse.md,
"The lake's changelog"); a read through it serves its position whatever the mirrors' lag. So its own
freshness is the lake's freshness for such reads, and a mirror's lag behind it is what a reader of
that mirror alone (or of SQL on it) sees on top: bounded by the merge's `--mirror-max-lag` when the
mirrors are merged behind it (BW_MIRROR_BUDGET_SECONDS), about nothing otherwise.
"""

# No `from __future__ import annotations`: Dagster reads the resource types of the check function's
# parameters from their annotations at definition time.

import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import dagster as dg
from pyspark.sql import SparkSession

from cdc_worker.core.lsn import format_lsn
from orchestration.resources import DeltaWarehouseResource, SparkResource
from spark_jobs.lake import changelog, delta_tables
from spark_jobs.lake.mirror_versions import RECENT_COMMITS, NoCommonWatermark, versions_of
from spark_jobs.lake.watermark_io import idle_marks
from spark_jobs.rules import layout
from spark_jobs.rules.watermark import newest_mark

CHANGELOG_ASSET = dg.AssetKey(["delta", "changelog"])
FRESHNESS = "freshness"
MIRRORS_BEHIND = "mirrors_behind"


def changelog_spec(
    topic_keys: Sequence[dg.AssetKey], group_name: str, *, freshness_policy: dg.FreshnessPolicy | None = None
) -> dg.AssetSpec:
    return dg.AssetSpec(
        key=CHANGELOG_ASSET,
        deps=list(topic_keys),
        group_name=group_name,
        kinds={"delta", "spark"},
        description="The lake's changelog: every merge batch's records of every table in one Delta commit, "
        "proving a source position for all of them at once; the mirrors are merged from it.",
        freshness_policy=freshness_policy,
    )


def mirror_lags(
    spark: SparkSession, warehouse: str, names: Sequence[str], head_at: int | None
) -> dict[str, Any]:
    """Seconds each mirror (`schema.table`) trails the changelog's proof at `head_at` (epoch µs): the
    worker's proof of the changelog's position against that of the mirror's newest mark. None for a
    mirror not merged yet, or when either proof time is unknown."""
    idle = idle_marks(spark, warehouse, RECENT_COMMITS)
    lags: dict[str, Any] = {}
    for name in names:
        try:
            table = versions_of(spark, warehouse, name, use_history=False, limit=RECENT_COMMITS, idle=idle)
        except NoCommonWatermark:
            lags[name] = None
            continue
        mark = newest_mark(v.mark for v in table.versions)
        at = None if mark is None else mark.at
        lags[name] = None if at is None or head_at is None else round(max(0, head_at - at) / 1e6, 3)
    return lags


def changelog_status(spark: SparkSession, warehouse: str, names: Sequence[str]) -> dict[str, Any]:
    """The changelog's position, when it was proven, its version and each mirror's lag behind it."""
    path = layout.changelog_path(warehouse)
    if not changelog.exists(spark, warehouse):
        return {"path": path, "position": None}
    head = changelog.newest(spark, warehouse)
    proven = head is not None and head.watermark > 0
    at = head.at if head is not None and proven else None
    lags = mirror_lags(spark, warehouse, names, at)
    known = [lag for lag in lags.values() if lag is not None]
    return {
        "path": path,
        "version": delta_tables.newest_version(spark, path),
        "position": format_lsn(head.watermark) if head is not None and proven else None,
        "lag_s": None if at is None else round(max(0.0, time.time() - at / 1e6), 3),
        "mirrors_behind_s": lags,
        "max_mirror_lag_s": max(known, default=None),
    }


def materialization(status: Mapping[str, Any]) -> dg.MaterializeResult:
    metadata = {
        k: dg.MetadataValue.json(v) if isinstance(v, dict) else v for k, v in status.items() if v is not None
    }
    return dg.MaterializeResult(asset_key=CHANGELOG_ASSET, metadata=metadata)


def build_changelog_checks(names: Sequence[str], freshness_limit_s: float) -> dg.AssetChecksDefinition:
    """`freshness`: the changelog's position was proven within the limit (what reads through it serve).
    `mirrors_behind`: no mirror trails it by more than the limit (a warning: reads through the
    changelog are still fresh)."""
    specs = [
        dg.AssetCheckSpec(
            FRESHNESS,
            asset=CHANGELOG_ASSET,
            description="The changelog's position (what reads through it serve) was proven within the limit.",
        ),
        dg.AssetCheckSpec(
            MIRRORS_BEHIND,
            asset=CHANGELOG_ASSET,
            description="No mirror trails the changelog by more than the freshness limit.",
        ),
    ]

    @dg.multi_asset_check(
        name="changelog_checks",
        specs=specs,
        can_subset=True,
        op_tags={"bottledwater/spark": "quality"},
        description="The lake's changelog: its freshness and how far the mirrors trail it.",
    )
    def changelog_checks(
        context: dg.AssetCheckExecutionContext, spark: SparkResource, warehouse: DeltaWarehouseResource
    ) -> Iterator[dg.AssetCheckResult]:
        status = changelog_status(spark.spark_session, warehouse.root, names)
        selected = {k.name for k in context.selected_asset_check_keys}
        if FRESHNESS in selected:
            yield _freshness(status, freshness_limit_s)
        if MIRRORS_BEHIND in selected:
            yield _mirrors_behind(status, freshness_limit_s)

    return changelog_checks


def _freshness(status: Mapping[str, Any], limit_s: float) -> dg.AssetCheckResult:
    lag = status.get("lag_s")
    if lag is None:
        said = "the changelog proves no position yet: is the worker publishing progress, the merge running?"
    else:
        said = (
            f"the changelog's position {status['position']} was proven {lag:.0f} s ago "
            f"(limit {limit_s:.0f} s)"
        )
    return dg.AssetCheckResult(
        check_name=FRESHNESS,
        asset_key=CHANGELOG_ASSET,
        passed=lag is not None and lag <= limit_s,
        severity=dg.AssetCheckSeverity.ERROR,
        description=said,
        metadata={"max_lag_s": limit_s, **({} if lag is None else {"lag_s": lag})},
    )


def _mirrors_behind(status: Mapping[str, Any], limit_s: float) -> dg.AssetCheckResult:
    lags: Mapping[str, float | None] = status.get("mirrors_behind_s") or {}
    late = sorted(
        (n for n, lag in lags.items() if lag is not None and lag > limit_s), key=lambda n: -(lags[n] or 0)
    )
    said = (
        f"{len(late)} mirror(s) trail the changelog by more than {limit_s:.0f} s, the worst {late[0]} "
        f"({lags[late[0]]:.0f} s): launch the merge job, or give it more BW_MIRROR_BUDGET_SECONDS"
        if late
        else f"every mirror within {limit_s:.0f} s of the changelog"
    )
    return dg.AssetCheckResult(
        check_name=MIRRORS_BEHIND,
        asset_key=CHANGELOG_ASSET,
        passed=not late,
        severity=dg.AssetCheckSeverity.WARN,
        description=said,
        metadata={
            "late": dg.MetadataValue.json(late),
            "max_mirror_lag_s": status.get("max_mirror_lag_s") or 0.0,
        },
    )
