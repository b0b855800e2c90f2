"""Helpers for the Dagster tests: a real local webhook receiver, the pipeline's environment for one
test database, free ports, polling, and cleaning up the topics a test's worker created."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
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
