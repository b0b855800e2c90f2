"""`pg_ctl restart -m fast` under a write load: the worker says so in one line and exits 1 (with
`--reconnect-timeout 0`; by default it reconnects in-process, which the failover drill tests).

The restart happens on a private, throw-away cluster (initdb into a temporary directory, run as the
`postgres` OS user as `bw-stack` does, `wal_level=logical`, a free port): the stack's Postgres is
shared and never restarted by a test. Kafka is the stack's.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

import psycopg2
import pytest

from stack import process
from stack.config import POSTGRES_BIN, POSTGRES_OS_USER
from tests.integration.conftest import unique_name
from tests.integration.orchestration_harness import delete_topics_with_prefix, free_port
from tests.integration.worker_harness import BOTTLEDWATER, wait_for

PG_CTL_TIMEOUT_S = 120
STREAMING_TIMEOUT_S = 120
EXIT_TIMEOUT_S = 120
CONNECTION_FAILED = "Postgres connection failed: "

pytestmark = pytest.mark.skipif(
    not (POSTGRES_BIN / "initdb").exists(), reason="PostgreSQL 15's initdb is not installed"
)


@dataclass(frozen=True)
class PrivateCluster:
    data_dir: Path
    port: int
    log_file: Path

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def pg_ctl(self, *args: str) -> None:
        """pg_ctl with the server's output in the log file (without `-l` the server would inherit
        pg_ctl's captured stdout and keep it open)."""
        result = process.run_as(
            POSTGRES_OS_USER,
            [str(POSTGRES_BIN / "pg_ctl"), "-D", str(self.data_dir), "-l", str(self.log_file), *args],
            timeout_s=PG_CTL_TIMEOUT_S,
        )
        assert result.returncode == 0, f"pg_ctl {' '.join(args)}: {process.output_of(result)}"


@pytest.fixture
def private_cluster() -> Iterator[PrivateCluster]:
    """A small cluster of its own, stopped and deleted afterwards whatever happened."""
    # Not pytest's tmp_path: the postgres OS user must be able to reach the directory.
    root = Path(tempfile.mkdtemp(prefix="bw-fault-pg-", dir="/tmp"))
    os.chmod(root, 0o755)
    data_dir, socket_dir = root / "data", root / "run"
    for path in (data_dir, socket_dir):
        path.mkdir()
    process.chown_to(POSTGRES_OS_USER, root, data_dir, socket_dir)
    cluster = PrivateCluster(data_dir, free_port(), root / "postgres.log")
    try:
        initdb = process.run_as(
            POSTGRES_OS_USER,
            [str(POSTGRES_BIN / "initdb"), "-D", str(data_dir), "-U", "postgres", "-A", "trust",
             "-E", "UTF8", "--locale=C.UTF-8"],
            timeout_s=PG_CTL_TIMEOUT_S,
        )  # fmt: skip
        assert initdb.returncode == 0, f"initdb: {process.output_of(initdb)}"
        settings = {
            "port": str(cluster.port),
            "listen_addresses": "'127.0.0.1'",
            "unix_socket_directories": f"'{socket_dir}'",
            "wal_level": "logical",
            "max_replication_slots": "4",
            "max_wal_senders": "4",
            "max_connections": "20",
            "shared_buffers": "16MB",
            "fsync": "off",  # a throw-away cluster: its restart is clean, no crash to recover from
            "timezone": "'UTC'",
        }
        with (data_dir / "postgresql.conf").open("a") as conf:
            conf.write("".join(f"{k} = {v}\n" for k, v in settings.items()))
        cluster.pg_ctl("-w", "-t", str(PG_CTL_TIMEOUT_S), "start")
        yield cluster
    finally:
        if (data_dir / "postmaster.pid").exists():
            process.run_as(
                POSTGRES_OS_USER,
                [str(POSTGRES_BIN / "pg_ctl"), "-D", str(data_dir), "-m", "immediate", "-w", "stop"],
                timeout_s=PG_CTL_TIMEOUT_S,
            )
        shutil.rmtree(root, ignore_errors=True)


def _write_load(dsn: str, stop: threading.Event, written: list[int]) -> threading.Thread:
    """Small transactions (insert, update, delete) until `stop`, reconnecting through the restart."""

    def run() -> None:
        n = 1000
        while not stop.is_set():
            try:
                conn = psycopg2.connect(dsn, connect_timeout=5)
            except psycopg2.OperationalError:
                time.sleep(0.2)
                continue
            conn.autocommit = True
            try:
                with conn.cursor() as cur:
                    while not stop.is_set():
                        n += 1
                        cur.execute("INSERT INTO t VALUES (%s, 0)", (n,))
                        cur.execute("UPDATE t SET v = v + 1 WHERE id = %s", (n % 50 + 1,))
                        if n % 3 == 0:
                            cur.execute("DELETE FROM t WHERE id = %s", (n - 1,))
                        written.append(n)
                        time.sleep(0.005)
            except psycopg2.Error:
                time.sleep(0.2)  # the restart: connect again
            finally:
                with suppress(psycopg2.Error):
                    conn.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _confirmed_position(dsn: str, slot: str) -> str | None:
    with suppress(psycopg2.Error), psycopg2.connect(dsn, connect_timeout=5) as conn, conn.cursor() as cur:
        cur.execute(
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s", (slot,)
        )
        row = cur.fetchone()
        return None if row is None else row[0]
    return None


def test_postgres_restarted_under_load_exits_1_with_one_line(
    private_cluster: PrivateCluster, kafka_bootstrap: str, tmp_path: Path
) -> None:
    dsn = private_cluster.dsn
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE t (id int PRIMARY KEY, v int)")
        cur.execute("INSERT INTO t SELECT g, 0 FROM generate_series(1, 50) g")
    conn.close()
    prefix, slot = unique_name("bwfault"), unique_name("slot")
    stdout_path, stderr_path = tmp_path / "worker.out", tmp_path / "worker.err"
    env = {k: v for k, v in os.environ.items() if not k.startswith("BOTTLEDWATER_")}
    args = [BOTTLEDWATER, "-d", dsn, "-s", slot, "-b", kafka_bootstrap, "-f", "json", "-p", prefix,
            "--status-interval", "1", "--snapshot-workers", "1", "--reconnect-timeout", "0"]  # fmt: skip
    stop_load = threading.Event()
    written: list[int] = []
    worker: subprocess.Popen[bytes] | None = None
    try:
        with stdout_path.open("wb") as out, stderr_path.open("wb") as err:
            worker = subprocess.Popen(args, stdout=out, stderr=err, env=env)

        def stderr_text() -> str:
            return stderr_path.read_text(errors="replace")

        def streaming() -> bool:
            assert worker is not None
            if worker.poll() is not None:
                raise AssertionError(f"the worker exited {worker.returncode}:\n{stderr_text()[-4000:]}")
            return "streaming slot" in stderr_text()

        wait_for(streaming, "the worker to stream", STREAMING_TIMEOUT_S)
        start_position = _confirmed_position(dsn, slot)
        _write_load(dsn, stop_load, written)
        # Under load for real: changes written, streamed and acknowledged before the restart.
        wait_for(
            lambda: len(written) >= 50 and _confirmed_position(dsn, slot) != start_position,
            "the worker to acknowledge streamed changes",
            STREAMING_TIMEOUT_S,
        )
        assert worker.poll() is None, stderr_text()

        private_cluster.pg_ctl("-m", "fast", "-w", "-t", str(PG_CTL_TIMEOUT_S), "restart")

        try:
            code = worker.wait(EXIT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"the worker still runs after the restart:\n{stderr_text()[-4000:]}"
            ) from None
        err_text, out_text = stderr_text(), stdout_path.read_text(errors="replace")
        failed = [line for line in err_text.splitlines() if CONNECTION_FAILED in line]
        assert (code, len(failed)) == (1, 1), f"exit {code}, lines {failed}:\n{err_text[-4000:]}"
        assert "Traceback" not in err_text + out_text, err_text[-4000:]
        # Nothing after it: the one line is the worker's last word on the matter.
        assert failed[0].split(CONNECTION_FAILED, 1)[1].strip(), failed
        print(f"{len(written)} transactions written; the worker's stderr:\n{err_text}")
    finally:
        stop_load.set()
        if worker is not None and worker.poll() is None:
            worker.kill()
            worker.wait(30)
        delete_topics_with_prefix(kafka_bootstrap, prefix)
