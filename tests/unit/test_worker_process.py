"""How the cdc_worker job runs `bottledwater`: its JSON log lines, its environment, its exit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from orchestration.resources import KafkaResource, PostgresResource, SchemaRegistryResource
from orchestration.worker_config import worker_config, worker_environment
from orchestration.worker_process import (
    LogLevel,
    WorkerLine,
    last_error,
    parse_worker_line,
    run_worker,
    stop,
)


def test_a_json_log_line_keeps_its_level_message_extras_and_exception() -> None:
    record = {"ts": "t", "level": "warning", "logger": "cdc_worker.shell.stream.session", "message": "slow"}
    line = json.dumps({**record, "lsn": "0/16B3748", "table": "public.people", "exception": "Traceback ..."})
    parsed = parse_worker_line(line + "\n")
    assert parsed.level is LogLevel.WARNING
    assert parsed.text == "slow (lsn=0/16B3748, table=public.people)\nTraceback ..."


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("plain text from a library\n", WorkerLine(LogLevel.INFO, "plain text from a library")),
        ('{"not": "a log record"}', WorkerLine(LogLevel.INFO, '{"not": "a log record"}')),
        ('{"level": "critical", "message": "boom"}', WorkerLine(LogLevel.ERROR, "boom")),
        ('{"level": "shouting", "message": "odd"}', WorkerLine(LogLevel.INFO, "odd")),
        ("[1, 2]", WorkerLine(LogLevel.INFO, "[1, 2]")),
    ],
)
def test_anything_else_is_info_text(line: str, expected: WorkerLine) -> None:
    assert parse_worker_line(line) == expected


def resources() -> tuple[PostgresResource, KafkaResource, SchemaRegistryResource]:
    return (
        PostgresResource(dsn="postgresql://u:secret@db/app", slot="s1", tables=["public.*", "inventory.x"]),
        KafkaResource(bootstrap_servers="k1:9092,k2:9092", topic_prefix="app", message_format="json",
                      client_config={"security.protocol": "SASL_SSL", "sasl.jaas.config": "a=b,c"}),
        SchemaRegistryResource(url="http://registry:8081"),
    )  # fmt: skip


def test_the_resources_become_the_workers_own_variables() -> None:
    env = worker_environment(*resources())
    assert env == {
        "BOTTLEDWATER_POSTGRES": "postgresql://u:secret@db/app",
        "BOTTLEDWATER_SLOT": "s1",
        "BOTTLEDWATER_PUBLICATION": "s1",
        "BOTTLEDWATER_BROKER": "k1:9092,k2:9092",
        "BOTTLEDWATER_OUTPUT_FORMAT": "json",
        "BOTTLEDWATER_TABLES": "public.*,inventory.x",
        "BOTTLEDWATER_TOPIC_PREFIX": "app",
        # ';' separates settings: a value may hold commas.
        "BOTTLEDWATER_KAFKA_CONFIG": "security.protocol=SASL_SSL;sasl.jaas.config=a=b,c",
        "BOTTLEDWATER_SCHEMA_REGISTRY": "http://registry:8081",
    }


def test_the_worker_reads_back_what_the_resources_said_and_the_environment_the_rest() -> None:
    config = worker_config(
        *resources(), environ={"BOTTLEDWATER_ON_ERROR": "log", "BOTTLEDWATER_SLOT": "ignored"}
    )
    assert (config.slot, config.publication_name, config.topic_prefix) == ("s1", "s1", "app")
    assert config.tables == ("public.*", "inventory.x")
    assert config.kafka_config == {"security.protocol": "SASL_SSL", "sasl.jaas.config": "a=b,c"}
    assert config.on_error.value == "log"  # not a resource setting: from the environment


def test_the_dagster_worker_takes_partitions_columns_and_row_filters_in_the_clis_syntax() -> None:
    environ = {
        "BOTTLEDWATER_PARTITIONS": "leaf",
        "BOTTLEDWATER_EXCLUDE_COLUMNS": "shop.users=password_hash,national_id",
        "BOTTLEDWATER_ROW_FILTER": "shop.orders=region = 'eu';invoices=tenant_id = 42",
    }
    config = worker_config(*resources(), environ=environ)
    assert config.partitions.value == "leaf"
    assert config.exclude_columns == (("shop.users", "password_hash,national_id"),)
    assert config.row_filter == (("shop.orders", "region = 'eu'"), ("invoices", "tenant_id = 42"))
    flags = {"columns": ["shop.users=id,email"], "row_filter": ["shop.orders=total > 0"]}
    config = worker_config(*resources(), overrides=flags, environ=environ)
    assert config.columns == (("shop.users", "id,email"),) and config.row_filter == (
        ("shop.orders", "total > 0"),
    )


def test_run_worker_streams_every_line_and_returns_the_exit_status() -> None:
    record = json.dumps({"level": "info", "message": "one"})
    script = f"print({record!r}); print('two'); raise SystemExit(3)"
    lines: list[WorkerLine] = []
    started: list[int] = []
    code = run_worker([sys.executable, "-c", script], {}, lines.append, started.append)
    assert code == 3
    assert [line.text for line in lines] == ["one", "two"]
    assert len(started) == 1 and started[0] > 0


def test_an_error_while_streaming_stops_the_child_and_is_raised() -> None:
    script = "import time\nprint('ready', flush=True)\ntime.sleep(60)"

    def explode(_: WorkerLine) -> None:
        raise KeyboardInterrupt  # what a terminated Dagster run raises in the op's thread

    began = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        run_worker([sys.executable, "-c", script], {}, explode)
    assert time.monotonic() - began < 30  # the child was stopped, not waited for


def test_the_reason_is_the_last_error_line() -> None:
    lines = [
        WorkerLine(LogLevel.INFO, "connecting"),
        WorkerLine(LogLevel.ERROR, "startup check failed: slot bw has lost required WAL\ntraceback"),
        WorkerLine(LogLevel.INFO, "exiting"),
    ]
    assert last_error(lines) == "startup check failed: slot bw has lost required WAL"
    assert last_error([WorkerLine(LogLevel.INFO, "only this")]) == "only this"
    assert last_error([]) == "no output"


def test_stopping_a_frozen_worker_lets_it_shut_down_cleanly() -> None:
    # The child exits 0 from its SIGTERM handler; frozen with SIGSTOP it only can once continued.
    script = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\n"
        "print('ready', flush=True)\n"
        "time.sleep(600)"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    os.kill(proc.pid, signal.SIGSTOP)
    assert stop(proc) == 0  # its own handler ran: not SIGKILLed (-9) after the timeout


def test_the_snapshot_engine_chosen_in_dagster_reaches_the_worker_and_a_wrong_one_fails_the_step() -> None:
    import dagster as dg

    from orchestration.assets import SlotConfig, SnapshotConfig, _start_worker

    assert SlotConfig().snapshot_engine == SnapshotConfig().snapshot_engine == "worker"
    assert worker_config(*resources(), overrides={"snapshot_engine": "spark"}).snapshot_engine == "spark"
    with pytest.raises(dg.Failure, match="snapshot-engine"):
        _start_worker(*resources(), skip_snapshot=False, snapshot_engine="hadoop")
