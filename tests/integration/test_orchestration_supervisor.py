"""The CDC worker supervisor, run by a real Dagster daemon against the stack: it launches a worker,
and relaunches it after the worker process is killed."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import dagster as dg
import psycopg2
import pytest
from dagster._core.instance.ref import InstanceRef

from orchestration.jobs import CDC_WORKER_JOB
from tests.integration.conftest import unique_name
from tests.integration.orchestration_harness import (
    clean_environ,
    dagster_home,
    dagster_process,
    delete_topics_with_prefix,
    pipeline_env,
    wait_for,
)

# Starting the daemon, its code server and then a run process each import Dagster and the project.
FIRST_RUN_TIMEOUT_S = 240
RELAUNCH_TIMEOUT_S = 180
STARTED_PID = re.compile(r"bottledwater started \(pid (\d+)\)")


def worker_runs(instance: dg.DagsterInstance) -> list[dg.DagsterRun]:
    return list(instance.get_runs(filters=dg.RunsFilter(job_name=CDC_WORKER_JOB)))  # newest first


def worker_pid(instance: dg.DagsterInstance, run_id: str) -> int | None:
    for entry in instance.all_logs(run_id):
        match = STARTED_PID.search(entry.user_message or "")
        if match:
            return int(match.group(1))
    return None


def slot_holder(db_dsn: str, slot: str) -> int | None:
    """The walsender pid streaming the slot, once a worker is connected."""
    with psycopg2.connect(db_dsn) as conn, conn.cursor() as cur:
        cur.execute("SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s", (slot,))
        row = cur.fetchone()
    conn.close()
    return None if row is None else row[0]


def test_the_supervisor_launches_a_worker_and_relaunches_it_after_a_kill(
    *,
    fresh_db: str,
    pg_dsn: str,
    kafka_bootstrap: str,
    registry_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    name = unique_name("sup")
    with psycopg2.connect(fresh_db) as conn, conn.cursor() as cur:
        cur.execute(
            "CREATE TABLE people (id int PRIMARY KEY, name text); INSERT INTO people VALUES (1, 'ada')"
        )
    conn.close()
    with dagster_home(pg_dsn, tmp_path, unique_name("dagster")) as home:
        env = clean_environ(
            {
                **pipeline_env(fresh_db, name, kafka_bootstrap, registry_url),
                **home.env,
                "BW_SENSOR_INTERVAL_SECONDS": "5",
                "BW_WORKER_BACKOFF_SECONDS": "1",
                "BW_AUTOMATION": "running",
                # The worker's supervision under test: the schedule's merges, not a continuous merge's
                # Spark application beside it for the whole test.
                "BW_MERGE_MODE": "scheduled",
            }
        )
        try:
            with dagster_process(
                ["dagster-daemon", "run", "-w", "workspace.yaml"], env, tmp_path / "daemon.log"
            ):
                for variable, value in home.env.items():  # the instance file reads its URL from here
                    monkeypatch.setenv(variable, value)
                instance = dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(home.path)))

                def first_worker() -> tuple[str, int] | None:
                    runs = worker_runs(instance)
                    pid = worker_pid(instance, runs[-1].run_id) if runs else None
                    return (runs[-1].run_id, pid) if pid and slot_holder(fresh_db, name) else None

                first_run, first_pid = wait_for(
                    first_worker, "the supervisor's first worker", FIRST_RUN_TIMEOUT_S
                )
                first_holder = slot_holder(fresh_db, name)

                os.kill(first_pid, signal.SIGKILL)

                def relaunched() -> tuple[dg.DagsterRun, int] | None:
                    runs = worker_runs(instance)
                    if len(runs) < 2 or runs[0].run_id == first_run:
                        return None
                    pid = worker_pid(instance, runs[0].run_id)
                    holder = slot_holder(fresh_db, name)
                    return (runs[0], pid) if pid and holder and holder != first_holder else None

                second, second_pid = wait_for(relaunched, "the relaunched worker", RELAUNCH_TIMEOUT_S)
                crashed = instance.get_run_by_id(first_run)
                assert crashed is not None and crashed.status is dg.DagsterRunStatus.FAILURE
                assert second.tags["dagster/sensor_name"] == "cdc_worker_supervisor"
                assert second.tags["dagster/run_key"] == f"after-{first_run}"
                assert second_pid != first_pid
                failures = [
                    e.dagster_event.step_failure_data.error.message
                    for e in instance.all_logs(first_run, of_type=dg.DagsterEventType.STEP_FAILURE)
                    if e.dagster_event
                    and e.dagster_event.step_failure_data
                    and e.dagster_event.step_failure_data.error
                ]
                assert any("killed by signal 9" in m for m in failures), failures
                instance.dispose()
        finally:
            delete_topics_with_prefix(kafka_bootstrap, name)
