"""The merge's Postgres DSN: from the environment or a file, `-d` with a warning, never in a log line."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from kafka_contract.redaction import RedactingFilter, redact_text
from spark_jobs import option_parser
from spark_jobs.connections import dsn
from spark_jobs.errors import EXIT_CONFIGURATION, ConfigurationError

SECRET_DSN = "postgresql://bw:s3cret@db:5432/app"


def _resolve(argv: list[str], environ: dict[str, str]) -> tuple[str | None, str | None]:
    args = option_parser.build_parser("merge", "", environ).parse_args(
        ["-b", "k:9092", "--warehouse", "w", "--checkpoints", "c", *argv]
    )
    return dsn.merge_dsn(args.postgres_types, args.postgres_file, environ)


def test_the_environment_gives_the_dsn_without_a_warning() -> None:
    assert _resolve([], {dsn.MERGE_DSN_ENV: SECRET_DSN}) == (SECRET_DSN, None)
    assert _resolve([], {}) == (None, None)


def test_a_file_gives_the_dsn_without_a_warning(tmp_path: Path) -> None:
    path = tmp_path / "dsn"
    path.write_text(f"\n  {SECRET_DSN}  \n")
    assert _resolve(["--postgres-file", str(path)], {}) == (SECRET_DSN, None)


def test_the_dsn_on_the_command_line_still_works_with_a_warning_naming_the_safer_ways() -> None:
    value, warning = _resolve(["-d", SECRET_DSN], {dsn.MERGE_DSN_ENV: "dbname=other"})
    assert value == SECRET_DSN
    assert warning is not None
    assert dsn.MERGE_DSN_ENV in warning and "--postgres-file" in warning and "ps" in warning


@pytest.mark.parametrize(("content", "message"), [(None, "cannot read it"), ("\n \n", "the file is empty")])
def test_an_unusable_file_is_a_one_line_error(tmp_path: Path, content: str | None, message: str) -> None:
    path = tmp_path / "dsn"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigurationError, match=message) as raised:
        _resolve(["--postgres-file", str(path)], {})
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize(
    ("text", "redacted"),
    [
        (SECRET_DSN, "postgresql://bw:***@db:5432/app"),
        ("postgres://u:p@ss@h/db failed", "postgres://u:***@h/db failed"),
        ("host=db password=s3cret dbname=app", "host=db password=*** dbname=app"),
        ("host=db password='s 3cret' dbname=app", "host=db password=*** dbname=app"),
        (
            "postgresql://h/db?user=u&password=s3cret&sslmode=require",
            "postgresql://h/db?user=u&password=***&sslmode=require",
        ),
        ("no secret here", "no secret here"),
    ],
)
def test_passwords_are_redacted_in_every_dsn_form(text: str, redacted: str) -> None:
    assert redact_text(text) == redacted


def test_log_lines_through_the_filter_carry_no_password(caplog: pytest.LogCaptureFixture) -> None:
    caplog.handler.addFilter(RedactingFilter())
    with caplog.at_level(logging.INFO):
        logging.getLogger("spark_jobs.test").info("typing from %s", SECRET_DSN)
        try:
            raise RuntimeError(f"cannot connect to {SECRET_DSN}")
        except RuntimeError:
            logging.getLogger("spark_jobs.test").exception("merging failed")
    assert "s3cret" not in caplog.text
    assert "bw:***@db" in caplog.text


def test_the_merge_command_line_warns_about_a_dsn_given_with_d_and_never_logs_its_password(
    caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    from spark_jobs import merge

    with caplog.at_level(logging.WARNING):
        code = merge.main(["-d", SECRET_DSN, "-b", "k:9092", "--warehouse", "w", "--checkpoints", "c"])
    assert code == EXIT_CONFIGURATION
    assert capsys.readouterr().err == "name the topics: --topic (repeatable) or --topic-pattern\n"
    assert dsn.CLI_WARNING in caplog.text
    assert "s3cret" not in caplog.text
