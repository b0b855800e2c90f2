"""Exactly-once delivery (`--delivery exactly-once`): which committed Postgres transactions make up
one Kafka transaction, and which slot position a Kafka commit lets the worker acknowledge.

The stream publishes through a transactional producer and keeps one Kafka transaction open at all
times. Committed Postgres transactions join it whole; it is committed only between two of them
(never while one's messages are being produced), once it holds `COMMIT_RECORDS` messages, has been
open `COMMIT_INTERVAL_S`, or the slot has nothing more to send right now. A `read_committed`
consumer sees a Kafka transaction all at once or not at all, so it never sees part of a Postgres
transaction, and a TRUNCATE, DDL or progress event on the control topic is committed together with
the rows it orders.

Delivery reports do not make anything visible under transactions: a message is written to its
partition before the commit, and an abort (or a worker killed before the commit, which the next
`init_transactions` aborts) hides it for good. So the slot's position may pass a Postgres
transaction only once the Kafka transaction holding it committed: `acknowledgeable` caps the
`AckTracker`'s delivered position at `visible_lsn` while a grouped transaction waits for its commit.
After a crash, Postgres sends again exactly what no Kafka commit made visible. ("Visible" is the
coordinator's commit decision, durable once `commit_transaction` returns; a `read_committed`
consumer sees the messages once the commit markers are on their partitions, a moment later.)

The constants were measured against a single local broker (docs/worker.md, "Delivery guarantees"):
a commit costs a few milliseconds (one round trip to the transaction coordinator, plus markers on
every partition written), so a commit every 100 ms costs a few per cent of throughput and adds at
most 100 ms to a change's latency.
"""

from __future__ import annotations

import enum

# Commit the open Kafka transaction once it has been open this long...
COMMIT_INTERVAL_S = 0.1
# ... or holds this many messages (bounds what an abort throws away and what a restart resends).
COMMIT_RECORDS = 20_000
# With nothing grouped, still commit this often: messages outside any Postgres transaction
# (relation announcements, progress events, re-snapshot rows) must not stay invisible.
QUIET_COMMIT_S = 1.0


class Delivery(enum.StrEnum):
    """`--delivery`."""

    AT_LEAST_ONCE = "at-least-once"
    EXACTLY_ONCE = "exactly-once"


class TransactionGrouping:
    """The open Kafka transaction's Postgres transactions, and what the last commit made visible.

    Shell protocol, in stream order:
        grouping.postgres_committed(end_lsn, produced, now)   # after each Postgres commit's messages
        if grouping.due(now, produced, idle=...) and no Postgres transaction is being produced:
            producer.commit_transaction(); grouping.kafka_committed(now, produced)
        position = grouping.acknowledgeable(tracker_position)

    `produced` is a running count of the messages handed to the producer (any kind), so that the
    grouping knows whether the open Kafka transaction holds anything.
    """

    def __init__(
        self,
        start_lsn: int,
        *,
        interval_s: float = COMMIT_INTERVAL_S,
        max_records: int = COMMIT_RECORDS,
        quiet_s: float = QUIET_COMMIT_S,
        now: float = 0.0,
    ) -> None:
        self.interval_s = interval_s
        self.max_records = max_records
        self.quiet_s = quiet_s
        # The end LSN of the newest Postgres transaction a Kafka commit made visible.
        self.visible_lsn = start_lsn
        # The end LSN of the newest Postgres transaction in the open Kafka transaction, if any.
        self.grouped_lsn: int | None = None
        self.grouped = 0  # Postgres transactions in the open Kafka transaction
        self._produced_at_open = 0
        self._opened_at: float | None = None  # when the open transaction was first seen holding something
        self._committed_at = now
        self.commits = 0

    @property
    def pending(self) -> bool:
        """A committed Postgres transaction waits in the open Kafka transaction."""
        return self.grouped_lsn is not None

    def postgres_committed(self, end_lsn: int, produced: int, now: float) -> bool:
        """A Postgres transaction's messages are all in the open Kafka transaction. True when the
        Kafka transaction should be committed now (it is full or has been open long enough)."""
        self.grouped_lsn = end_lsn
        self.grouped += 1
        return self.due(now, produced, idle=False)

    def due(self, now: float, produced: int, *, idle: bool) -> bool:
        """Whether to commit the open Kafka transaction now, between two Postgres transactions.
        `idle`: the slot has nothing more to send at the moment, so waiting only adds latency."""
        holds = produced > self._produced_at_open
        if not holds and self.grouped_lsn is None:
            # Empty, or only empty Postgres transactions: nothing to make visible. An empty
            # commit now and then (QUIET_COMMIT_S) covers messages the count does not see.
            return now - self._committed_at >= self.quiet_s
        if self._opened_at is None:
            self._opened_at = now
        if idle:
            return True
        if produced - self._produced_at_open >= self.max_records:
            return True
        return now - self._opened_at >= self.interval_s

    def kafka_committed(self, now: float, produced: int) -> int:
        """The open Kafka transaction committed (and the next one began): its Postgres transactions
        are visible. Returns the position now acknowledgeable."""
        if self.grouped_lsn is not None:
            self.visible_lsn = max(self.visible_lsn, self.grouped_lsn)
        self.grouped_lsn = None
        self.grouped = 0
        self._produced_at_open = produced
        self._opened_at = None
        self._committed_at = now
        self.commits += 1
        return self.visible_lsn

    def acknowledgeable(self, position: int) -> int:
        """`position` (the tracker's: delivered, or the server's WAL end when idle) capped at what
        Kafka commits made visible. With no Postgres transaction waiting for a commit, everything
        delivered before `position` was committed, so it stands."""
        if self.grouped_lsn is None:
            return position
        return min(position, self.visible_lsn)
