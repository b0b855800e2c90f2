"""Faults and bad input answered in one line, and no secret in any of them (issue 13): the worker's
command line run in-process against addresses where nothing listens, so every failure is real."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import psycopg2
import pytest

from cdc_worker.cli import main
from cdc_worker.config import ConfigError, checked_dsn
from cdc_worker.core.errors import InfrastructureError
from cdc_worker.core.redaction import normalize_dsn, redact_dsn, redact_text
from cdc_worker.shell.stream.heartbeat import StatusChannel
from orchestration.worker_process import parse_worker_line

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
    assert channel.read_message() is None
    with pytest.raises(InfrastructureError, match=r"^Postgres connection failed: no COPY in progress$"):
        channel.send(42)


def test_an_sql_error_on_the_stream_stays_what_it_is() -> None:
    channel = StatusChannel()
    channel.cursor = FakeUndefinedPublicationCursor()
    with pytest.raises(psycopg2.ProgrammingError):
        channel.read_message()


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
