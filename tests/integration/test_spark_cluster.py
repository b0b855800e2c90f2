"""The Spark jobs on a real cluster: the stack's standalone master and worker (`stack.spark_cluster`),
whose executors are separate JVMs and Python processes started by the worker. Three things run there:

- the merge, submitted with `spark-submit --master spark://...`: the mirror equals Postgres;
- the worker's `--snapshot-engine spark --spark-master spark://...`: the topics hold the bytes of
  the worker's own snapshot, then the stream, and equal Postgres;
- Dagster's `merge` job, run by `dagster job execute` on the code location with `BW_SPARK_MASTER`
  (and the other `BW_SPARK_*` settings): its application is the cluster's, with the executors' size
  the settings give, and the mirror equals Postgres. The `continuous_merge` job's child is the
  merge's own command line built from the same settings (its flags and environment are checked in
  tests/unit/test_continuous_merge.py, and that command on the cluster is the first case), so it is
  not run on the cluster a second time, for the suite's time.

The executors get `bottledwater` the way a user's cluster would: as `--py-files bottledwater.zip`
built from the checkout, run by an interpreter that has the dependencies but not this project (a
venv whose path file lists the project venv's site-packages, without its editable install). A zip
cannot carry the native codec, so the executors encode with the Python codec: the same bytes.

The cluster (1 worker, 1 core, 1 GB) is up only for this module, and stopped after it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import zipfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import psycopg2
import pytest
from psycopg2 import sql

from stack import process, spark_cluster
from stack.config import StackConfig
from tests.integration.conftest import unique_name
from tests.integration.lakehouse import (
    PROJECT_ROOT,
    LakeCase,
    assert_delta_equals_postgres,
    execute,
)
from tests.integration.orchestration_harness import clean_environ
from tests.integration.worker_harness import (
    AvroDecoder,
    Record,
    TopicReader,
    WorkerProcess,
    compacted,
    delete_topics_with_prefix,
    query,
    wait_caught_up,
)

SUBMIT_TIMEOUT_S = 600
SNAPSHOT_TIMEOUT_S = 300
# What the executors need of this project: the worker's codec (the snapshot), the merge's jobs and
# what both reach Spark and Postgres with.
PACKAGES = ("cdc_worker", "kafka_contract", "shared_connections", "spark_jobs")
EXECUTOR = ("--executor-memory", "512m", "--total-executor-cores", "1")


@pytest.fixture(scope="module")
def master() -> Iterator[str]:
    cfg = StackConfig.from_env()
    with spark_cluster.using(cfg) as address:
        yield address
    for service in spark_cluster.cluster_services(cfg):
        assert not process.pids_running(service.marker), f"{service.name} left running"


@pytest.fixture(scope="module")
def package_zip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`bottledwater.zip` for `--py-files`: the project's Python packages, importable on any executor."""
    target = tmp_path_factory.mktemp("py-files") / "bottledwater.zip"
    with zipfile.ZipFile(target, "w") as archive:
        for package in PACKAGES:
            for source in (PROJECT_ROOT / package).rglob("*.py"):
                archive.write(source, source.relative_to(PROJECT_ROOT))
    return target


@pytest.fixture(scope="module")
def cluster_python(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The cluster's interpreter: the dependencies (pyspark, confluent-kafka, psycopg2, fastavro),
    not this project, which only the shipped zip provides."""
    venv = tmp_path_factory.mktemp("cluster-python")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout.strip()  # fmt: skip
    # A directory listed in a path file is put on sys.path without its own path files being run:
    # the project venv's editable install (one of them) stays out.
    (Path(site) / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    probe = "import confluent_kafka, fastavro, psycopg2, pyspark\ntry:\n import cdc_worker\nexcept ImportError: pass\nelse: raise SystemExit('cdc_worker importable without the zip')"  # noqa: E501
    checked = subprocess.run([str(python), "-c", probe], cwd=venv, capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stderr
    return str(python)


def test_the_merge_submitted_to_a_standalone_cluster_mirrors_postgres(
    lake: LakeCase, master: str, package_zip: Path, cluster_python: str
) -> None:
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
        "--jars", jars, "--py-files", str(package_zip), "--driver-memory", "768m", *EXECUTOR,
        "--conf", f"spark.pyspark.python={cluster_python}",
        str(PROJECT_ROOT / "spark_jobs" / "merge.py"),
        "-b", lake.bootstrap, "-r", lake.registry, "-p", lake.prefix, "--topic", lake.topic(name),
        "--warehouse", lake.warehouse, "--checkpoints", lake.checkpoints,
    ]  # fmt: skip
    # Run from elsewhere than the project, so that nothing is imported from the working directory.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYSPARK_PYTHON")}
    # spark-submit finds Spark from SPARK_HOME (the venv need not be on PATH).
    env |= {"SPARK_HOME": str(spark_cluster.spark_home()), "SPARK_LOCAL_IP": "127.0.0.1"}
    done = subprocess.run(
        command, cwd=lake.tmp, env=env, capture_output=True, text=True, timeout=SUBMIT_TIMEOUT_S, check=False
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    assert f"{lake.topic(name)} -> " in done.stdout
    assert_delta_equals_postgres(lake.spark, lake.path(name), lake.dsn, name)


def applications() -> dict[str, dict[str, object]]:
    """The master's applications, running and completed, by id (its /json/ page)."""
    state = spark_cluster.SparkMaster(StackConfig.from_env()).master_state() or {}
    apps: dict[str, dict[str, object]] = {}
    for key in ("activeapps", "completedapps"):
        listed = state.get(key)
        for app in listed if isinstance(listed, list) else []:
            if isinstance(app, dict):
                apps[str(app["id"])] = app
    return apps


def test_dagsters_merge_runs_on_the_cluster_that_bw_spark_master_names(
    lake: LakeCase, master: str, tmp_path: Path
) -> None:
    name = unique_name("dagster_cluster")
    table = sql.Identifier(name)
    execute(
        lake.dsn,
        sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, name text, amount numeric(10,2))").format(table),
        sql.SQL("INSERT INTO {} SELECT i, 'n' || i, i * 1.5 FROM generate_series(1, 40) AS i").format(table),
    )
    with lake.worker("avro", name) as worker:
        worker.wait_caught_up()
        execute(
            lake.dsn,
            sql.SQL("UPDATE {} SET name = 'v2' WHERE id % 3 = 0").format(table),
            sql.SQL("DELETE FROM {} WHERE id % 5 = 0").format(table),
        )
        worker.wait_caught_up()
    _dagster_merges_on_the_cluster(lake, name, master, tmp_path)


def _dagster_merges_on_the_cluster(lake: LakeCase, name: str, master: str, tmp_path: Path) -> None:
    before = applications()
    home = tmp_path / "dagster_home"  # no dagster.yaml: a throw-away SQLite instance
    home.mkdir()
    # What an operator sets for a cluster: where it is, the driver's size, the executors' size and
    # interpreter (this venv: the cluster is on this machine).
    conf = f"spark.executor.memory=512m,spark.cores.max=1,spark.pyspark.python={sys.executable}"
    env = clean_environ(
        {
            "BOTTLEDWATER_POSTGRES": lake.dsn,
            "BOTTLEDWATER_SLOT": lake.slot,  # the publication the worker made: the location's tables
            "BOTTLEDWATER_TOPIC_PREFIX": lake.prefix,
            "BOTTLEDWATER_BROKER": lake.bootstrap,
            "BOTTLEDWATER_SCHEMA_REGISTRY": lake.registry,
            "BW_WAREHOUSE": lake.warehouse,
            "BW_AUTOMATION": "stopped",
            "BW_SPARK_MASTER": master,
            "BW_SPARK_DRIVER_MEMORY": "768m",
            "BW_SPARK_SHUFFLE_PARTITIONS": "3",
            "BW_SPARK_CONF": conf,
            "DAGSTER_HOME": str(home),
            "SPARK_LOCAL_IP": "127.0.0.1",  # the executors reach the driver on loopback
        }
    )
    dagster = str(Path(sys.executable).parent / "dagster")
    done = subprocess.run(
        [dagster, "job", "execute", "-m", "orchestration.definitions", "-d", ".", "-j", "merge"],
        cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=SUBMIT_TIMEOUT_S, check=False,
    )  # fmt: skip
    output = done.stdout[-3000:] + done.stderr[-5000:]
    assert done.returncode == 0, output
    assert "RUN_SUCCESS" in done.stdout + done.stderr, output
    ran = [app for key, app in applications().items() if key not in before]
    dagster_apps = [app for app in ran if app["name"] == "bottledwater-dagster"]  # the run's session
    assert len(dagster_apps) == 1, (ran, output)
    app = dagster_apps[0]
    # The executors had BW_SPARK_CONF's size: the session was built from the location's settings.
    assert app.get("memoryperexecutor", app.get("memoryperslave")) == 512, (app, output)
    assert_delta_equals_postgres(lake.spark, lake.path(name), lake.dsn, name)


@pytest.fixture
def prefix(kafka_bootstrap: str) -> Iterator[str]:
    name = unique_name("bwcluster")
    yield name
    delete_topics_with_prefix(kafka_bootstrap, name)


def test_the_spark_snapshot_on_a_standalone_cluster_writes_the_worker_snapshots_bytes(
    *,
    fresh_db: str,
    prefix: str,
    kafka_bootstrap: str,
    registry_url: str,
    tmp_path: Path,
    master: str,
    package_zip: Path,
    cluster_python: str,
) -> None:
    conn = psycopg2.connect(fresh_db)
    conn.autocommit = True
    with conn, conn.cursor() as cur:
        cur.execute(
            "CREATE TABLE items (id int PRIMARY KEY, name text, qty int, amount numeric(10,2), "
            "seen timestamptz, tags text[]);"
            "INSERT INTO items SELECT i, repeat('n', i % 50) || i, i % 17, i * 1.25, "
            "'2024-01-01'::timestamptz + i * interval '1 minute', ARRAY['t' || i % 3] "
            "FROM generate_series(1, 3000) AS i;"
            "CREATE TABLE pairs (a int, b text, v int, PRIMARY KEY (a, b));"
            "INSERT INTO pairs SELECT i, b, i "
            "FROM generate_series(1, 150) AS i, (VALUES ('x'), ('y')) AS t(b);"
            "ANALYZE items, pairs"
        )
    conn.close()
    common = [
        "-d", fresh_db, "-p", prefix, "-b", kafka_bootstrap, "-r", registry_url, "-f", "avro",
        "--status-interval", "1", "--tables", "public.items,public.pairs", "-T", "partitions=3",
    ]  # fmt: skip
    by_worker = WorkerProcess([*common, "-s", unique_name("slot")], tmp_path / "worker.log").start()
    try:
        by_worker.wait_streaming(timeout=SNAPSHOT_TIMEOUT_S)
    finally:
        assert by_worker.stop() == 0
    slot = unique_name("slot")
    # What a user sets for their own cluster: the interpreter the executors have, the package
    # shipped to them, the executors' size. The worker is the driver (client mode) on loopback.
    env = {
        "PYSPARK_PYTHON": cluster_python,
        "PYSPARK_SUBMIT_ARGS": f"--py-files {package_zip} {' '.join(EXECUTOR)} pyspark-shell",
        "SPARK_LOCAL_IP": "127.0.0.1",
    }
    spark_args = ["--snapshot-engine", "spark", "--spark-master", master]
    by_spark = WorkerProcess([*common, "-s", slot, *spark_args], tmp_path / "spark.log", env=env).start()
    try:
        by_spark.wait_streaming(timeout=SNAPSHOT_TIMEOUT_S)
        assert "spark snapshot complete" in by_spark.log()
        with psycopg2.connect(fresh_db) as change, change.cursor() as cur:
            cur.execute("UPDATE items SET qty = qty + 100 WHERE id % 10 = 0")
            cur.execute("DELETE FROM items WHERE id % 13 = 0")
            cur.execute("DELETE FROM pairs WHERE a % 7 = 0 AND b = 'x'")
        wait_caught_up(fresh_db, slot, timeout=60)
    finally:
        assert by_spark.stop() == 0

    reader = TopicReader(kafka_bootstrap)
    decode = AvroDecoder(registry_url)
    try:
        for table, key, columns in (
            ("items", ("id",), ("id", "name", "qty")),
            ("pairs", ("a", "b"), ("a", "b", "v")),
        ):
            records = reader.read(f"{prefix}.{table}")
            snapshots = sorted({r.lsn for r in records if r.op == "r"})
            assert len(snapshots) == 2, table  # one consistent LSN per snapshot
            by_lsn = [[r for r in records if r.op == "r" and r.lsn == lsn] for lsn in snapshots]
            assert content(by_lsn[1]) == content(by_lsn[0]), table
            assert sum(1 for r in records if r.op != "r") > 0, table  # the stream after the snapshot
            assert project(compacted(records, decode), columns) == table_rows(fresh_db, table, key, columns)
    finally:
        reader.close()


def content(records: list[Record]) -> Counter[tuple[object, ...]]:
    """A snapshot's messages as the contract fixes them (the LSN and time differ between slots)."""
    return Counter(
        (r.partition, r.key, r.value, r.headers["bw.op"], r.headers["bw.seq"], r.headers["bw.xid"])
        for r in records
    )


def project(view: dict[str, object], columns: tuple[str, ...]) -> dict[str, object]:
    return {key: {c: row[c] for c in columns} for key, row in view.items() if isinstance(row, dict)}


def table_rows(dsn: str, table: str, key: tuple[str, ...], columns: tuple[str, ...]) -> dict[str, object]:
    rows = query(dsn, sql.SQL("SELECT {} FROM {}").format(
        sql.SQL(", ").join(map(sql.Identifier, columns)), sql.Identifier(table)
    ))  # fmt: skip
    view: dict[str, object] = {}
    for values in rows:
        row = dict(zip(columns, values, strict=True))
        view[json.dumps({k: row[k] for k in key}, sort_keys=True)] = row
    return view
