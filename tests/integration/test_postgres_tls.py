"""Secure connections: Postgres with `ssl = on`, its certificate signed by a CA made for this run
(tls_ca.py), and a role that may log in only over TLS with SCRAM. The worker (its Spark snapshot
too), the merge's catalog lookups and Dagster's resources connect with `sslmode=verify-full`; a
wrong CA or a host name the certificate does not carry stops each in one line naming the setting to
fix.

The server is the stack's Postgres 16 (stack/postgres_versions.py), reconfigured for this module
(its pg_hba.conf and `ALTER SYSTEM`, both restored afterwards): the stack's own 15 is shared and
never reconfigured by a test.
"""

# ruff: noqa: F811 (the imported fixtures are redefined as parameters)

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import psycopg2
import pytest
from psycopg2 import sql
from pyspark.sql import SparkSession

from orchestration.discovery import discover_tables
from orchestration.resources import PostgresResource
from spark_jobs.connections.postgres_connect import PostgresUnreachable
from spark_jobs.merge import KafkaSource, run_merge
from spark_jobs.merge_options import MergeOptions
from stack import process
from stack.config import POSTGRES_OS_USER, StackConfig
from stack.postgres_versions import Cluster
from tests.integration.conftest import unique_name
from tests.integration.lakehouse import assert_delta_equals_postgres
from tests.integration.test_worker import (  # noqa: F401 (fixtures)
    StartWorker,
    prefix,
    slot_name,
    start_worker,
    table_ddl,
    topic,
)
from tests.integration.tls_ca import TlsFiles, make_ca
from tests.integration.worker_harness import TopicReader, compacted, execute, query, wait_caught_up, wait_for

TLS_MAJOR = 16
SERVER_HOST = "localhost"  # the name in the server's certificate
CERT_FILE, KEY_FILE = "bw_test_server.crt", "bw_test_server.key"


@dataclass(frozen=True)
class TlsServer:
    cluster: Cluster
    files: TlsFiles
    role: str
    password: str

    def dsn(self, dbname: str, *, host: str = SERVER_HOST, root_cert: Path | None = None) -> str:
        root = root_cert or self.files.ca_cert
        return (
            f"postgresql://{self.role}:{quote(self.password)}@{host}:{self.cluster.port}/{dbname}"
            f"?sslmode=verify-full&sslrootcert={root}"
        )


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsServer]:
    cluster = Cluster(StackConfig.from_env(), TLS_MAJOR)
    started_here = cluster.pid() is None
    cluster.start()
    files = make_ca(tmp_path_factory.mktemp("tls"), f"bw test CA {uuid.uuid4().hex[:8]}", SERVER_HOST)
    for source, name in ((files.server_cert, CERT_FILE), (files.server_key, KEY_FILE)):
        target = cluster.data_dir / name
        shutil.copy(source, target)
        target.chmod(0o600)
        process.chown_to(POSTGRES_OS_USER, target)
    role, password = unique_name("bwtls"), uuid.uuid4().hex
    hba = cluster.data_dir / "pg_hba.conf"
    original_hba = hba.read_text()
    # First match wins: this role over TLS with SCRAM only, before initdb's trust lines.
    hba.write_text(
        f"hostssl all {role} 127.0.0.1/32 scram-sha-256\nhostnossl all {role} 127.0.0.1/32 reject\n"
        + original_hba
    )
    admin = cluster.url()
    execute(
        admin,
        "ALTER SYSTEM SET ssl = on",
        (sql.SQL("ALTER SYSTEM SET ssl_cert_file = {}").format(sql.Literal(CERT_FILE)),),
        (sql.SQL("ALTER SYSTEM SET ssl_key_file = {}").format(sql.Literal(KEY_FILE)),),
        "SET password_encryption = 'scram-sha-256'",
        (sql.SQL("CREATE ROLE {} LOGIN SUPERUSER PASSWORD %s").format(sql.Identifier(role)), (password,)),
        "SELECT pg_reload_conf()",
    )
    wait_for(lambda: query(admin, "SHOW ssl")[0][0] == "on", "ssl = on after the reload", 30)
    try:
        yield TlsServer(cluster, files, role, password)
    finally:
        hba.write_text(original_hba)
        execute(
            admin,
            "ALTER SYSTEM RESET ssl",
            "ALTER SYSTEM RESET ssl_cert_file",
            "ALTER SYSTEM RESET ssl_key_file",
            (sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)),),
            "SELECT pg_reload_conf()",
        )
        for name in (CERT_FILE, KEY_FILE):
            (cluster.data_dir / name).unlink(missing_ok=True)
        if started_here:
            cluster.stop()


@pytest.fixture(scope="module")
def pg_dsn(tls_server: TlsServer) -> str:
    return tls_server.cluster.url()


def dbname_of(dsn: str) -> str:
    return dsn.rsplit("/", 1)[1]


def test_the_worker_streams_over_verify_full_with_scram(
    *,
    tls_server: TlsServer,
    fresh_db: str,
    start_worker: StartWorker,
    reader: TopicReader,
    prefix: str,
    slot_name: str,
) -> None:
    execute(fresh_db, table_ddl("t", "id int PRIMARY KEY, v text"), "INSERT INTO t VALUES (1, 'a'), (2, 'b')")
    secure = tls_server.dsn(dbname_of(fresh_db))
    start_worker(dsn=secure)
    execute(fresh_db, "UPDATE t SET v = 'c' WHERE id = 1", "INSERT INTO t VALUES (3, 'd')")
    wait_caught_up(fresh_db, slot_name)
    records = reader.read(topic(prefix, "t"), 4)
    assert compacted(records) == {
        '{"id": 1}': {"id": 1, "v": "c"},
        '{"id": 2}': {"id": 2, "v": "b"},
        '{"id": 3}': {"id": 3, "v": "d"},
    }
    # Every connection of the role, the walsender streaming the slot among them, is encrypted.
    rows = query(
        fresh_db,
        "SELECT s.ssl, a.backend_type FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) "
        "WHERE a.usename = %s",
        (tls_server.role,),
    )
    assert rows and all(ssl for ssl, _ in rows), rows
    assert "walsender" in {backend for _, backend in rows}


def failure_line(start_worker: StartWorker, dsn: str) -> str:
    worker = start_worker(dsn=dsn, wait=False)
    assert worker.wait_exit(60) != 0
    lines = [line for line in worker.log().splitlines() if "Postgres" in line and "ssl" in line.lower()]
    assert len(lines) == 1, worker.log()
    return lines[0]


def test_a_wrong_ca_stops_the_worker_in_one_line_naming_sslrootcert(
    *, tls_server: TlsServer, fresh_db: str, start_worker: StartWorker, tmp_path: Path
) -> None:
    other = make_ca(tmp_path / "other", "another CA", SERVER_HOST)
    line = failure_line(start_worker, tls_server.dsn(dbname_of(fresh_db), root_cert=other.ca_cert))
    assert "certificate verify failed" in line and "sslrootcert" in line
    assert tls_server.password not in line


def test_a_host_the_certificate_does_not_name_stops_the_worker_naming_the_host(
    *, tls_server: TlsServer, fresh_db: str, start_worker: StartWorker
) -> None:
    line = failure_line(start_worker, tls_server.dsn(dbname_of(fresh_db), host="127.0.0.1"))
    assert "127.0.0.1" in line and SERVER_HOST in line and "host" in line
    assert tls_server.password not in line


def test_the_spark_snapshot_and_the_merge_read_over_verify_full(
    *,
    tls_server: TlsServer,
    fresh_db: str,
    start_worker: StartWorker,
    reader: TopicReader,
    prefix: str,
    slot_name: str,
    kafka_bootstrap: str,
    spark: SparkSession,
    tmp_path: Path,
) -> None:
    """The Spark job's tasks open their own connections with the worker's DSN: TLS settings included.
    The merge types the JSON topic's columns from the catalog over the same DSN (the role may not
    connect without TLS, so a lookup that did not use it would fail the table)."""
    execute(
        fresh_db,
        table_ddl("t", "id int PRIMARY KEY, v text"),
        "INSERT INTO t SELECT g, 'row ' || g FROM generate_series(1, 2000) g",
    )
    worker = start_worker(
        "--snapshot-engine",
        "spark",
        "--spark-master",
        "local[2,4]",
        dsn=tls_server.dsn(dbname_of(fresh_db)),
        wait=False,
    )
    worker.wait_streaming(300)
    assert "spark snapshot complete" in worker.log()
    wait_caught_up(fresh_db, slot_name)
    records = reader.read(topic(prefix, "t"), 2000)
    expected = {
        json.dumps({"id": key}): {"id": key, "v": v} for key, v in query(fresh_db, "SELECT id, v FROM t")
    }
    assert compacted(records) == expected

    secure = tls_server.dsn(dbname_of(fresh_db))
    warehouse = str(tmp_path / "warehouse")
    source = KafkaSource(kafka_bootstrap)
    options = MergeOptions(warehouse, "json", None, prefix, postgres=secure)
    runs = run_merge(spark, options, source, str(tmp_path / "checkpoints"), topics=[topic(prefix, "t")])
    assert [r.error for r in runs] == [None]
    assert_delta_equals_postgres(spark, f"{warehouse}/public/t", fresh_db, "t")

    # The merge as Dagster's asset runs it: a wrong CA stops it before its query, in one line.
    other = make_ca(tmp_path / "other", "another CA", SERVER_HOST)
    wrong = MergeOptions(warehouse, "json", None, prefix, postgres=secure.replace(
        str(tls_server.files.ca_cert), str(other.ca_cert)))  # fmt: skip
    with pytest.raises(PostgresUnreachable) as refused:
        run_merge(spark, wrong, source, str(tmp_path / "checkpoints"), topics=[topic(prefix, "t")])
    assert "certificate verify failed" in str(refused.value) and "sslrootcert" in str(refused.value)


def test_the_merge_cli_and_dagster_refuse_a_wrong_ca_or_host_in_one_line(
    *, tls_server: TlsServer, fresh_db: str, tmp_path: Path
) -> None:
    db = dbname_of(fresh_db)
    other = make_ca(tmp_path / "other", "another CA", SERVER_HOST)
    wrong_ca, wrong_host = tls_server.dsn(db, root_cert=other.ca_cert), tls_server.dsn(db, host="127.0.0.1")

    # The merge's command line: the DSN from its variable, checked before Spark starts.
    env = {k: v for k, v in os.environ.items() if not k.startswith("BOTTLEDWATER_")}
    merge = subprocess.run(
        [sys.executable, "-m", "spark_jobs.merge", "--broker", "127.0.0.1:1", "-f", "json",
         "--warehouse", str(tmp_path / "w"), "--checkpoints", str(tmp_path / "c"), "--topic", "x.t"],
        env={**env, "BOTTLEDWATER_MERGE_POSTGRES": wrong_ca}, capture_output=True, text=True, timeout=120,
        check=False,
    )  # fmt: skip
    assert merge.returncode != 0
    last = merge.stderr.strip().splitlines()[-1]
    assert "BOTTLEDWATER_MERGE_POSTGRES" in last and "sslrootcert" in last, merge.stderr[-2000:]
    assert tls_server.password not in merge.stderr + merge.stdout

    # Dagster's resource: over TLS when the DSN is right; one line naming the setting when not.
    slot = unique_name("slot")
    with PostgresResource(dsn=tls_server.dsn(db), slot=slot).connect() as conn, conn.cursor() as cur:
        cur.execute("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
        assert cur.fetchone() == (True,)
    for dsn, words in ((wrong_ca, "sslrootcert"), (wrong_host, "the name in the certificate")):
        with pytest.raises(psycopg2.OperationalError) as refused:  # the sensors' "unreachable"
            PostgresResource(dsn=dsn, slot=slot).observe_slot()
        line = str(refused.value)
        assert "\n" not in line and "BOTTLEDWATER_POSTGRES" in line and words in line, line
        assert tls_server.password not in line
    # The code location's table discovery says what to fix too.
    problem = discover_tables(wrong_host, slot, None).problem
    assert problem is not None and "the name in the certificate" in problem, problem
