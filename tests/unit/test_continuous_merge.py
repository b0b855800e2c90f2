"""The continuous merge's supervisor decision and command line (no Dagster instance, no Spark)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestration.continuous_merge import (
    BACKOFF_BASE_S,
    BACKOFF_MAX_S,
    HEALTHY_AFTER_S,
    MergeRun,
    last_commit,
    merge_command,
    merge_environment,
    next_launch,
)
from orchestration.resources import DeltaWarehouseResource, KafkaResource, SparkResource
from spark_jobs import option_parser

NOW = 1_000_000.0


def failed(run_id: str, started: float, ended: float) -> MergeRun:
    return MergeRun(run_id, active=False, failed=True, started_at=started, ended_at=ended)


def test_launches_when_there_was_never_a_run() -> None:
    assert next_launch([], NOW)[0]


def test_never_a_second_run_beside_an_active_one() -> None:
    active = MergeRun("a", active=True, failed=False, started_at=NOW - 5, ended_at=None)
    assert next_launch([active, failed("b", NOW - 100, NOW - 90)], NOW) == (
        False,
        "a continuous merge run is active",
    )


def test_a_failed_run_is_relaunched_after_a_backoff_that_grows_with_consecutive_failures() -> None:
    one = [failed("a", NOW - 20, NOW - 1)]
    assert not next_launch(one, NOW)[0]
    assert next_launch(one, NOW + BACKOFF_BASE_S)[0]
    three = [failed("c", NOW - 3, NOW - 1), failed("b", NOW - 6, NOW - 4), failed("a", NOW - 9, NOW - 7)]
    launch, why = next_launch(three, NOW + BACKOFF_BASE_S)
    assert not launch and why.startswith("3 failure(s) in a row")


def test_a_run_that_stopped_for_a_person_is_not_relaunched_until_one_launches_the_job() -> None:
    reason = "public.orders: topic p.public.orders was deleted and created again: rebuild it"
    stopped = MergeRun(
        "b", active=False, failed=True, started_at=NOW - 30, ended_at=NOW - 20, needs_person=reason
    )
    launch, why = next_launch([stopped], NOW + BACKOFF_MAX_S)
    assert not launch
    assert (
        why == f"run b stopped and needs a person: {reason}; fix that, then launch the continuous_merge job"
    )
    # A person launched the job again: that run, ended or still going, decides from then on.
    relaunched = MergeRun("c", active=False, failed=False, started_at=NOW, ended_at=NOW + 1)
    assert next_launch([relaunched, stopped], NOW + 2)[0]


def test_failures_before_a_long_healthy_run_do_not_lengthen_the_backoff() -> None:
    runs = [failed("b", NOW - HEALTHY_AFTER_S - 10, NOW - 1), failed("a", NOW - 5000, NOW - 4990)]
    launch, why = next_launch(runs, NOW)
    assert launch, why


def test_the_command_runs_the_merge_continuously_with_the_resources_settings() -> None:
    command = merge_command(
        ["p.public.a", "p.public.b"],
        2.5,
        kafka=KafkaResource(bootstrap_servers="k:9092", topic_prefix="p", message_format="avro"),
        warehouse=DeltaWarehouseResource(root="/lake"),
        spark=SparkResource(),
    )
    args = command[command.index("spark_jobs.merge") + 1 :]
    parsed = option_parser.build_parser("merge", "").parse_args(args)
    assert parsed.continuous and parsed.trigger_interval == 2.5
    assert parsed.topic == ["p.public.a", "p.public.b"]
    assert (parsed.broker, parsed.topic_prefix, parsed.warehouse) == ("k:9092", "p", "/lake")
    assert parsed.checkpoints == "/lake/_checkpoints"
    assert "-d" not in args
    assert not parsed.changelog
    # The resource's defaults: the stack's jars, as the merge picks them itself.
    assert "--jars" not in args and (parsed.master, parsed.packages) == ("local[2]", "")


def test_a_warehouse_that_keeps_the_changelog_is_merged_continuously_with_it() -> None:
    command = merge_command(
        [],
        10.0,
        kafka=KafkaResource(bootstrap_servers="k:9092", message_format="avro"),
        warehouse=DeltaWarehouseResource(root="/lake", changelog=True, mirror_budget_s=4.0),
        spark=SparkResource(),
    )
    parsed = option_parser.build_parser("merge", "").parse_args(
        command[command.index("spark_jobs.merge") + 1 :]
    )
    assert parsed.changelog
    assert option_parser.mirror_budget(parsed.changelog, parsed.mirror_budget) == 4.0
    # No budget on the resource: every mirror in every batch, not the command line's default budget.
    command = merge_command(
        [],
        10.0,
        kafka=KafkaResource(bootstrap_servers="k:9092", message_format="avro"),
        warehouse=DeltaWarehouseResource(root="/lake", changelog=True),
        spark=SparkResource(),
    )
    parsed = option_parser.build_parser("merge", "").parse_args(
        command[command.index("spark_jobs.merge") + 1 :]
    )
    assert parsed.changelog and option_parser.mirror_budget(parsed.changelog, parsed.mirror_budget) is None


def test_the_merge_runs_where_the_spark_resource_says_with_its_settings_as_flags(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spark = SparkResource(
        master="spark://10.0.0.5:7077",
        driver_memory="3g",
        shuffle_partitions=24,
        jars="",
        packages="io.delta:delta-spark_2.13:4.0.0",
        spark_config={"spark.executor.cores": 2},
    )
    command = merge_command(
        ["p.public.a"],
        10.0,
        kafka=KafkaResource(bootstrap_servers="k:9092", message_format="avro"),
        warehouse=DeltaWarehouseResource(root="/lake"),
        spark=spark,
    )
    # Flags win over the variables the child inherits, so a stale environment changes nothing.
    inherited = {"BW_SPARK_MASTER": "local[1]", "BW_SPARK_PACKAGES": "x:y:1", "BW_SPARK_CONF": "spark.a=1"}
    args = option_parser.build_parser("merge", "", inherited).parse_args(
        command[command.index("spark_jobs.merge") + 1 :]
    )
    # The object store's keys stay out of the command line: the merge reads them from its environment.
    monkeypatch.setenv("BW_SPARK_CONF", "spark.hadoop.fs.s3a.secret.key=s3cret")
    env = merge_environment(None, None, None, spark.env_conf_text())
    assert "s3cret" not in " ".join(command)
    settings = option_parser.spark_settings(args, "merge", env)
    assert (settings.master, settings.driver_memory, settings.shuffle_partitions) == (
        "spark://10.0.0.5:7077",
        "3g",
        24,
    )
    assert (settings.jars, settings.packages) == ([], ["io.delta:delta-spark_2.13:4.0.0"])
    assert dict(settings.extra_conf) == {
        "spark.hadoop.fs.s3a.secret.key": "s3cret",
        "spark.executor.cores": "2",
    }


def test_the_postgres_dsn_reaches_the_merge_through_its_environment_not_its_command_line() -> None:
    env = merge_environment("http://r:8081", "postgresql://u:pw@h/db")
    assert env == {
        "BOTTLEDWATER_SCHEMA_REGISTRY": "http://r:8081",
        "BOTTLEDWATER_MERGE_POSTGRES": "postgresql://u:pw@h/db",
        "BW_SPARK_CONF": "",
    }
    assert merge_environment(None, None) == {"BOTTLEDWATER_SCHEMA_REGISTRY": "", "BW_SPARK_CONF": ""}


def test_last_commit_reads_the_newest_commit_of_the_delta_log(tmp_path: Path) -> None:
    assert last_commit(str(tmp_path / "none")) is None
    log = tmp_path / "t" / "_delta_log"
    log.mkdir(parents=True)
    for version, millis in ((0, 1_000), (1, 5_000)):
        entry = {"commitInfo": {"timestamp": millis, "operation": "MERGE"}}
        (log / f"{version:020d}.json").write_text(json.dumps({"add": {}}) + "\n" + json.dumps(entry) + "\n")
    commit = last_commit(str(tmp_path / "t"))
    assert commit is not None
    assert commit["last_commit"].value == 5.0
