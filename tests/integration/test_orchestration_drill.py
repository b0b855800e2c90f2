"""The on-call drill, end to end with a real Dagster daemon: a worker frozen with SIGSTOP while its
slot is driven to wal_status=lost (max_slot_wal_keep_size lowered for the test), the supervisor
declaring the frozen run dead and terminating it, the relaunched worker exiting 2 on the lost slot
and not being relaunched again, the pages that say so, and the runbook's rebuild, one command or one
launch per step: `bottledwater rebuild`, the reset_delta job, the cdc_worker job. The slot page
resolves only once the new worker is connected."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import psycopg2
import pytest
from confluent_kafka import Consumer, TopicPartition
from dagster._core.instance.ref import InstanceRef

from orchestration.jobs import DECLARED_DEAD_TAG, NEEDS_PERSON_TAG
from tests.integration.conftest import unique_name
from tests.integration.orchestration_harness import (
    PROJECT_ROOT,
    clean_environ,
    dagster_home,
    dagster_process,
    delete_topics_with_prefix,
    pipeline_env,
    wait_for,
    webhook_receiver,
)
from tests.integration.test_orchestration_supervisor import slot_holder, worker_pid, worker_runs

FIRST_RUN_TIMEOUT_S = 240
STEP_TIMEOUT_S = 240
CLI_TIMEOUT_S = 300
GRACE_S = 8
ROWS_BEFORE = 3
ROWS_WHILE_LOST = 4


@pytest.fixture
def lowered_wal_keep_size(pg_dsn: str) -> Iterator[psycopg2.extensions.connection]:
    """A superuser connection; max_slot_wal_keep_size is restored in teardown, whatever happens."""
    admin = psycopg2.connect(pg_dsn)
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute("SELECT setting, source FROM pg_settings WHERE name = 'max_slot_wal_keep_size'")
        setting, source = cur.fetchone()
    try:
        yield admin
    finally:
        with admin.cursor() as cur:
            if source == "default":
                cur.execute("ALTER SYSTEM RESET max_slot_wal_keep_size")
            else:
                cur.execute("ALTER SYSTEM SET max_slot_wal_keep_size = %s", (f"{setting}MB",))
            cur.execute("SELECT pg_reload_conf()")
        admin.close()


def lose_the_slot(admin: psycopg2.extensions.connection, db_dsn: str, slot: str) -> None:
    """Write rows and switch WAL segments past a 1MB max_slot_wal_keep_size, then checkpoint: Postgres
    invalidates the slot (and ends the walsender of the frozen worker holding it)."""
    with admin.cursor() as cur:
        cur.execute("ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'")
        cur.execute("SELECT pg_reload_conf()")
    try:
        conn = psycopg2.connect(db_dsn)
        conn.autocommit = True
        with conn.cursor() as cur:
            for i in range(ROWS_WHILE_LOST):
                cur.execute("INSERT INTO people VALUES (%s, 'written while the slot was lost')", (100 + i,))
                cur.execute("SELECT pg_switch_wal()")

            def lost() -> bool:
                cur.execute("INSERT INTO wal_filler SELECT generate_series(1, 2000)")
                cur.execute("SELECT pg_switch_wal()")
                cur.execute("CHECKPOINT")
                cur.execute("SELECT wal_status FROM pg_replication_slots WHERE slot_name = %s", (slot,))
                row = cur.fetchone()
                return row is not None and row[0] == "lost"

            wait_for(lost, "the slot to be invalidated (wal_status=lost)", STEP_TIMEOUT_S)
        conn.close()
    finally:
        with admin.cursor() as cur:
            cur.execute("ALTER SYSTEM RESET max_slot_wal_keep_size")
            cur.execute("SELECT pg_reload_conf()")


def pages(receiver: Any, component: str) -> list[dict[str, Any]]:
    return [b for b in receiver.received() if b["component"] == component]


def process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def needs_person_ticks(daemon_log: Path) -> int:
    """Supervisor ticks that decided "needs a person", as the sensor logs them."""
    return daemon_log.read_text(errors="replace").count("cdc_worker_supervisor - needs_person:")


def topic_messages(kafka_bootstrap: str, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": unique_name("drill")})
    try:
        _, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=30, cached=False)
        return int(high)
    finally:
        consumer.close()


def cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args, env=env, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=CLI_TIMEOUT_S, check=False
    )


# Alone: lowering max_slot_wal_keep_size and switching WAL segments invalidates every slot that is
# behind, the other lane's too (a lake test's worker lost its slot that way, "terminating connection
# due to administrator command", then "lost required WAL").
@pytest.mark.alone
def test_the_lost_slot_drill_from_a_frozen_worker_to_a_rebuilt_pipeline(
    *,
    fresh_db: str,
    pg_dsn: str,
    kafka_bootstrap: str,
    registry_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    lowered_wal_keep_size: psycopg2.extensions.connection,
) -> None:
    name = unique_name("drill")
    with psycopg2.connect(fresh_db) as conn, conn.cursor() as cur:
        cur.execute(
            "CREATE TABLE people (id int PRIMARY KEY, name text); CREATE TABLE wal_filler (n int);"
            "INSERT INTO people VALUES (1, 'ada'), (2, 'alan'), (3, 'grace');"
            # The publication exists before the code location loads, so that its Delta assets (and the
            # reset_delta job) are discovered; the worker adopts it.
            f"CREATE PUBLICATION {name} FOR TABLE people"
        )
    conn.close()
    bin_dir = Path(sys.executable).parent
    with webhook_receiver() as receiver, dagster_home(pg_dsn, tmp_path, unique_name("dagster")) as home:
        pipeline = pipeline_env(fresh_db, name, kafka_bootstrap, registry_url)
        env = clean_environ(
            {
                **pipeline,
                **home.env,
                "BOTTLEDWATER_TABLES": "public.people",
                "BW_WAREHOUSE": str(tmp_path / "warehouse"),
                "BW_SENSOR_INTERVAL_SECONDS": "5",
                "BW_WORKER_BACKOFF_SECONDS": "1",
                "BW_SLOT_INACTIVE_GRACE_SECONDS": str(GRACE_S),
                "BW_SLOT_MAX_LAG_SECONDS": "3600",
                "BW_ALERT_WEBHOOK_URL": receiver.url,
                "BW_ALERT_WEBHOOK_FORMAT": "json",
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
                for variable, value in home.env.items():
                    monkeypatch.setenv(variable, value)
                instance = dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(home.path)))

                def first_worker() -> tuple[str, int] | None:
                    # Streaming, past its snapshot: a worker stopped during its snapshot drops the slot
                    # it created, by design, and there would be no slot to lose.
                    runs = worker_runs(instance)
                    pid = worker_pid(instance, runs[-1].run_id) if runs else None
                    streaming = runs and any(
                        "streaming slot" in (e.user_message or "") for e in instance.all_logs(runs[-1].run_id)
                    )
                    return (
                        (runs[-1].run_id, pid) if pid and streaming and slot_holder(fresh_db, name) else None
                    )

                frozen_run, frozen_pid = wait_for(first_worker, "the first worker", FIRST_RUN_TIMEOUT_S)

                # Freeze the worker, and lose its slot while it is frozen.
                os.kill(frozen_pid, signal.SIGSTOP)
                lose_the_slot(lowered_wal_keep_size, fresh_db, name)

                # The supervisor declares the frozen run dead and terminates it: the process is gone,
                # and the run ends once, as a crash (not an operator's stop), with no failure written.
                def frozen_run_ended() -> dg.DagsterRun | None:
                    run = instance.get_run_by_id(frozen_run)
                    return run if run is not None and run.is_finished else None

                ended = wait_for(frozen_run_ended, "the frozen run to be terminated", STEP_TIMEOUT_S)
                assert ended.status is dg.DagsterRunStatus.CANCELED and DECLARED_DEAD_TAG in ended.tags
                assert not process_exists(frozen_pid)
                assert not list(instance.all_logs(frozen_run, of_type=dg.DagsterEventType.RUN_FAILURE))

                # The relaunched worker exits 2 on the lost slot; nobody relaunches it, one page says why.
                def needs_person() -> dict[str, Any] | None:
                    return next(
                        (p for p in pages(receiver, "cdc_worker") if "needs a person" in p["summary"]), None
                    )

                worker_page = wait_for(needs_person, "the needs-a-person page", STEP_TIMEOUT_S)
                assert "lost required WAL" in worker_page["summary"]
                assert any(link["text"] == "Runbook" for link in worker_page["links"])
                exited_2 = worker_runs(instance)[0]
                assert exited_2.tags[NEEDS_PERSON_TAG].startswith("startup check failed")
                daemon_log = tmp_path / "daemon.log"
                ticks_then = needs_person_ticks(daemon_log)
                wait_for(
                    lambda: needs_person_ticks(daemon_log) >= ticks_then + 2,
                    "two more supervisor ticks",
                    STEP_TIMEOUT_S,
                )
                assert worker_runs(instance)[0].run_id == exited_2.run_id  # not relaunched
                assert len([p for p in pages(receiver, "cdc_worker") if p["action"] == "trigger"]) == 1

                slot_pages = pages(receiver, "replication_slot")
                lost_page = next(p for p in slot_pages if "wal_status_lost" in p["details"]["breaches"])
                assert lost_page["severity"] == "critical"
                assert lost_page["details"]["retained_wal"] == "unknown"
                assert lost_page["details"]["behind_bytes"] > 0
                assert "behind the current WAL position" in lost_page["summary"]

                # The runbook: one command, then two launches.
                rebuilt = cli([str(bin_dir / "bottledwater"), "rebuild", "--confirm", name], env)
                assert rebuilt.returncode == 0, rebuilt.stdout + rebuilt.stderr
                assert f"deleted topic {name}.people" in rebuilt.stdout
                assert f"deleted topic {name}.bottledwater.control" in rebuilt.stdout
                assert slot_holder(fresh_db, name) is None
                table_dir = tmp_path / "warehouse" / "public" / "people" / "_delta_log"
                # What a merge leaves (the daemon's scheduled merge may have run during the drill).
                table_dir.mkdir(parents=True, exist_ok=True)
                config = json.dumps({"ops": {"reset_delta_tables": {"config": {"confirm": name}}}})
                dagster = str(bin_dir / "dagster")
                reset = cli([dagster, "job", "launch", "-w", "workspace.yaml", "-j", "reset_delta",
                             "--config-json", config], env)  # fmt: skip
                assert reset.returncode == 0, reset.stdout + reset.stderr
                wait_for(
                    lambda: not table_dir.parent.exists(), "reset_delta to delete the table", STEP_TIMEOUT_S
                )
                launched = cli([dagster, "job", "launch", "-w", "workspace.yaml", "-j", "cdc_worker"], env)
                assert launched.returncode == 0, launched.stdout + launched.stderr

                # The new worker snapshots into fresh topics, rows written while the slot was lost too;
                # the slot page resolves once it is connected, and the worker page resolves.
                wait_for(lambda: slot_holder(fresh_db, name), "the rebuilt worker", FIRST_RUN_TIMEOUT_S)
                wait_for(
                    lambda: (
                        topic_messages(kafka_bootstrap, f"{name}.people") == ROWS_BEFORE + ROWS_WHILE_LOST
                    ),
                    "the new snapshot in the topic",
                    STEP_TIMEOUT_S,
                )

                def resolved(component: str) -> dict[str, Any] | None:
                    return next((p for p in pages(receiver, component) if p["action"] == "resolve"), None)

                slot_resolve = wait_for(
                    lambda: resolved("replication_slot"), "the slot resolve", STEP_TIMEOUT_S
                )
                assert slot_resolve["details"]["worker"] == "a worker is connected"
                worker_resolve = wait_for(
                    lambda: resolved("cdc_worker"), "the worker resolve", STEP_TIMEOUT_S
                )
                assert worker_resolve["severity"] == "info"
                instance.dispose()
        finally:
            delete_topics_with_prefix(kafka_bootstrap, name)
