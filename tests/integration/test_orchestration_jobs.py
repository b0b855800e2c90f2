"""drop_slot refuses without an explicit confirmation, and its failure reaches the run-failure
pager; both against a real slot and a real local webhook receiver."""

from __future__ import annotations

import dagster as dg
import psycopg2
import pytest

from orchestration.assets import REPLICATION_SLOT
from orchestration.jobs import drop_slot_job
from orchestration.policy.links import UiLinks
from orchestration.policy.slot_health import LagThresholds
from orchestration.policy.supervision import SupervisionPolicy
from orchestration.resources import AlertingResource, PostgresResource
from orchestration.sensors import SensorSettings, build_run_failure_alert
from tests.integration.conftest import unique_name
from tests.integration.orchestration_harness import webhook_receiver


def slot_exists(dsn: str, slot: str) -> bool:
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        cur.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (slot,))
        found = cur.fetchone() is not None
    conn.close()
    return found


def confirm(value: str) -> dict[str, object]:
    return {"ops": {"drop_replication_slot": {"config": {"confirm": value, "drop_publications": True}}}}


@pytest.fixture
def slot(fresh_db: str) -> str:
    name = unique_name("drop")
    with psycopg2.connect(fresh_db) as conn, conn.cursor() as cur:
        cur.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (name,))
        cur.execute(f"CREATE TABLE t (id int PRIMARY KEY); CREATE PUBLICATION {name} FOR TABLE t")
    conn.close()
    return name


def test_drop_slot_refuses_without_the_slots_name_and_drops_with_it(fresh_db: str, slot: str) -> None:
    resources = {"postgres": PostgresResource(dsn=fresh_db, slot=slot)}
    with pytest.raises(dg.DagsterInvalidConfigError, match="confirm"):
        drop_slot_job.execute_in_process(resources=resources)  # no run config at all

    refused = drop_slot_job.execute_in_process(
        run_config=confirm("yes"), resources=resources, raise_on_error=False
    )
    assert not refused.success
    failure = refused.get_step_failure_events()[0].step_failure_data.error
    assert failure is not None and "refusing to drop slot" in failure.message
    assert slot_exists(fresh_db, slot)

    dropped = drop_slot_job.execute_in_process(run_config=confirm(slot), resources=resources)
    assert dropped.success
    assert not slot_exists(fresh_db, slot)
    with psycopg2.connect(fresh_db) as conn, conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_publication WHERE pubname = %s", (slot,))
        assert cur.fetchone() == (0,)
    conn.close()


def test_a_failed_run_is_posted_by_the_run_failure_sensor(fresh_db: str, slot: str) -> None:
    instance = dg.DagsterInstance.ephemeral()
    failed = drop_slot_job.execute_in_process(
        run_config=confirm("no"),
        resources={"postgres": PostgresResource(dsn=fresh_db, slot=slot)},
        instance=instance,
        raise_on_error=False,
    )
    [entry] = instance.all_logs(failed.run_id, of_type=dg.DagsterEventType.RUN_FAILURE)
    run_failure = entry.dagster_event
    assert run_failure is not None
    settings = SensorSettings(
        30, LagThresholds(), SupervisionPolicy(), dg.DefaultSensorStatus.STOPPED, UiLinks("http://dagster:3000"),
        REPLICATION_SLOT, {},
    )  # fmt: skip
    sensor = build_run_failure_alert(settings)
    with webhook_receiver() as receiver:
        context = dg.build_run_status_sensor_context(
            sensor_name="run_failure_alert",
            dagster_event=run_failure,
            dagster_instance=instance,
            dagster_run=failed.dagster_run,
            resources={"alerting": AlertingResource(webhook_url=receiver.url, webhook_format="json")},
        ).for_run_failure()
        sensor(context)
        posted = receiver.received()
    instance.dispose()
    assert len(posted) == 1
    alert = posted[0]
    assert alert["action"] == "trigger"
    assert alert["component"] == "drop_slot"
    assert alert["dedup_key"] == f"bottledwater/run/drop_slot/{failed.run_id}"
    assert alert["links"][:2] == [
        {"href": f"http://dagster:3000/runs/{failed.run_id}", "text": "Run"},
        {
            "href": "http://dagster:3000/locations/__repository__@orchestration.definitions/jobs/drop_slot",
            "text": "drop_slot runs",
        },
    ]
    assert alert["links"][2]["text"] == "Runbook"
