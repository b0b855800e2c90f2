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
from typing import TYPE_CHECKING

import psycopg2

if TYPE_CHECKING:
    from cdc_worker.shell.stream.session import StreamSession

log = logging.getLogger(__name__)

MILLIS = 1000.0


def status_interval_for(configured: float, wal_sender_timeout_ms: int) -> float:
    """The configured interval, capped at a quarter of wal_sender_timeout (0 means no timeout)."""
    if wal_sender_timeout_ms > 0:
        return min(configured, wal_sender_timeout_ms / MILLIS / 4)
    return configured


class StatusHeartbeat:
    """Keeps status updates going while the stream thread is busy away from its loop (registering
    a schema, creating a topic, reading the catalog) by resending the positions already given to
    psycopg2, never new ones. A stream thread silent for half of wal_sender_timeout would make
    Postgres ask for a reply in the middle of a transaction, the case in which psycopg2's keepalive
    shortcut (see the module docstring) could acknowledge past what Kafka holds."""

    def __init__(self, session: StreamSession) -> None:
        self.session = session
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bw-status-heartbeat", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        session = self.session
        while not self._stopped.wait(session.status_interval / 2):
            if time.monotonic() - session._last_status < session.status_interval:
                continue
            if not session._io_lock.acquire(blocking=False):
                continue  # the stream thread is talking to Postgres itself
            try:
                session.cursor.send_feedback(force=True)
                session._last_status = time.monotonic()
            except psycopg2.Error as exc:  # the stream thread meets the same error and reports it
                log.debug("heartbeat status update failed: %s", exc)
            finally:
                session._io_lock.release()

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=5)
