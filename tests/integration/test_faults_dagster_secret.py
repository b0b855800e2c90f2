"""The Dagster run log never holds the Postgres password, nor the Kafka ones.

The `cdc_worker` job runs for real (`dagster job execute` on the repository's code location, against a
Dagster instance of its own on the stack's Postgres) with `BOTTLEDWATER_POSTGRES` carrying a
password, streams, and is stopped. Then everything the instance keeps of the run is searched: every
event of the event log (the worker's forwarded lines among them), the run record (config, tags), the
job snapshot, the captured stdout/stderr files, and the command's own output. The stack's Postgres
trusts loopback connections, so it accepts the password and ignores it: the worker runs for real.

One of the runs (the URL form) is on the stack's secured Kafka cluster, its SASL passwords in the
Dagster resource's variables (`BOTTLEDWATER_KAFKA_CONFIG` for the worker,
`BOTTLEDWATER_MERGE_KAFKA_CONFIG` for Dagster's own reads), as a deployment passes them: the worker's
`/metrics`, its process list entry and the run's, and the materialization metadata of the slot asset
(materialized in-process afterwards, the worker's startup reading the same variables) are searched
for them too. (`--help` beside those variables: test_kafka_secured.py.)
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import dagster as dg
import psycopg2
import pytest
from dagster._core.instance.ref import InstanceRef
from dagster._serdes import serialize_value

from kafka_contract.redaction import redact_dsn
from orchestration import assets
from orchestration.definitions import build_resources
from orchestration.jobs import CDC_WORKER_JOB
from orchestration.resources import KafkaResource
from orchestration.settings import load_settings
from stack.kafka_cluster import MERGE, WORKER
from tests.integration.conftest import unique_name
from tests.integration.orchestration_harness import (
    PROJECT_ROOT,
    clean_environ,
    dagster_home,
    delete_topics_with_prefix,
    pipeline_env,
    stop_group,
    wait_for,
)
from tests.integration.secured_kafka import SecuredKafka
from tests.integration.worker_harness import free_port

PASSWORD = "dagster-pw-n0t-f0r-run-l0gs"
# Loading the code location, then the worker's snapshot, on a loaded machine.
STREAMING_TIMEOUT_S = 300
STOP_TIMEOUT_S = 120
STARTED_PID = re.compile(r"bottledwater started \(pid (\d+)\)")


def _with_password(dsn: str, form: str) -> str:
    """`dsn` with a password, in a form libpq accepts."""
    parts = urlsplit(dsn)
    user, host, port, db = parts.username, parts.hostname, parts.port, parts.path.lstrip("/")
    return {
        "url": urlunsplit(parts._replace(netloc=f"{user}:{PASSWORD}@{host}:{port}")),
        "key=value": f"host={host} port={port} dbname={db} user={user} password={PASSWORD}",
        "?password=": f"postgresql://{host}:{port}/{db}?user={user}&password={PASSWORD}&sslmode=disable",
    }[form]


def _messages(instance: dg.DagsterInstance, run_id: str) -> list[str]:
    return [entry.user_message or "" for entry in instance.all_logs(run_id)]


def _files_text(root: Path) -> str:
    """Every file under `root` (the instance's folder: captured logs, anything else it wrote)."""
    return "\n".join(p.read_bytes().decode(errors="replace") for p in sorted(root.rglob("*")) if p.is_file())


def _cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")


@pytest.mark.parametrize("form", ["url", "key=value", "?password="])
def test_the_dagster_run_log_never_holds_the_password(
    form: str,
    *,
    request: pytest.FixtureRequest,
    fresh_db: str,
    pg_dsn: str,
    kafka_bootstrap: str,
    registry_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with psycopg2.connect(fresh_db) as conn, conn.cursor() as cur:
        cur.execute(
            "CREATE TABLE people (id int PRIMARY KEY, name text); INSERT INTO people VALUES (1, 'ada')"
        )
    conn.close()
    dsn = _with_password(fresh_db, form)
    name = unique_name("secret")
    output = tmp_path / "dagster-job.log"
    secured: SecuredKafka | None = request.getfixturevalue("secured_kafka") if form == "url" else None
    secrets, bootstrap, kafka_env = [PASSWORD], kafka_bootstrap, {}
    metrics_port = free_port()
    if secured is not None:
        secured.grant(name)
        bootstrap = secured.bootstrap
        merge_config = secured.worker_env(MERGE)["BOTTLEDWATER_KAFKA_CONFIG"]
        kafka_env = {
            **secured.worker_env(WORKER),
            "BOTTLEDWATER_MERGE_KAFKA_CONFIG": merge_config,
            "BOTTLEDWATER_METRICS_PORT": str(metrics_port),
        }
        secrets += [secured.password(WORKER), secured.password(MERGE)]
    with dagster_home(pg_dsn, tmp_path, unique_name("dagster")) as home:
        pipeline = {**pipeline_env(dsn, name, bootstrap, registry_url), **kafka_env}
        env = clean_environ({**pipeline, **home.env, "BW_AUTOMATION": "stopped"})
        for variable, value in home.env.items():  # the instance file reads its URL from here
            monkeypatch.setenv(variable, value)
        instance = dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(home.path)))
        dagster = str(Path(sys.executable).parent / "dagster")
        try:
            with output.open("wb") as out:
                job = subprocess.Popen(
                    # workspace.yaml's code location, run in this process against the instance.
                    [
                        dagster,
                        "job",
                        "execute",
                        "-m",
                        "orchestration.definitions",
                        "-d",
                        ".",
                        "-j",
                        CDC_WORKER_JOB,
                    ],
                    cwd=PROJECT_ROOT,
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            try:

                def streaming() -> tuple[str, int] | None:
                    if job.poll() is not None:
                        raise AssertionError(
                            f"the job ended ({job.returncode}) before streaming:\n"
                            f"{output.read_text(errors='replace')[-4000:]}"
                        )
                    runs = list(instance.get_runs(filters=dg.RunsFilter(job_name=CDC_WORKER_JOB)))
                    if not runs:
                        return None
                    messages = _messages(instance, runs[0].run_id)
                    pids = [int(m.group(1)) for m in map(STARTED_PID.search, messages) if m]
                    if pids and any("streaming slot" in m for m in messages):
                        return runs[0].run_id, pids[0]
                    return None

                run_id, worker_pid = wait_for(
                    streaming, "the worker to stream in the run", STREAMING_TIMEOUT_S
                )
                live: dict[str, str] = {}
                if secured is not None:
                    url = f"http://127.0.0.1:{metrics_port}/metrics"
                    with urllib.request.urlopen(url, timeout=10) as response:
                        live["the worker's /metrics"] = response.read().decode()
                    live["process list"] = _cmdline(worker_pid) + "\n" + _cmdline(job.pid)
                os.kill(worker_pid, signal.SIGTERM)  # the worker stops cleanly, so does the run
                job.wait(STOP_TIMEOUT_S)
            finally:
                stop_group(job)  # whatever is left of the command's process group

            run = instance.get_run_by_id(run_id)
            assert run is not None and run.status is dg.DagsterRunStatus.SUCCESS, run and run.status
            entries = instance.all_logs(run_id)
            messages = [entry.user_message or "" for entry in entries]
            assert any("bottledwater stopped cleanly" in m for m in messages), messages[-20:]
            places = {
                "event log": "\n".join(serialize_value(entry) for entry in entries),
                "run record": serialize_value(run),
                "job snapshot": serialize_value(instance.get_job_snapshot(run.job_snapshot_id))
                if run.job_snapshot_id
                else "",
                "instance folder (captured stdout/stderr)": _files_text(home.path),
                "dagster job execute's output": output.read_text(errors="replace"),
            }
            if secured is not None:
                places.update(live)
                places["slot asset's materialization"] = _materialize_slot(
                    instance, pipeline, f"{name}.people", monkeypatch
                )
            instance.dispose()
            for place, text in places.items():
                for secret in secrets:
                    assert secret not in text, f"a password in the {place}"
            # What is there instead: the worker's start line with the DSN redacted.
            redacted = redact_dsn(dsn)
            assert redacted != dsn and "***" in redacted
            assert any(redacted in m for m in messages if "starting with" in m), [
                m for m in messages if "starting with" in m
            ]
        finally:
            if secured is not None:
                secured.delete_prefix(name)
            else:
                delete_topics_with_prefix(kafka_bootstrap, name)


def _materialize_slot(
    instance: dg.DagsterInstance, pipeline: dict[str, str], topic: str, monkeypatch: pytest.MonkeyPatch
) -> str:
    """The slot asset materialized in this process with the code location's resources (the worker's
    startup resumes the slot on the secured cluster); returns everything its run recorded. Dagster's
    own read of the topic goes through the merge's variable, as the sensors' do."""
    for variable, value in pipeline.items():
        monkeypatch.setenv(variable, value)
    resources = build_resources(load_settings(os.environ))
    result = dg.materialize([assets.replication_slot], resources=resources, instance=instance)
    assert result.success
    kafka = resources["kafka"]
    assert isinstance(kafka, KafkaResource)
    assert kafka.end_offsets([topic]) == {topic: 1}
    materialized = result.get_asset_materialization_events()
    assert materialized and materialized[0].materialization.metadata["exists"].value is True
    return "\n".join(serialize_value(entry) for entry in instance.all_logs(result.run_id))
