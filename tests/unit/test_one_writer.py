"""One writer per merge checkpoint: a Materialize of the Delta assets (a mirror, the changelog)
launched while the continuous merge runs refuses in one line naming the run, before any Spark."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.definitions.freshness import TimeWindowFreshnessPolicy

from orchestration.assets import build_delta_assets
from orchestration.changelog_asset import CHANGELOG_ASSET
from orchestration.continuous_merge import CONTINUOUS_MERGE_JOB
from orchestration.discovery import CapturedTable
from orchestration.resources import (
    DeltaWarehouseResource,
    KafkaResource,
    PostgresResource,
    SchemaRegistryResource,
    SparkResource,
)

ORDERS = CapturedTable("public", "orders", ("id",), ("id", "note"), "bw.public.orders")
ORDERS_KEY = dg.AssetKey(["delta", "public", "orders"])


def resources(root: Path) -> dict[str, object]:
    return {
        "postgres": PostgresResource(dsn="postgresql://unused@127.0.0.1:1/unused", slot="bw"),
        "kafka": KafkaResource(bootstrap_servers="127.0.0.1:1", topic_prefix="bw"),
        "schema_registry": SchemaRegistryResource(url=None),
        "warehouse": DeltaWarehouseResource(root=str(root), changelog=True),
        "spark": SparkResource(),  # lazy: a refused run never starts a JVM
    }


@pytest.mark.parametrize("key", [ORDERS_KEY, CHANGELOG_ASSET], ids=["mirror", "changelog"])
def test_a_materialize_while_the_continuous_merge_runs_is_refused_in_one_line(
    tmp_path: Path, key: dg.AssetKey
) -> None:
    merge = build_delta_assets([ORDERS], "bw", changelog=True, freshness_limit_s=3600)
    with dg.DagsterInstance.ephemeral() as instance:
        instance.add_run(
            dg.DagsterRun(job_name=CONTINUOUS_MERGE_JOB, run_id="merging", status=dg.DagsterRunStatus.STARTED)
        )
        result = dg.materialize(
            [merge],
            selection=[key],
            resources=resources(tmp_path),
            instance=instance,
            raise_on_error=False,
        )
        assert instance.get_latest_materialization_event(key) is None
    assert not result.success
    failure = result.get_step_failure_events()[0].step_failure_data.error
    assert failure is not None
    message = failure.message.strip()
    assert "refusing to merge the Delta assets while the continuous merge runs (run merging)" in message
    assert "stop the continuous_merge_supervisor sensor and terminate that run first" in message
    assert not (tmp_path / "_checkpoints").exists()


def test_the_delta_assets_carry_dagsters_freshness_policy() -> None:
    merge = build_delta_assets([ORDERS], "bw", changelog=True, freshness_limit_s=3600)
    for spec in merge.specs:
        policy = spec.freshness_policy
        assert isinstance(policy, TimeWindowFreshnessPolicy), spec.key
        assert policy.fail_window.to_timedelta() == timedelta(hours=1)
        assert policy.warn_window is not None and policy.warn_window.to_timedelta() == timedelta(minutes=30)
