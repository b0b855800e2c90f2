"""Keepalives and acknowledgement: which position the slot may confirm, and when to say so.

`flush_lsn` goes to Postgres only up to what the `AckTracker` calls safe (every message of that
transaction and all before it in Kafka); with nothing in flight and no transaction open, the
server's WAL end from its last keepalive, so that an idle database retains no WAL. Status updates
go out at least every `status_interval` seconds, from every wait (including waits for room in the
producer's queue), and sooner when the acknowledgeable position moved; see `heartbeat` for why they
must never stop, even while the stream thread is busy elsewhere.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from cdc_worker.core.ack import AckTracker
from cdc_worker.core.incremental import IncrementalSnapshot
from cdc_worker.core.kafka_transactions import TransactionGrouping
from cdc_worker.core.lsn import format_lsn
from cdc_worker.core.model import TransactionCommitted
from cdc_worker.shell.metrics import WorkerMetrics
from cdc_worker.shell.stream.heartbeat import StatusChannel
from cdc_worker.shell.stream.position import StreamPosition
from cdc_worker.shell.stream.publishing import TrackedPublisher

log = logging.getLogger(__name__)

# Acknowledge a moved position at most this often; the interval is the upper bound.
# (Status updates are a few bytes; at this pace the slot's confirmed position trails Kafka by less
# than a tenth of a second, not a fifth.)
MIN_ACK_INTERVAL_S = 0.05
SELECT_TIMEOUT_S = 0.5
IN_FLIGHT_WAIT_S = 0.005


class Acknowledgement:
    """Owns the acknowledged position (`acked`) and the status channel's updates. `in_transaction`
    says whether a transaction is open, buffered or spooled (then no keepalive position may be
    acknowledged)."""

    def __init__(
        self,
        *,
        tracker: AckTracker,
        status: StatusChannel,
        status_interval: float,
        out: TrackedPublisher,
        resnapshot: IncrementalSnapshot,
        position: StreamPosition,
        in_transaction: Callable[[], bool],
        metrics: WorkerMetrics | None,
        start_lsn: int,
        grouping: TransactionGrouping | None = None,
    ) -> None:
        self.tracker = tracker
        # Exactly-once: nothing past what a Kafka commit made visible is acknowledged.
        self.grouping = grouping
        self.status = status
        self.status_interval = status_interval
        self.out = out
        self.resnapshot = resnapshot
        self.position = position
        self.in_transaction = in_transaction
        self.metrics = metrics
        self.acked = start_lsn

    def committed(self, event: TransactionCommitted) -> None:
        """A transaction's commit: its end LSN for the tracker (acknowledgeable once delivered)."""
        self.tracker.committed(event)

    def position_now(self) -> int:
        """What may be acknowledged now: the tracker's safe LSN, or with nothing in flight and no
        transaction open, the server's WAL end from its last keepalive; under exactly-once, no further
        than the last Kafka commit made visible."""
        position = self.tracker.safe_flush_lsn()
        cursor = self.status.cursor
        if cursor is not None and not self.in_transaction():
            idle = self.tracker.idle_position(cursor.wal_end)
            if idle is not None:
                position = idle
        if self.grouping is not None:
            position = self.grouping.acknowledgeable(position)
        hold = self.resnapshot.hold_lsn
        # While a re-snapshot runs, its newest watermark (which says where it is) must be read
        # again after a restart: acknowledge up to its commit, never past it.
        return position if hold is None else min(position, max(hold, self.acked))

    def caught_up(self) -> bool:
        """Postgres had nothing newer to send: no transaction open, buffered or spooled, nothing in
        flight to Kafka, and the server's WAL end from its last keepalive acknowledged."""
        cursor = self.status.cursor
        if cursor is None or self.in_transaction() or self.tracker.pending_messages:
            return False
        return int(cursor.wal_end) <= self.acked

    def tick(self, *, force: bool = False) -> None:
        """Send a status update if the position moved (at most every MIN_ACK_INTERVAL_S) or the
        status interval has passed since the last one."""
        if self.status.cursor is None:
            return
        now = time.monotonic()
        since = now - self.status.last_sent
        position = self.position_now()
        if force or since >= self.status_interval or (position > self.acked and since >= MIN_ACK_INTERVAL_S):
            self.status.send(position)
            if position > self.acked:
                log.debug("acknowledged %s", format_lsn(position))
            self.acked = max(self.acked, position)
            if self.metrics is not None:
                self.metrics.acked_lsn.set(self.acked)
        self.out.release_settled_batches()
        if self.metrics is not None:
            self.out.flush_counters()
            self.metrics.in_flight.set(self.tracker.pending_messages)
            if self.tracker.pending_messages == 0 and not self.in_transaction():
                self.position.oldest_unacked_commit = None
            self.metrics.set_oldest_unacknowledged(self.position.oldest_unacked_commit)

    def idle_wait(self) -> float:
        """How long the loop may wait for Postgres when it has nothing to read: a moment while
        deliveries are outstanding; with a moved position not acknowledged yet (the last delivery
        came within MIN_ACK_INTERVAL_S of the previous update), until that update is due, not a
        whole SELECT_TIMEOUT_S later."""
        if self.tracker.pending_messages:
            return IN_FLIGHT_WAIT_S
        if self.position_now() > self.acked:
            return max(0.0, MIN_ACK_INTERVAL_S - (time.monotonic() - self.status.last_sent))
        return SELECT_TIMEOUT_S
