"""The stack's pure parts: configuration, the classpath filter, the env lines and the CLI."""

from __future__ import annotations

from pathlib import Path

import pytest

from stack.cli import build_parser, env_lines
from stack.config import StackConfig
from stack.install import redundant_with_pyspark


def test_jars_pyspark_already_ships_are_dropped_whatever_their_version() -> None:
    jars = [
        Path(n)
        for n in (
            "delta-spark_4.2_2.13-4.4.0.jar",
            "jackson-core-2.13.5.jar",
            "hadoop-client-api-3.4.1.jar",
            "kafka-clients-3.9.2.jar",
            "scala-library-2.13.17.jar",
            "zstd-jni-1.5.7-3.jar",
        )
    ]
    shipped = [
        "jackson-core-2.20.1.jar",
        "hadoop-client-api-3.4.2.jar",
        "scala-library-2.13.18.jar",
        "zstd-jni-1.5.7-6.jar",
        "spark-core_2.13-4.2.0.jar",
    ]
    dropped = {p.name for p in redundant_with_pyspark(jars, shipped)}
    assert dropped == {
        "jackson-core-2.13.5.jar",
        "hadoop-client-api-3.4.1.jar",
        "scala-library-2.13.17.jar",
        "zstd-jni-1.5.7-3.jar",
    }


def test_ports_and_home_come_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("BW_STACK_HOME", str(tmp_path))
    monkeypatch.setenv("BW_STACK_KAFKA_PORT", "19092")
    cfg = StackConfig.from_env()
    assert cfg.home == tmp_path.resolve()
    assert cfg.kafka_bootstrap == "127.0.0.1:19092"
    assert cfg.log_file("kafka") == tmp_path.resolve() / "logs" / "kafka.log"


def test_env_prints_one_export_per_address(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("BW_STACK_HOME", str(tmp_path))
    jars = tmp_path / "spark-jars"
    jars.mkdir()
    (jars / "b.jar").touch()
    (jars / "a.jar").touch()
    lines = env_lines(StackConfig.from_env())
    exported = dict(line.removeprefix("export ").split("=", 1) for line in lines)
    assert exported["BOTTLEDWATER_POSTGRES"] == "postgresql://postgres@127.0.0.1:55432/postgres"
    assert exported["BOTTLEDWATER_BROKER"] == "127.0.0.1:9092"
    assert exported["BOTTLEDWATER_SCHEMA_REGISTRY"] == "http://127.0.0.1:8081/apis/ccompat/v7"
    assert exported["BW_SPARK_JARS"] == f"{jars / 'a.jar'},{jars / 'b.jar'}"
    assert exported["DAGSTER_HOME"] == str(tmp_path.resolve() / "dagster")


def test_help_lists_every_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--help"])
    out = capsys.readouterr().out
    for command in ("install", "up", "down", "status", "env", "logs", "reset"):
        assert f"    {command}" in out


def test_the_merge_finds_the_jars_bw_stack_installs_without_bw_spark_jars(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # A fresh clone runs the unit tier without `bw-stack env`: the session must look where
    # `bw-stack install` puts the jars (Delta's catalog is missing otherwise).
    from shared_connections import spark_session

    monkeypatch.delenv("BW_SPARK_JARS", raising=False)
    monkeypatch.delenv("BW_STACK_HOME", raising=False)
    assert StackConfig.from_env().spark_jars_dir == spark_session.STACK_JARS_DIR
    jars = tmp_path / "spark-jars"
    jars.mkdir()
    (jars / "delta-spark.jar").write_bytes(b"")
    monkeypatch.setattr(spark_session, "STACK_JARS_DIR", jars)
    assert spark_session.stack_jars() == [str(jars / "delta-spark.jar")]
