"""Helpers for the Dagster tests: a real local webhook receiver, the pipeline's environment for one
test database, free ports, polling, and cleaning up the topics a test's worker created."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from confluent_kafka.admin import AdminClient

PROJECT_ROOT = Path(__file__).resolve().parents[2]
POLL_S = 0.5


def wait_for(predicate: Callable[[], Any], what: str, timeout: float) -> Any:
    """The first truthy value of `predicate()`, or a failure naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(POLL_S)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class WebhookReceiver:
    """An HTTP server on 127.0.0.1 that records every JSON body POSTed to it."""

    url: str
    bodies: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def received(self) -> list[dict[str, Any]]:
        with self.lock:
            return list(self.bodies)


@contextmanager
def webhook_receiver() -> Iterator[WebhookReceiver]:
    receiver = WebhookReceiver(url="")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            body = json.loads(self.rfile.read(length))
            with receiver.lock:
                receiver.bodies.append(body)
            self.send_response(202)  # PagerDuty answers 202 Accepted
            self.end_headers()
            self.wfile.write(b'{"status":"success"}')

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    receiver.url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()


def pipeline_env(db_dsn: str, name: str, kafka_bootstrap: str, registry_url: str) -> dict[str, str]:
    """The code location's variables for one test: its database, slot and topic prefix, so that
    tests never share a slot or a topic."""
    return {
        "BOTTLEDWATER_POSTGRES": db_dsn,
        "BOTTLEDWATER_SLOT": name,
        "BOTTLEDWATER_TOPIC_PREFIX": name,
        "BOTTLEDWATER_BROKER": kafka_bootstrap,
        "BOTTLEDWATER_SCHEMA_REGISTRY": registry_url,
        "BOTTLEDWATER_SNAPSHOT_WORKERS": "1",
    }


def clean_environ(extra: dict[str, str]) -> dict[str, str]:
    """os.environ without the stack's own pipeline variables, plus `extra`."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("BOTTLEDWATER_", "BW_ALERT"))}
    return {**base, **extra}


def delete_topics_with_prefix(kafka_bootstrap: str, prefix: str) -> None:
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    topics = [t for t in admin.list_topics(timeout=30).topics if t.startswith(prefix + ".")]
    for future in admin.delete_topics(topics).values() if topics else ():
        future.result(timeout=30)


@dataclass(frozen=True)
class DagsterHome:
    """A Dagster instance of its own for one test: the stack's instance file (the repository's
    settings plus dagster-postgres storage) on a database of its own on the stack's Postgres."""

    path: Path
    env: dict[str, str]


@contextmanager
def dagster_home(pg_dsn: str, tmp_path: Path, name: str) -> Iterator[DagsterHome]:
    import psycopg2
    from psycopg2 import sql

    from stack.dagster_home import POSTGRES_URL_ENV, SQLALCHEMY_DRIVER, instance_yaml

    admin = psycopg2.connect(pg_dsn)
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text(instance_yaml((PROJECT_ROOT / "dagster.yaml").read_text()))
    base = pg_dsn.rsplit("/", 1)[0]
    url = SQLALCHEMY_DRIVER + base[base.index("://") :] + "/" + name
    try:
        yield DagsterHome(home, {"DAGSTER_HOME": str(home), POSTGRES_URL_ENV: url})
    finally:
        with admin.cursor() as cur:
            cur.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        admin.close()


@contextmanager
def dagster_process(
    args: list[str], env: dict[str, str], log_path: Path
) -> Iterator[subprocess.Popen[bytes]]:
    """A Dagster service (`dagster-daemon run`, `dagster-webserver`) in a process group of its own,
    so that stopping the group also stops the code server and the run processes it started."""
    executable = str(Path(sys.executable).parent / args[0])
    with log_path.open("ab") as log_file:
        proc = subprocess.Popen(
            [executable, *args[1:]],
            cwd=PROJECT_ROOT,
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield proc
    finally:
        stop_group(proc)


def _group_alive(pgid: int) -> bool:
    """Whether a process of group `pgid` still runs (zombies waiting to be reaped do not count)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with suppress(OSError):
            # pid (comm) state ppid pgrp ...: comm may hold spaces, so split after its ')'.
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                return True
    return False


def stop_group(proc: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    """SIGTERM the whole group (the service, its code server, its runs and their workers), wait for
    every member to exit, and SIGKILL what is left after `timeout`."""
    with suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        proc.poll()  # reap the leader, or it stays a zombie member of the group
        if not _group_alive(proc.pid):
            return
        time.sleep(POLL_S)
    with suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
