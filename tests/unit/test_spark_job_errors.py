"""The Spark jobs' errors by kind: each kind's exit code, every job error's kind (and the base its
callers already catch), and a job's command line refusing bad options in one line with exit 2."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence

import psycopg2
import pytest

from spark_jobs.connections.kafka_client import KafkaOptionError
from spark_jobs.connections.postgres_catalog import TableNotFoundError
from spark_jobs.connections.postgres_connect import PostgresUnreachable
from spark_jobs.connections.registry import SchemaRegistryError
from spark_jobs.decoding.spark_types import SchemaMappingError
from spark_jobs.errors import (
    EXIT_CONFIGURATION,
    EXIT_DATA,
    EXIT_INFRASTRUCTURE,
    ConfigurationError,
    DataError,
    ErrorKind,
    InfrastructureError,
    SparkJobError,
)
from spark_jobs.job_main import exit_on_error
from spark_jobs.lake.delta_tables import PortableNameError, SchemaEvolutionError
from spark_jobs.lake.mirror_versions import NoCommonWatermark
from spark_jobs.merge import ChangelogRequired
from spark_jobs.rebuild import RebuildRefused
from spark_jobs.rules.topic_identity import Recreated, TopicRecreated

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_each_kind_has_its_exit_code_as_the_worker_draws_1_and_2() -> None:
    assert {kind: kind.exit_code for kind in ErrorKind} == {
        ErrorKind.INFRASTRUCTURE: 1,
        ErrorKind.CONFIGURATION: 2,
        ErrorKind.DATA: 3,
    }
    assert (
        ConfigurationError("x").exit_code,
        InfrastructureError("x").exit_code,
        DataError("x").exit_code,
    ) == (
        EXIT_CONFIGURATION,
        EXIT_INFRASTRUCTURE,
        EXIT_DATA,
    )


@pytest.mark.parametrize(
    ("error", "kind", "old_base"),
    [
        (RebuildRefused, ErrorKind.CONFIGURATION, ValueError),
        (ChangelogRequired, ErrorKind.CONFIGURATION, ValueError),
        (KafkaOptionError, ErrorKind.CONFIGURATION, ValueError),
        (TableNotFoundError, ErrorKind.CONFIGURATION, LookupError),
        (NoCommonWatermark, ErrorKind.INFRASTRUCTURE, RuntimeError),
        (SchemaRegistryError, ErrorKind.INFRASTRUCTURE, RuntimeError),
        (PostgresUnreachable, ErrorKind.INFRASTRUCTURE, psycopg2.OperationalError),
        (SchemaEvolutionError, ErrorKind.DATA, RuntimeError),
        (PortableNameError, ErrorKind.DATA, SchemaEvolutionError),
        (SchemaMappingError, ErrorKind.DATA, ValueError),
    ],
)
def test_every_job_error_has_a_kind_and_keeps_the_base_its_callers_catch(
    error: type[SparkJobError], kind: ErrorKind, old_base: type[Exception]
) -> None:
    raised = error("the fix")
    assert isinstance(raised, SparkJobError) and isinstance(raised, old_base)
    assert raised.kind is kind and str(raised) == "the fix"


def test_a_recreated_topic_is_data_exit_3() -> None:
    raised = TopicRecreated([Recreated("t", recorded="old-id", current="new-id")])
    assert (
        raised.kind is ErrorKind.DATA and raised.exit_code == EXIT_DATA and isinstance(raised, RuntimeError)
    )


def test_a_main_prints_the_message_alone_and_exits_with_its_kind(capsys: pytest.CaptureFixture[str]) -> None:
    @exit_on_error
    def main(argv: Sequence[str] | None = None) -> int:
        raise TableNotFoundError("table public.t not found in app")

    assert main([]) == EXIT_CONFIGURATION
    assert capsys.readouterr() == ("", "table public.t not found in app\n")


def test_a_main_never_prints_a_password_its_error_quotes(capsys: pytest.CaptureFixture[str]) -> None:
    @exit_on_error
    def main(argv: Sequence[str] | None = None) -> int:
        raise PostgresUnreachable(
            'connection to "postgresql://app:hunter2@db:5432/shop" failed: password authentication failed'
        )

    assert main([]) == EXIT_INFRASTRUCTURE
    err = capsys.readouterr().err
    assert "hunter2" not in err and "postgresql://app:" in err and "password authentication failed" in err


def test_an_error_of_no_kind_is_not_swallowed() -> None:
    @exit_on_error
    def main(argv: Sequence[str] | None = None) -> int:
        raise KeyError("a bug: its traceback is wanted")

    with pytest.raises(KeyError):
        main()


def test_the_rebuild_given_two_tables_refuses_in_one_line_with_exit_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from spark_jobs import rebuild

    assert (
        rebuild.main(["--warehouse", "w", "--table", "public.a", "--table", "public.b"]) == EXIT_CONFIGURATION
    )
    assert capsys.readouterr().err == "name one table to rebuild: --table schema.table\n"


def test_verify_refuses_a_negative_settle_time_with_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    from spark_jobs import verify

    argv = ["--warehouse", "w", "-d", "dbname=x", "--settle-seconds", "-1"]
    assert verify.main(argv) == EXIT_CONFIGURATION
    assert capsys.readouterr().err == "--settle-seconds -1: expected 0 or more\n"


def test_the_merge_command_refuses_bad_options_in_one_line_with_exit_2() -> None:
    """As a scheduler or a pod runs it: `python -m`, the message alone on stderr, no traceback."""
    done = subprocess.run(
        [sys.executable, "-m", "spark_jobs.merge", "-b", "k:9092", "--warehouse", "w", "--checkpoints", "c",
         "--topic", "t", "--schema-registry", "http://registry:8081", "--kafka-option", "nokey"],
        cwd=ROOT,
        env={k: v for k, v in os.environ.items() if not k.startswith(("BOTTLEDWATER_", "BW_"))},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )  # fmt: skip
    assert done.returncode == EXIT_CONFIGURATION, done.stderr
    assert done.stderr.splitlines()[-1:] == ["--kafka-option 'nokey': expected KEY=VALUE"]
    assert "Traceback" not in done.stderr
