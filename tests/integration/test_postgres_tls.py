"""Secure connections: Postgres with `ssl = on`, its certificate signed by a CA made for this run
(tls_ca.py), and a role that may log in only over TLS with SCRAM. The worker connects with
`sslmode=verify-full` and streams; a wrong CA or a host name the certificate does not carry stops
it in one line naming the setting to fix.

The server is the stack's Postgres 16 (stack/postgres_versions.py), reconfigured for this module
(its pg_hba.conf and `ALTER SYSTEM`, both restored afterwards): the stack's own 15 is shared and
never reconfigured by a test.
"""

# ruff: noqa: F811 (the imported fixtures are redefined as parameters)

from __future__ import annotations

import json
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import pytest
from psycopg2 import sql

from stack import process
from stack.config import POSTGRES_OS_USER, StackConfig
from stack.postgres_versions import Cluster
from tests.integration.conftest import unique_name
from tests.integration.test_worker import (  # noqa: F401 (fixtures)
    StartWorker,
    prefix,
    reader,
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


def test_the_spark_snapshot_reads_over_verify_full(
    *,
    tls_server: TlsServer,
    fresh_db: str,
    start_worker: StartWorker,
    reader: TopicReader,
    prefix: str,
    slot_name: str,
) -> None:
    """The Spark job's tasks open their own connections with the worker's DSN: TLS settings included."""
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
