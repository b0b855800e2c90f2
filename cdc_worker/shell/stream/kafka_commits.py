"""The stream's Kafka transactions under `--delivery exactly-once`: when the open one is committed
(`core.kafka_transactions.TransactionGrouping` decides, this does it), never while a Postgres
transaction's messages are being produced, and what happens to it when the stream ends.

The session hands it each Postgres commit (`postgres_committed`) and asks it at every tick and
whenever the slot has nothing more to send (`commit`); the acknowledgement reads the grouping's
visible position, so the slot passes only what a Kafka commit made visible.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from cdc_worker.core.ack import AckTracker
from cdc_worker.core.kafka_transactions import TransactionGrouping
from cdc_worker.shell.kafka_transactions import KafkaTransactions

log = logging.getLogger(__name__)


class StreamCommits:
    """`transactions` (the stream's transactional producer) and the `grouping` of what it holds.
    `produced` counts the messages handed to the producer; `producing` says whether a Postgres
    transaction's messages are being produced (the open Kafka transaction may not be committed)."""

    def __init__(
        self,
        transactions: KafkaTransactions,
        start_lsn: int,
        *,
        tracker: AckTracker,
        produced: Callable[[], int],
        producing: Callable[[], bool],
    ) -> None:
        self.transactions = transactions
        self.grouping = TransactionGrouping(start_lsn, now=time.monotonic())
        self.tracker = tracker
        self._produced = produced
        self._producing = producing
        self._committing = False

    def postgres_committed(self, end_lsn: int) -> None:
        """A Postgres transaction's messages are all in the open Kafka transaction."""
        if self.grouping.postgres_committed(end_lsn, self._produced(), time.monotonic()):
            self.commit(due=True)

    def _blocked(self) -> bool:
        return self._committing or self._producing() or self.tracker.failure is not None

    def commit(self, *, idle: bool = False, due: bool = False) -> None:
        """Commit the open Kafka transaction when the grouping says so (`due`: it already did;
        `idle`: the slot has nothing more to send), then let what it made visible be acknowledged."""
        if self._blocked():
            return
        grouping, produced = self.grouping, self._produced()
        if not due and not grouping.due(time.monotonic(), produced, idle=idle):
            return
        self._committing = True
        started = time.monotonic()
        try:
            self.transactions.commit(grouping.grouped_lsn)
        finally:
            self._committing = False
        now = time.monotonic()
        grouping.kafka_committed(now, produced, now - started)

    def commit_pending(self) -> bool:
        """Commit the open Kafka transaction now if a committed Postgres transaction waits in it (a
        streamed transaction's own Kafka transaction commits after it); True when none waits."""
        if self.grouping.pending:
            self.commit(due=True)
        return not self.grouping.pending

    def close(self) -> None:
        """At the end of the stream: commit the open Kafka transaction when it holds whole Postgres
        transactions only, else abort it (Postgres sends them again); either way the next session,
        after a reconnect, finds one open. Logs what the session's commits cost."""
        transactions = self.transactions
        if transactions.open:
            if self._producing() or self.tracker.failure is not None:
                transactions.abort()
            else:
                self.commit(due=True)
        log.info(
            "exactly-once: %d Kafka transactions committed, %.2f s spent committing them",
            self.grouping.commits,
            transactions.commit_seconds,
        )
