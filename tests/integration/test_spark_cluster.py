"""The merge on a real Spark cluster: a standalone master and worker (`bw-stack spark-cluster up`),
the job submitted with `spark-submit --master spark://...` and the package as `--py-files`, its
executors separate JVMs started by the worker. The mirror must equal Postgres, as on `local[2]`:
no path, jar or registry client that only the driver has.

The cluster is started for this test only and stopped after it (it holds 1 core and 1 GB).
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from psycopg2 import sql

from stack import spark_cluster
from stack.config import StackConfig
from tests.integration.conftest import unique_name
from tests.integration.lakehouse import PROJECT_ROOT, LakeCase, assert_delta_equals_postgres, execute

SUBMIT_TIMEOUT_S = 600
PACKAGES = ("spark_jobs", "kafka_contract")


@pytest.fixture
def master() -> Iterator[str]:
    cfg = StackConfig.from_env()
    try:
        yield spark_cluster.up(cfg)
    finally:
        spark_cluster.down(cfg)


def package_zip(target: Path) -> Path:
    """What `--py-files bottledwater.zip` ships: the job's packages, importable on any executor."""
    with zipfile.ZipFile(target, "w") as archive:
        for package in PACKAGES:
            for source in (PROJECT_ROOT / package).rglob("*.py"):
                archive.write(source, source.relative_to(PROJECT_ROOT))
    return target


def test_the_merge_submitted_to_a_standalone_cluster_mirrors_postgres(lake: LakeCase, master: str) -> None:
    name = unique_name("cluster")
    table = sql.Identifier(name)
    execute(
        lake.dsn,
        sql.SQL(
            "CREATE TABLE {} (id int PRIMARY KEY, name text, amount numeric(10,2), seen timestamptz)"
        ).format(table),
        sql.SQL("INSERT INTO {} SELECT i, 'n' || i, i * 1.5, now() FROM generate_series(1, 50) AS i").format(
            table
        ),
    )
    with lake.worker("avro", name) as worker:
        worker.wait_caught_up()
        execute(
            lake.dsn,
            sql.SQL("UPDATE {} SET name = 'v2' WHERE id % 4 = 0").format(table),
            sql.SQL("DELETE FROM {} WHERE id % 7 = 0").format(table),
        )
        worker.wait_caught_up()
    jars = os.environ.get("BW_SPARK_JARS") or ",".join(str(p) for p in StackConfig.from_env().spark_jars())
    command = [
        str(Path(sys.executable).parent / "spark-submit"), "--master", master,
        "--jars", jars, "--py-files", str(package_zip(lake.tmp / "bottledwater.zip")),
        "--driver-memory", "768m", "--executor-memory", "512m", "--total-executor-cores", "1",
        "--conf", f"spark.pyspark.python={sys.executable}",
        str(PROJECT_ROOT / "spark_jobs" / "merge.py"),
        "-b", lake.bootstrap, "-r", lake.registry, "-p", lake.prefix, "--topic", lake.topic(name),
        "--warehouse", lake.warehouse, "--checkpoints", lake.checkpoints,
    ]  # fmt: skip
    # Run from elsewhere than the project, so that nothing is imported from the working directory.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    # spark-submit finds Spark and the driver's interpreter from these (the venv need not be on PATH).
    env |= {"SPARK_HOME": str(spark_cluster.spark_home()), "PYSPARK_PYTHON": sys.executable,
            "SPARK_LOCAL_IP": "127.0.0.1"}  # fmt: skip
    done = subprocess.run(
        command, cwd=lake.tmp, env=env, capture_output=True, text=True, timeout=SUBMIT_TIMEOUT_S, check=False
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    assert f"{lake.topic(name)} -> " in done.stdout
    assert_delta_equals_postgres(lake.spark, lake.path(name), lake.dsn, name)
