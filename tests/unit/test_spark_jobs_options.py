"""The Spark jobs' option table: every job's CLI built from it, environment defaults, documentation."""

from __future__ import annotations

from pathlib import Path

import pytest

from spark_jobs import option_parser, options

DOCS = Path(__file__).resolve().parents[2] / "docs" / "lakehouse.md"


def test_merge_reads_the_workers_environment() -> None:
    environ = {
        "BOTTLEDWATER_BROKER": "k:9092",
        "BOTTLEDWATER_OUTPUT_FORMAT": "json",
        "BOTTLEDWATER_TOPIC_PREFIX": "p",
    }
    args = option_parser.build_parser("merge", "", environ).parse_args(
        ["--warehouse", "w", "--checkpoints", "c"]
    )
    assert (args.broker, args.output_format, args.topic_prefix) == ("k:9092", "json", "p")
    assert (args.history, args.topic, args.shuffle_partitions, args.master) == (False, [], 2, None)


def test_a_flag_wins_over_the_environment() -> None:
    parser = option_parser.build_parser("merge", "", {"BOTTLEDWATER_BROKER": "env:9092"})
    args = parser.parse_args(["-b", "flag:9092", "--warehouse", "w", "--checkpoints", "c"])
    assert args.broker == "flag:9092"


@pytest.mark.parametrize(
    ("job", "argv", "missing"),
    [
        ("merge", ["--warehouse", "w", "--checkpoints", "c"], "--broker"),
        ("verify", ["--warehouse", "w"], "--postgres"),
        ("quality", ["--warehouse", "w"], "--table"),
        ("maintenance", [], "--warehouse"),
    ],
)
def test_required_options_are_refused_when_missing(
    job: options.Job, argv: list[str], missing: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        option_parser.build_parser(job, "", {}).parse_args(argv)
    assert missing in capsys.readouterr().err


def test_verify_takes_the_dsn_from_the_environment() -> None:
    args = option_parser.build_parser("verify", "", {"BOTTLEDWATER_POSTGRES": "dbname=x"}).parse_args(
        ["--warehouse", "w"]
    )
    assert (args.postgres, args.show, args.table) == ("dbname=x", options.DEFAULT_SHOWN_KEYS, [])


def test_jobs_take_only_their_own_options(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        option_parser.build_parser("maintenance", "", {}).parse_args(["--warehouse", "w", "--history"])
    assert "unrecognized arguments: --history" in capsys.readouterr().err


def test_spark_settings_from_the_shared_options() -> None:
    argv = ["--warehouse", "w", "--master", "spark://m:7077", "--conf", "a.b=1", "--jars", "x.jar,y.jar"]
    settings = option_parser.spark_settings(
        option_parser.build_parser("maintenance", "", {}).parse_args(argv), "app"
    )
    assert (settings.master, settings.jars, dict(settings.extra_conf)) == (
        "spark://m:7077",
        ["x.jar", "y.jar"],
        {"a.b": "1"},
    )
    with pytest.raises(SystemExit, match="--conf 'nokey': expected KEY=VALUE"):
        option_parser.key_values(["nokey"], "--conf")


def test_every_option_is_documented_with_its_environment_variable() -> None:
    docs = DOCS.read_text()
    for option in options.OPTIONS:
        assert f"`{', '.join(option.flags)}`" in docs, option.dest
        if option.env:
            assert f"`{option.env}`" in docs, option.env
