"""Prometheus metrics of one worker, served on `--metrics-port`.

Each `WorkerMetrics` owns its registry (not the process-wide default), so that several workers in
one process (tests, benchmarks) do not collide. Slot lag is measured by the server, not guessed:
a background thread asks `pg_replication_slots` every `SLOT_POLL_INTERVAL_S` on its own connection.
"""

from __future__ import annotations

import logging
import threading
import time
from wsgiref.simple_server import WSGIServer

import psycopg2
from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from cdc_worker.shell.postgres.catalog import connect

log = logging.getLogger(__name__)

SLOT_POLL_INTERVAL_S = 10.0
# On a standby (capture from a standby), the position it has replayed stands for the current one.
_SLOT_LAG_SQL = """
SELECT pg_wal_lsn_diff(CASE WHEN pg_is_in_recovery()
                            THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_lsn() END,
                       confirmed_flush_lsn)::bigint
  FROM pg_replication_slots WHERE slot_name = %s
"""


class WorkerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.events = Counter(
            "bottledwater_events",
            "Change events published, by table and op (r c u d t)",
            ["table", "op"],
            registry=r,
        )
        self.bytes = Counter(
            "bottledwater_bytes", "Key and value bytes handed to Kafka", ["table"], registry=r
        )
        self.in_flight = Gauge(
            "bottledwater_in_flight_messages", "Messages handed to Kafka and not yet acknowledged", registry=r
        )
        self.acked_lsn = Gauge(
            "bottledwater_acknowledged_lsn", "Last LSN acknowledged to Postgres (flush_lsn)", registry=r
        )
        self.slot_lag_bytes = Gauge(
            "bottledwater_slot_lag_bytes",
            "WAL between the server's current LSN and the slot's confirmed flush",
            registry=r,
        )
        self.slot_lag_seconds = Gauge(
            "bottledwater_slot_lag_seconds",
            "Age of the oldest change received from Postgres and not yet acknowledged (0 when caught up)",
            registry=r,
        )
        self.errors = Counter("bottledwater_errors", "Errors, by kind", ["kind"], registry=r)
        self.snapshot_rows = Counter(
            "bottledwater_snapshot_rows", "Rows read by the snapshot, by table", ["table"], registry=r
        )
        self._server: WSGIServer | None = None
        self._stop = threading.Event()
        self._poller: threading.Thread | None = None

    def serve(self, port: int) -> int:
        """Start the HTTP endpoint; returns the port (useful with 0, which picks a free one)."""
        server, _thread = start_http_server(port, registry=self.registry)
        self._server = server
        return int(server.server_port)

    def watch_slot(self, dsn: str, slot: str, interval: float = SLOT_POLL_INTERVAL_S) -> None:
        """Poll the slot's lag in bytes in a daemon thread until `close()`."""
        self._poller = threading.Thread(
            target=self._poll_slot, args=(dsn, slot, interval), name="bw-slot-lag", daemon=True
        )
        self._poller.start()

    def _poll_slot(self, dsn: str, slot: str, interval: float) -> None:
        conn = None
        while not self._stop.is_set():
            try:
                if conn is None or conn.closed:
                    conn = connect(dsn, application_name="bottledwater-metrics")
                with conn.cursor() as cur:
                    cur.execute(_SLOT_LAG_SQL, (slot,))
                    row = cur.fetchone()
                if row is not None and row[0] is not None:
                    self.slot_lag_bytes.set(row[0])
            except psycopg2.Error as exc:
                # Metrics must never stop the worker; the next poll reconnects.
                log.warning("cannot read the lag of slot %s: %s", slot, exc)
                self.errors.labels("metrics").inc()
                if conn is not None:
                    conn.close()
                conn = None
            self._stop.wait(interval)
        if conn is not None:
            conn.close()

    def set_oldest_unacknowledged(self, commit_epoch_s: float | None) -> None:
        self.slot_lag_seconds.set(0.0 if commit_epoch_s is None else max(0.0, time.time() - commit_epoch_s))

    def close(self) -> None:
        self._stop.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._poller is not None:
            self._poller.join(timeout=5)
