"""Dagster shows the lake as it is: the continuous_merge job's op, run against the stack with its
child `spark_jobs.merge --continuous`, reports materializations of the lake's changelog and of the
mirror it merged into the Dagster instance, with the version, the position and the lag."""

from __future__ import annotations

import os
import re
import signal
import threading
from pathlib import Path
from typing import Any

import dagster as dg
from psycopg2 import sql

from orchestration.changelog_asset import CHANGELOG_ASSET
from orchestration.continuous_merge import CONTINUOUS_MERGE_JOB, build_continuous_merge_job
from orchestration.resources import (
    DeltaWarehouseResource,
    KafkaResource,
    PostgresResource,
    SchemaRegistryResource,
    SparkResource,
)
from tests.integration.conftest import unique_name
from tests.integration.lakehouse import LakeCase, execute
from tests.integration.orchestration_harness import wait_for

TRIGGER_S = 2.0
REPORTED_TIMEOUT_S = 180.0
ROWS = 10


def _child_pid(instance: dg.DagsterInstance) -> int | None:
    """The merge's pid, as the op logs it when the child starts."""
    runs = instance.get_run_records(filters=dg.RunsFilter(job_name=CONTINUOUS_MERGE_JOB), limit=1)
    if not runs:
        return None
    for entry in instance.all_logs(runs[0].dagster_run.run_id):
        found = re.search(r"continuous merge pid (\d+)", entry.user_message or "")
        if found:
            return int(found.group(1))
    return None


def _metadata(instance: dg.DagsterInstance, key: dg.AssetKey) -> dict[str, Any] | None:
    event = instance.get_latest_materialization_event(key)
    if event is None or event.asset_materialization is None:
        return None
    return {k: v.value for k, v in event.asset_materialization.metadata.items()}


def test_the_continuous_merge_reports_materializations_of_the_changelog_and_its_mirror(
    lake: LakeCase, tmp_path: Path
) -> None:
    name = unique_name("shown")
    execute(
        lake.dsn,
        sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, note text)").format(sql.Identifier(name)),
        sql.SQL("INSERT INTO {} SELECT i, 'n' || i FROM generate_series(1, 10) AS i").format(
            sql.Identifier(name)
        ),
    )
    mirror = dg.AssetKey(["delta", "public", name])
    job = build_continuous_merge_job([lake.topic(name)])
    resources = {
        "kafka": KafkaResource(bootstrap_servers=lake.bootstrap, topic_prefix=lake.prefix),
        "schema_registry": SchemaRegistryResource(url=lake.registry),
        "warehouse": DeltaWarehouseResource(root=lake.warehouse, changelog=True, mirror_budget_s=5.0),
        "spark": SparkResource(master="local[1]", driver_memory="512m"),
        "postgres": PostgresResource(dsn=lake.dsn, slot=lake.slot),
    }
    outcome: list[dg.ExecuteInProcessResult | BaseException] = []
    with (
        lake.worker("avro", name) as worker,
        dg.instance_for_test(temp_dir=str(tmp_path)) as instance,
    ):
        worker.wait_caught_up()

        def run() -> None:
            try:
                outcome.append(
                    job.execute_in_process(
                        run_config={
                            "ops": {"run_continuous_merge": {"config": {"trigger_interval": TRIGGER_S}}}
                        },
                        resources=resources,
                        instance=instance,
                        raise_on_error=False,
                    )
                )
            except BaseException as exc:  # handed to the test thread
                outcome.append(exc)

        runner = threading.Thread(target=run, daemon=True)
        runner.start()
        pid = wait_for(lambda: _child_pid(instance), "the continuous merge to start", 60)
        try:
            changelog = wait_for(
                lambda: _metadata(instance, CHANGELOG_ASSET),
                "the changelog's materialization",
                REPORTED_TIMEOUT_S,
            )
            merged = wait_for(
                lambda: _metadata(instance, mirror), "the mirror's materialization", REPORTED_TIMEOUT_S
            )
        finally:
            # As Dagster's termination does: SIGTERM, the merge stops at a batch boundary, exit 0.
            os.kill(pid, signal.SIGTERM)
            runner.join(120)
        [result] = outcome
        assert isinstance(result, dg.ExecuteInProcessResult) and result.success
        # Reported by the continuous merge's own run, so the UI links each to it.
        event = instance.get_latest_materialization_event(mirror)
        assert event is not None and event.run_id == result.run_id
        reported = instance.fetch_materializations(mirror, limit=100).records
    assert changelog["merged_by"] == CONTINUOUS_MERGE_JOB
    assert isinstance(changelog["version"], int) and changelog["version"] >= 1
    assert re.fullmatch(r"[0-9A-F]+/[0-9A-F]+", changelog["position"])
    assert changelog["lag_s"] >= 0
    assert re.fullmatch(r"[0-9A-F]+/[0-9A-F]+", merged["position"])
    assert isinstance(merged["version"], int) and merged["lag_s"] >= 0
    # Every row merged once, whatever the reports coalesced.
    changes = [
        r.asset_materialization.metadata.get("changes_merged") for r in reported if r.asset_materialization
    ]
    assert sum(int(str(c.value)) for c in changes if c is not None) == ROWS
