"""The Spark jobs' option table: every job's CLI built from it, environment defaults, documentation."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from shared_connections import spark_session
from spark_jobs import option_parser, option_table, options
from spark_jobs.connections import dsn
from spark_jobs.errors import ConfigurationError

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
    with pytest.raises(ConfigurationError, match="--conf 'nokey': expected KEY=VALUE"):
        option_parser.key_values(["nokey"], "--conf")


def test_every_option_is_documented_with_its_environment_variable() -> None:
    docs = DOCS.read_text()
    for option in option_table.OPTIONS:
        assert f"`{', '.join(option.flags)}`" in docs, option.dest
        if option.env:
            assert f"`{option.env}`" in docs, option.env


SPARK_ENV = {
    "BW_SPARK_MASTER": "spark://m:7077",
    "BW_SPARK_DRIVER_MEMORY": "3g",
    "BW_SPARK_SHUFFLE_PARTITIONS": "12",
    "BW_SPARK_PACKAGES": "io.delta:delta-spark_2.13:4.0.0",
    "BW_SPARK_CONF": "spark.cores.max=4,spark.executor.memory=2g",
}


# Each job's other required options.
REQUIRED: dict[str, list[str]] = {
    "merge": ["-b", "k:9092", "--checkpoints", "c"],
    "quality": ["--table", "public.a"],
    "rebuild": ["--table", "public.a"],
    "verify": ["-d", "dbname=x"],
}


@pytest.mark.parametrize("job", sorted(options.ALL_JOBS))
def test_every_job_takes_the_shared_spark_options_and_their_variables(job: options.Job) -> None:
    parser = option_parser.build_parser(job, "", SPARK_ENV)
    flags = {flag for action in parser._actions for flag in action.option_strings}
    assert {"--master", "--conf", "--jars", "--packages", "--driver-memory", "--shuffle-partitions"} <= flags
    args = parser.parse_args(["--warehouse", "w", "--conf", "spark.cores.max=1", *REQUIRED.get(job, [])])
    settings = option_parser.spark_settings(args, "app", SPARK_ENV)
    assert (settings.master, settings.driver_memory, settings.shuffle_partitions) == (
        "spark://m:7077",
        "3g",
        12,
    )
    assert settings.packages == ["io.delta:delta-spark_2.13:4.0.0"]
    # The variable's settings, then the flags'.
    assert dict(settings.extra_conf) == {"spark.cores.max": "1", "spark.executor.memory": "2g"}


def test_a_malformed_spark_conf_variable_is_one_line_naming_it() -> None:
    args = option_parser.build_parser("maintenance", "", {}).parse_args(["--warehouse", "w"])
    with pytest.raises(ConfigurationError, match="BW_SPARK_CONF: 'spark.cores.max': expected KEY=VALUE"):
        option_parser.spark_settings(args, "app", {"BW_SPARK_CONF": "spark.cores.max"})


def test_the_consistent_read_takes_the_shared_options_and_the_workers_registry(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from spark_jobs import consistent_read

    monkeypatch.setenv("BOTTLEDWATER_SCHEMA_REGISTRY", "http://registry:8081")
    monkeypatch.setenv("BOTTLEDWATER_TOPIC_PREFIX", "prod")
    monkeypatch.setenv("BW_SPARK_MASTER", "spark://m:7077")
    argv = ["--warehouse", "w", "public.a", "public.b", "--at-lsn", "42", "--conf", "spark.cores.max=2"]
    args = consistent_read.build_parser().parse_args([*argv, "--jars", "x.jar", "--driver-memory", "2g"])
    # The format is not given: the warehouse's changelog records it.
    assert (args.schema_registry, args.topic_prefix, args.output_format) == (
        "http://registry:8081",
        "prod",
        None,
    )
    assert (args.tables, args.at_lsn) == (["public.a", "public.b"], 42)
    settings = option_parser.spark_settings(args, "read", {})
    assert (settings.master, settings.jars, settings.driver_memory) == ("spark://m:7077", ["x.jar"], "2g")
    assert dict(settings.extra_conf) == {"spark.cores.max": "2"}


FLAG_IN_HELP = re.compile(r"(?<![\w'])--[a-z][a-z-]+")


@pytest.mark.parametrize("job", sorted(options.ALL_JOBS))
def test_a_jobs_help_names_only_its_own_options(job: options.Job) -> None:
    parser = option_parser.build_parser(job, "", {})
    flags = {flag for action in parser._actions for flag in action.option_strings}
    for option in option_parser.options_for(job):
        # "the worker's --topic-prefix" names the worker's flag, not the job's.
        mentioned = set(FLAG_IN_HELP.findall(option.help.replace("the worker's --", "")))
        assert mentioned <= flags, f"{job} {option.flags[-1]}: its help names {sorted(mentioned - flags)}"


def test_the_rebuild_reads_its_dsn_from_a_file_as_its_help_says(tmp_path: Path) -> None:
    dsn_file = tmp_path / "dsn"
    dsn_file.write_text("\npostgresql://u:pw@h/db\n")
    args = option_parser.build_parser("rebuild", "", {}).parse_args(
        ["--warehouse", "w", "--table", "public.a", "--postgres-file", str(dsn_file)]
    )
    assert args.postgres_file == str(dsn_file)
    assert dsn.merge_dsn(args.postgres_types, args.postgres_file, {}) == ("postgresql://u:pw@h/db", None)


def test_no_stack_jars_when_the_variable_says_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BW_SPARK_JARS", "None")
    assert spark_session.stack_jars() == []
    assert "spark.jars" not in spark_session.SparkSettings().conf()


def test_the_merge_keeps_the_changelog_by_default_with_a_mirror_budget() -> None:
    parse = option_parser.build_parser("merge", "", {}).parse_args
    required = ["--warehouse", "w", *REQUIRED["merge"], "--topic-pattern", "p"]
    assert parse(required).changelog
    assert not parse([*required, "--no-changelog"]).changelog
    assert option_parser.mirror_budget(True, None) == options.DEFAULT_MIRROR_BUDGET_S
    assert option_parser.mirror_budget(True, "2.5") == 2.5
    assert option_parser.mirror_budget(True, "0") == 0.0
    assert option_parser.mirror_budget(True, "OFF") is None  # every mirror in every batch
    assert option_parser.mirror_budget(False, None) is None
    with pytest.raises(ConfigurationError, match="drop --no-changelog"):
        option_parser.mirror_budget(False, "5")
    for bad in ("-1", "soon"):
        with pytest.raises(ConfigurationError, match="expected seconds"):
            option_parser.mirror_budget(True, bad)
