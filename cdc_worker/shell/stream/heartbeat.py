"""Status updates to Postgres beyond the stream loop's own: how often they must go, and a heartbeat
that keeps them going while the stream thread is busy elsewhere.

Why it matters: Postgres drops a replication client that stays silent for `wal_sender_timeout`, and
asks for a reply (even in the middle of a transaction) after half of it. psycopg2 answers such a
keepalive itself and, when the last flush position we gave it is past the start of the last message
it returned, moves its flush position to the server's WAL end. With interleaved transactions that
last message can belong to a transaction still in flight to Kafka, so the worker must never be
silent that long: status updates at least every quarter of `wal_sender_timeout`, from the loop and,
when the loop is busy, from this heartbeat.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import psycopg2

from cdc_worker.shell.postgres.catalog import PostgresConnectionLost, connection_lost

log = logging.getLogger(__name__)

MILLIS = 1000.0


def status_interval_for(configured: float, wal_sender_timeout_ms: int) -> float:
    """The configured interval, capped at a quarter of wal_sender_timeout (0 means no timeout)."""
    if wal_sender_timeout_ms > 0:
        return min(configured, wal_sender_timeout_ms / MILLIS / 4)
    return configured


class StatusChannel:
    """The replication connection as the stream thread and the heartbeat share it: one lock
    serialises their libpq calls, and the time of the last status update says when one is due.

    `cursor` is the replication cursor, set once replication has started."""

    def __init__(self) -> None:
        self.cursor: Any = None
        self.last_sent = 0.0
        self._lock = threading.Lock()

    def read_payloads(self, limit: int) -> list[bytes]:
        """The payloads of the replication messages ready now, up to `limit` of them, read under
        one hold of the lock (the stream's hot path: not one acquisition per message); empty when
        none is. Raises `PostgresConnectionLost` when the connection broke (however libpq reports
        it: a restart may end the stream first)."""
        payloads: list[bytes] = []
        with self._lock:
            read = self.cursor.read_message
            try:
                while len(payloads) < limit:
                    message = read()
                    if message is None:
                        break
                    payloads.append(message.payload)
            except psycopg2.Error as exc:
                if connection_lost(exc):
                    raise PostgresConnectionLost.from_error(exc) from exc
                raise
        return payloads

    def send(self, position: int) -> None:
        """A status update acknowledging `position` (written and flushed)."""
        with self._lock:
            try:
                self.cursor.send_feedback(write_lsn=position, flush_lsn=position, force=True)
            except psycopg2.Error as exc:
                if connection_lost(exc):
                    raise PostgresConnectionLost.from_error(exc) from exc
                raise
        self.last_sent = time.monotonic()

    def resend_if_due(self, interval: float) -> None:
        """Resend the positions already given to psycopg2 (never new ones) if no update went out
        for `interval` seconds and the stream thread is not talking to Postgres itself."""
        if time.monotonic() - self.last_sent < interval or not self._lock.acquire(blocking=False):
            return
        try:
            self.cursor.send_feedback(force=True)
            self.last_sent = time.monotonic()
        except psycopg2.Error as exc:  # the stream thread meets the same error and reports it
            log.debug("heartbeat status update failed: %s", exc)
        finally:
            self._lock.release()


class StatusHeartbeat:
    """Keeps status updates going while the stream thread is busy away from its loop (registering
    a schema, creating a topic, reading the catalog). A stream thread silent for half of
    wal_sender_timeout would make Postgres ask for a reply in the middle of a transaction, the case
    in which psycopg2's keepalive shortcut (see the module docstring) could acknowledge past what
    Kafka holds."""

    def __init__(self, channel: StatusChannel, interval: float) -> None:
        self.channel = channel
        self.interval = interval
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bw-status-heartbeat", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopped.wait(self.interval / 2):
            if self.channel.cursor is not None:
                self.channel.resend_if_due(self.interval)

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=5)
