"""replication_slot and snapshot_export through Dagster against the stack: a new slot with its
snapshot in Kafka, a slot held by a worker reported only, and a re-snapshot of chosen tables while a
real worker streams."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import psycopg2
import psycopg2.extras
import pytest

from orchestration import assets
from orchestration.definitions import build_resources
from orchestration.resources import KafkaResource
from orchestration.settings import load_settings
from tests.integration.conftest import unique_name
from tests.integration.orchestration_harness import delete_topics_with_prefix, pipeline_env
from tests.integration.worker_harness import WorkerProcess, execute

ROWS = 30


@pytest.fixture
def resources(
    fresh_db: str, kafka_bootstrap: str, registry_url: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[dict[str, object]]:
    name = unique_name("slot")
    with psycopg2.connect(fresh_db) as conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE people (id int PRIMARY KEY, name text)")
        cur.execute("INSERT INTO people SELECT g, 'p' || g FROM generate_series(1, %s) g", (ROWS,))
    conn.close()
    for variable, value in pipeline_env(fresh_db, name, kafka_bootstrap, registry_url).items():
        monkeypatch.setenv(variable, value)
    try:
        yield build_resources(load_settings(os.environ))
    finally:
        delete_topics_with_prefix(kafka_bootstrap, name)


def metadata(result: dg.ExecuteInProcessResult, key: dg.AssetKey) -> dict[str, object]:
    [event] = [e for e in result.get_asset_materialization_events() if e.asset_key == key]
    return {k: v.value for k, v in event.materialization.metadata.items()}


def test_snapshot_export_alone_creates_the_slot_with_its_snapshot_in_kafka(
    resources: dict[str, object],
) -> None:
    result = dg.materialize([assets.snapshot_export], resources=resources)
    assert metadata(result, assets.SNAPSHOT_EXPORT)["mode"] == "new slot"
    kafka = resources["kafka"]
    assert isinstance(kafka, KafkaResource)
    topic = f"{kafka.topic_prefix}.people"
    assert kafka.end_offsets([topic]) == {topic: ROWS}


def test_a_spark_snapshot_shows_its_progress_in_the_dagster_run(resources: dict[str, object]) -> None:
    # The worker's log lines become run events as dagster.yaml's python_logs say.
    settings = {"python_logs": {"managed_python_loggers": ["cdc_worker"], "python_log_level": "INFO"}}
    with dg.DagsterInstance.ephemeral(settings=settings) as instance:
        result = dg.materialize(
            [assets.snapshot_export],
            resources=resources,
            instance=instance,
            run_config=_snapshot_config(snapshot_engine="spark"),
        )
        messages = [entry.user_message for entry in instance.all_logs(result.run_id)]
    assert metadata(result, assets.SNAPSHOT_EXPORT)["mode"] == "new slot"
    assert any("spark snapshot of 1 table(s) in 1 range(s)" in m for m in messages), messages
    assert f"spark snapshot: public.people done, {ROWS} rows" in messages
    summaries = [m for m in messages if m.startswith("spark snapshot: 1/1 tables, 1/1 ranges")]
    assert summaries and all(f"{ROWS} rows" in m and "rows/s" in m for m in summaries), messages
    assert any(m.startswith(f"spark snapshot complete: {ROWS} rows") for m in messages)
    kafka = resources["kafka"]
    assert isinstance(kafka, KafkaResource)
    topic = f"{kafka.topic_prefix}.people"
    assert kafka.end_offsets([topic]) == {topic: ROWS}


def test_a_slot_held_by_a_worker_is_reported(resources: dict[str, object], fresh_db: str) -> None:
    created = dg.materialize([assets.replication_slot, assets.snapshot_export], resources=resources)
    assert metadata(created, assets.REPLICATION_SLOT)["created_by_this_run"] is True
    assert metadata(created, assets.SNAPSHOT_EXPORT)["mode"] == "with the new slot"
    slot = os.environ["BOTTLEDWATER_SLOT"]

    # A replication connection streaming from the slot, as a running worker would.
    repl = psycopg2.connect(fresh_db, connection_factory=psycopg2.extras.LogicalReplicationConnection)
    try:
        cur = repl.cursor()
        cur.start_replication(slot_name=slot, options={"proto_version": "1", "publication_names": slot})
        held = dg.materialize([assets.replication_slot], resources=resources)
    finally:
        repl.close()
    reported = metadata(held, assets.REPLICATION_SLOT)
    assert reported["active"] is True
    assert reported["created_by_this_run"] is False
    assert reported["snapshot"] == "done"


def _snapshot_config(**config: object) -> dict[str, object]:
    return {"ops": {"snapshot_export": {"config": config}}}


def _failure(result: dg.ExecuteInProcessResult) -> str:
    assert not result.success
    error = result.get_step_failure_events()[0].step_failure_data.error
    assert error is not None
    return error.message


def test_snapshot_export_of_a_streaming_slot_re_snapshots_the_chosen_tables(
    resources: dict[str, object], fresh_db: str, tmp_path: Path
) -> None:
    dg.materialize([assets.replication_slot, assets.snapshot_export], resources=resources)
    kafka = resources["kafka"]
    assert isinstance(kafka, KafkaResource)
    topic = f"{kafka.topic_prefix}.people"
    environment = {k: v for k, v in os.environ.items() if k.startswith("BOTTLEDWATER_")}
    worker = WorkerProcess(["--resnapshot-chunk-rows", "7"], tmp_path / "worker.log", environment).start()
    try:
        worker.wait_streaming()
        execute(fresh_db, "UPDATE people SET name = 'changed' WHERE id <= 5")
        result = dg.materialize(
            [assets.snapshot_export],
            resources=resources,
            run_config=_snapshot_config(tables=["public.peo*"], progress_timeout_s=60),
        )
        reported = metadata(result, assets.SNAPSHOT_EXPORT)
        assert reported["mode"] == "re-snapshot while streaming"
        assert reported["rows"] == ROWS and reported["tables"] == "public.people"
        # The first snapshot, the 5 updates, then every row again (in chunks of 7 rows).
        assert kafka.end_offsets([topic]) == {topic: ROWS + 5 + ROWS}
        unknown = dg.materialize(
            [assets.snapshot_export],
            resources=resources,
            run_config=_snapshot_config(tables=["public.nope"]),
            raise_on_error=False,
        )
        assert "no captured table matches public.nope" in _failure(unknown)
    finally:
        assert worker.stop() == 0
    # No worker streams the slot now: the request waits in the WAL, the asset gives up and says why.
    waiting = dg.materialize(
        [assets.snapshot_export],
        resources=resources,
        run_config=_snapshot_config(progress_timeout_s=3),
        raise_on_error=False,
    )
    assert "no report from the worker for 3s" in _failure(waiting)
