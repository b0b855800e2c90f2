"""Faults and bad input answered in one line, and no secret in any of them: the worker's
command line run in-process against addresses where nothing listens, so every failure is real."""

from __future__ import annotations

import datetime
import io
import logging
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import fastavro
import psycopg2
import pytest

from cdc_worker.cli import main
from cdc_worker.config import ConfigError, checked_dsn
from cdc_worker.core.ack import FailurePolicy
from cdc_worker.core.encoding.avro_schema import value_schema
from cdc_worker.core.encoding.json_serializer import JsonEventSerializer
from cdc_worker.core.encoding.serializers import EncodedMessage
from cdc_worker.core.errors import InfrastructureError
from cdc_worker.core.model import Column, TableSchema
from cdc_worker.core.pgtypes.mapping import table_column_types
from cdc_worker.core.pgtypes.oids import PgType
from cdc_worker.core.pgtypes.temporal import date_days, timestamp_micros, timestamptz_micros
from cdc_worker.shell.kafka_publisher import KafkaPublisher
from cdc_worker.shell.snapshot.chunks import ChunkReader, SnapshotSpec
from cdc_worker.shell.snapshot.reader import SnapshotReader
from cdc_worker.shell.stream.heartbeat import StatusChannel
from cdc_worker.shell.stream.session import StreamSession
from kafka_contract.redaction import normalize_dsn, redact_dsn, redact_text
from orchestration.worker_process import parse_worker_line
from stack import process
from stack.errors import StackError

SECRET = "s3cr3t-Pw"
# Port 1 on loopback: nothing listens there, so a connection is refused at once.
NOWHERE = "127.0.0.1:1"
DSN_FORMS = [
    f"postgresql://bob:{SECRET}@{NOWHERE}/app",
    f"host=127.0.0.1 port=1 dbname=app user=bob password={SECRET}",
    f"bob:{SECRET}@{NOWHERE}/app",
    f"postgresql://{NOWHERE}/app?user=bob&password={SECRET}&sslmode=disable",
]


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    yield
    logging.getLogger().handlers.clear()


@pytest.mark.parametrize("dsn", DSN_FORMS)
def test_every_dsn_form_is_redacted(dsn: str) -> None:
    assert SECRET not in redact_dsn(dsn)
    assert SECRET not in redact_text(f'invalid dsn: missing "=" after "{dsn}" in connection info string')
    assert "***" in redact_dsn(dsn)


def test_redaction_keeps_what_is_not_secret() -> None:
    assert redact_dsn(f"bob:{SECRET}@db:5432/app") == "bob:***@db:5432/app"
    assert (
        redact_dsn("postgresql://db/x?password=p&sslmode=require")
        == "postgresql://db/x?password=***&sslmode=require"
    )
    assert redact_dsn(f"postgres://bob:p@ss{SECRET}@db/x") == "postgres://bob:***@db/x"
    assert redact_text("at 12:30 mail x@example.com") == "at 12:30 mail x@example.com"


@pytest.mark.parametrize(
    "line",
    [
        f"spark.hadoop.fs.s3a.secret.key={SECRET}",
        f"--conf spark.hadoop.fs.s3a.bucket.lake.secret.key={SECRET} --conf x=y",
        f"AWS_SECRET_ACCESS_KEY={SECRET}",
        f"{{'fs.s3a.secret.key': '{SECRET}', 'fs.s3a.endpoint': 'http://minio:9000'}}",
        f"fs.s3a.session.token = {SECRET}",
        f"BW_SPARK_CONF: 'fs.azure.account.key.acct.dfs.core.windows.net:{SECRET}' ... secretKey:{SECRET}",
    ],
)
def test_object_store_secrets_quoted_as_settings_are_redacted(line: str) -> None:
    assert SECRET not in redact_text(line)
    assert "***" in redact_text(line)


def test_object_store_settings_that_are_not_secret_are_kept() -> None:
    line = "fs.s3a.access.key=AKIA123 fs.s3a.endpoint=http://minio:9000 path.style.access=true"
    assert redact_text(line) == line
    assert redact_text("a secret key: set it in the environment") == "a secret key: set it in the environment"


def test_a_dsn_without_scheme_is_completed_and_others_kept() -> None:
    assert normalize_dsn(f"bob:{SECRET}@db:5432/app") == f"postgresql://bob:{SECRET}@db:5432/app"
    assert normalize_dsn("bob@db/app") == "postgresql://bob@db/app"
    for kept in ("host=db dbname=app", "postgresql://db/app", "service=prod"):
        assert normalize_dsn(kept) == kept


def test_an_unreadable_dsn_is_a_configuration_error_that_quotes_nothing() -> None:
    with pytest.raises(ConfigError) as caught:
        checked_dsn(f"bob:{SECRET[:3]} {SECRET[3:]}@db/app")  # a blank inside the password
    message = str(caught.value)
    assert SECRET[:3] not in message and SECRET[3:] not in message
    assert "postgresql://user:password@host:port/dbname" in message


@pytest.mark.parametrize("dsn", DSN_FORMS)
def test_the_worker_never_prints_the_password(dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["-d", dsn, "-f", "json", "-b", NOWHERE])
    out, err = capsys.readouterr()
    assert code == 1, err
    assert SECRET not in out + err
    errors = [line for line in err.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and "Postgres connection failed: " in errors[0], err
    assert "Traceback" not in err
    assert not any(line[:1].isspace() for line in err.splitlines()), "libpq's hint on a line of its own"


def test_an_unknown_kafka_setting_exits_2_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["-d", DSN_FORMS[0], "-f", "json", "-b", NOWHERE, "-C", "no.such.setting=1"])
    _, err = capsys.readouterr()
    assert code == 2
    errors = [line for line in err.splitlines() if " ERROR " in line]
    assert len(errors) == 1, err
    assert '"no.such.setting"' in errors[0] and "--config-help" in errors[0]
    assert "Traceback" not in err and SECRET not in err


class FakeEndedCopyCursor:
    """Fake (a Postgres restart cannot be staged in a unit test): a replication cursor after a
    server shutting down `-m fast` has ended the COPY stream. libpq then reports a status update
    as an error with no SQLSTATE, `no COPY in progress`; psycopg2 raises a bare DatabaseError."""

    def read_message(self) -> None:
        return None

    def send_feedback(self, **_kwargs: object) -> None:
        raise psycopg2.DatabaseError("no COPY in progress\n")


class FakeUndefinedPublicationCursor:
    """Fake: the server refusing the stream with an SQL error (it carries a SQLSTATE)."""

    def read_message(self) -> None:
        error = psycopg2.errors.lookup("42704")  # undefined_object
        raise error('publication "gone" does not exist')


def test_a_stream_ended_by_a_restart_is_a_lost_connection() -> None:
    channel = StatusChannel()
    channel.cursor = FakeEndedCopyCursor()
    assert channel.read_payloads(10) == []
    with pytest.raises(InfrastructureError, match=r"^Postgres connection failed: no COPY in progress$"):
        channel.send(42)


def test_an_sql_error_on_the_stream_stays_what_it_is() -> None:
    channel = StatusChannel()
    channel.cursor = FakeUndefinedPublicationCursor()
    with pytest.raises(psycopg2.ProgrammingError):
        channel.read_payloads(10)


def test_lines_forwarded_to_dagster_are_redacted() -> None:
    """The supervisor forwards every worker line to the run log, plain lines too (a traceback
    printed before logging was set up, a library's own warning)."""
    plain = parse_worker_line(f'psycopg2.ProgrammingError: missing "=" after "bob:{SECRET}@db/app"')
    structured = parse_worker_line(
        '{"level": "error", "message": "x", "exception": "password='
        + SECRET
        + '", "dsn": "bob:'
        + SECRET
        + '@h/d"}'
    )
    assert SECRET not in plain.text and SECRET not in structured.text


def _docs_block(marker: str) -> str:
    text = (Path(__file__).parents[2] / "docs" / "types.md").read_text()
    after = text[text.index(marker) :]
    return after.split("```python\n", 1)[1].split("```", 1)[0]


def test_the_documented_fastavro_recipe_reads_the_infinity_sentinels() -> None:
    """docs/types.md says fastavro's default reader fails on the sentinels and shows how to read
    them: both checked on the worker's own value schema and sentinels."""
    columns = (
        Column("id", PgType.INT4, -1),
        Column("d", PgType.DATE, -1),
        Column("ts", PgType.TIMESTAMP, -1),
        Column("tstz", PgType.TIMESTAMPTZ, -1),
    )
    table = TableSchema(1, "public", "events", columns, key_columns=("id",))
    schema = value_schema(table, table_column_types(table, {}))
    row = {
        "id": 1,
        "d": date_days("infinity"),
        "ts": timestamp_micros("-infinity"),
        "tstz": timestamptz_micros("infinity"),
    }
    body = io.BytesIO()
    fastavro.schemaless_writer(body, fastavro.parse_schema(schema), row)
    payload = b"\x00" + (1).to_bytes(4, "big") + body.getvalue()
    with pytest.raises(OverflowError):
        fastavro.schemaless_reader(io.BytesIO(payload[5:]), fastavro.parse_schema(schema), None)

    recipe: dict[str, Any] = {}
    exec(_docs_block("tests/unit/test_hardening.py runs this block"), recipe)
    value = recipe["read_value"](payload, schema)
    assert value == row
    assert recipe["as_date"](value["d"]) == "infinity"
    assert recipe["as_timestamp"](value["ts"]) == "-infinity"
    assert recipe["as_timestamp"](value["tstz"]) == "infinity"
    assert recipe["as_date"](date_days("2024-02-29")) == datetime.date(2024, 2, 29)
    assert recipe["as_timestamp"](timestamptz_micros("2024-02-29 12:00:00+00")) == datetime.datetime(
        2024, 2, 29, 12, tzinfo=datetime.UTC
    )


# -- a broker outage is told in a few lines, not one per message ---------------------------------

UNDELIVERED = 200
# No broker at NOWHERE: every message times out in the producer after this long, for real.
QUICK_TIMEOUT = {"message.timeout.ms": "300", "log_level": "0"}


def _messages(topic: str) -> list[EncodedMessage]:
    return [EncodedMessage(topic, str(i).encode(), b"{}", []) for i in range(UNDELIVERED)]


def _error_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_undelivered_snapshot_rows_are_one_line_and_a_count(caplog: pytest.LogCaptureFixture) -> None:
    publisher = KafkaPublisher(NOWHERE, QUICK_TIMEOUT)
    publisher.open()
    spec = SnapshotSpec("host=nowhere", "snap", 42, datetime.datetime.now(datetime.UTC))
    snapshot = SnapshotReader(
        spec=spec,
        tables=[],
        workers=1,
        publisher=publisher,
        serializer_factory=lambda: lambda event: None,
        policy=FailurePolicy.EXIT,
        use_rich=False,
    )
    chunk_reader = ChunkReader(spec, publisher, lambda event: None, snapshot)
    for message in _messages("bw.public.t"):
        publisher.produce(message, partial(chunk_reader.on_delivery, "public.t"))
    with caplog.at_level(logging.INFO):
        assert publisher.flush(30) == 0
        snapshot.log_failure_summary()
    lines = _error_lines(caplog)
    assert len(lines) == 2, lines
    assert "snapshot row of public.t not delivered" in lines[0]
    assert f"{UNDELIVERED} in all" in lines[1] and "public.t" in lines[1]


def test_undelivered_changes_are_one_line_and_a_count(caplog: pytest.LogCaptureFixture) -> None:
    publisher = KafkaPublisher(NOWHERE, QUICK_TIMEOUT)
    publisher.open()
    session = StreamSession(
        repl_conn=None,  # type: ignore[arg-type]  # nothing is read: the changes are produced directly
        catalog=None,  # type: ignore[arg-type]
        slot="s",
        publications=["p"],
        start_lsn=0,
        publisher=publisher,
        serializer=JsonEventSerializer({}),
        type_infos={},
        policy=FailurePolicy.EXIT,
        allow_unkeyed=True,
        status_interval=10.0,
    )
    for message in _messages("bw.public.t"):
        session.produce_tracked(message, "public.t", "c")
    with caplog.at_level(logging.INFO):
        assert session.shutdown() is False
    lines = _error_lines(caplog)
    assert len(lines) == 3, lines  # the first failure, the count, and why the stream stopped
    assert "change of public.t not delivered" in lines[0]
    assert f"{UNDELIVERED} in all" in lines[1]
    assert lines[2].startswith("stopped after an error")


# -- bw-stack start-up: every failure shows what the command said, a transient one is retried -------


def test_a_start_up_command_failing_twice_shows_its_stderr_and_stdout(tmp_path: Path) -> None:
    said: list[str] = []
    said_on_stderr = "echo 'SLF4J: noise' >&2; echo 'is already formatted' >&2"
    script = f"echo 'Formatting metadata directory'; {said_on_stderr}; exit 1"
    with pytest.raises(StackError) as caught:
        process.run_retrying_once(None, ["sh", "-c", script], "formatting Kafka's storage", say=said.append)
    message = str(caught.value)
    assert "is already formatted" in message and "Formatting metadata directory" in message
    assert "exit code 1" in message and "SLF4J" not in message
    assert len(said) == 1 and "retrying once" in said[0] and "is already formatted" in said[0]


def test_a_transient_start_up_failure_is_retried_once_with_its_reason(tmp_path: Path) -> None:
    said: list[str] = []
    marker = tmp_path / "tried"
    # Fails the first time (leaving a marker), succeeds the second: a real transient failure.
    script = (
        f"if [ -e {marker} ]; then echo formatted; else touch {marker}; echo 'out of memory' >&2; exit 1; fi"
    )
    result = process.run_retrying_once(
        None, ["sh", "-c", script], "formatting Kafka's storage", say=said.append
    )
    assert result.returncode == 0 and result.stdout.strip() == "formatted"
    assert said == ["bw-stack: formatting Kafka's storage failed (exit code 1: out of memory); retrying once"]
