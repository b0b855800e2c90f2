"""The reset_delta job: refuses without the slot's name or while the continuous merge runs, then deletes
each table's Delta data, history, tombstones and checkpoint, the merge query's checkpoint, parked
slices, the lake's changelog, idle marks and proof files, and nothing else of the warehouse."""

from __future__ import annotations

from pathlib import Path

import dagster as dg

from orchestration.continuous_merge import CONTINUOUS_MERGE_JOB
from orchestration.jobs import reset_delta_job
from orchestration.resources import DeltaWarehouseResource, PostgresResource, SparkResource

KEYS = [dg.AssetKey(["delta", "public", "orders"]), dg.AssetKey(["delta", "inventory", "products"])]


def resources(root: Path) -> dict[str, object]:
    return {
        "postgres": PostgresResource(dsn="postgresql://unused@127.0.0.1:1/unused", slot="bw"),
        "warehouse": DeltaWarehouseResource(root=str(root)),
        "spark": SparkResource(),  # lazy: a local warehouse never starts a JVM
    }


def warehouse(root: Path) -> list[Path]:
    made = [
        root / "public" / "orders" / "_delta_log",
        root / "public" / "orders__history" / "_delta_log",
        root / "_bw_state" / "public" / "orders" / "tombstones",
        root / "_checkpoints" / "public" / "orders" / "offsets",
        root / "inventory" / "products" / "_delta_log",
        root / "public" / "other_pipeline" / "_delta_log",
        # The one merge query's checkpoint and its parked slices.
        root / "_checkpoints" / "_bw_merge" / "offsets",
        root / "_bw_state" / "_merge" / "parked" / "_delta_log",
        # The merge queries' proof files (freshness hints naming the tables' versions).
        root / "_bw_state" / "_merge" / "proofs",
        # The lake's changelog (the deleted topics' records) and the idle marks (the tables' versions).
        root / "_bw_state" / "changelog" / "_delta_log",
        root / "_bw_state" / "_merge" / "idle_marks" / "_delta_log",
    ]
    for path in made:
        path.mkdir(parents=True)
        (path / "0.json").write_text("{}")
    return made


def test_reset_delta_refuses_without_the_slots_name(tmp_path: Path) -> None:
    made = warehouse(tmp_path)
    result = reset_delta_job(KEYS).execute_in_process(
        run_config={"ops": {"reset_delta_tables": {"config": {"confirm": "nope"}}}},
        resources=resources(tmp_path),
        raise_on_error=False,
    )
    assert not result.success
    failure = result.get_step_failure_events()[0].step_failure_data.error
    assert failure is not None and "set confirm: bw in the run config" in failure.message
    assert all(path.exists() for path in made)


def test_reset_delta_deletes_the_pipelines_tables_and_checkpoints_only(tmp_path: Path) -> None:
    made = warehouse(tmp_path)
    result = reset_delta_job(KEYS).execute_in_process(
        run_config={"ops": {"reset_delta_tables": {"config": {"confirm": "bw"}}}},
        resources=resources(tmp_path),
    )
    assert result.success
    kept = [path for path in made if path.exists()]
    assert kept == [tmp_path / "public" / "other_pipeline" / "_delta_log"]


def test_reset_delta_refuses_while_the_continuous_merge_runs(tmp_path: Path) -> None:
    made = warehouse(tmp_path)
    with dg.DagsterInstance.ephemeral() as instance:
        # A run of the continuous merge in progress, as the supervisor keeps one (its job's name is
        # what the refusal looks for; nothing is executed).
        instance.add_run(
            dg.DagsterRun(job_name=CONTINUOUS_MERGE_JOB, run_id="merging", status=dg.DagsterRunStatus.STARTED)
        )
        result = reset_delta_job(KEYS).execute_in_process(
            run_config={"ops": {"reset_delta_tables": {"config": {"confirm": "bw"}}}},
            resources=resources(tmp_path),
            instance=instance,
            raise_on_error=False,
        )
    assert not result.success
    failure = result.get_step_failure_events()[0].step_failure_data.error
    assert failure is not None and "while the continuous merge runs (run merging)" in failure.message
    assert "stop the continuous_merge_supervisor sensor" in failure.message
    assert all(path.exists() for path in made)
