"""Which LSN is safe to acknowledge to Postgres, given what Kafka has durably accepted.

Acknowledging (`flush_lsn` in the standby status update) tells Postgres it may discard the WAL and
never send those transactions again, so a position may be acknowledged only once every message of
every transaction up to it has been delivered (acks=all). Kafka's delivery callbacks arrive in any
order, across partitions and transactions, so the tracker keeps one small record per transaction
in flight (a deque, oldest first) with a counter of undelivered messages: O(1) per event, no
per-message bookkeeping.

Why `end_lsn` and not the commit LSN: when a slot restarts, Postgres skips a transaction whose
commit record starts before the confirmed flush position (`commit_lsn < confirmed_flush`).
Acknowledging the commit LSN itself would not satisfy that, so the last delivered transaction would
be sent again after every restart. Its `end_lsn` (the end of its commit record) is what Postgres'
own subscribers acknowledge, and it covers exactly that transaction and nothing after it.

Shell protocol, in stream order:
    token = tracker.sent()            # for each message handed to the producer
                                      # (or sent_run(n) once for n in a row, withdrawn() for the unsent;
                                      # open_token() first where the producer needs the token before)
    ... producer callback: tracker.delivered(token) or tracker.failed(token, reason)
    tracker.committed(event)          # for each model.TransactionCommitted, after its messages
    lsn = tracker.safe_flush_lsn()    # whenever a status update is due
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass

from cdc_worker.core.lsn import format_lsn
from cdc_worker.core.model import TransactionCommitted


class FailurePolicy(enum.StrEnum):
    """`--on-error`: what a failed delivery does to acknowledgement."""

    EXIT = "exit"  # stop advancing at the failed transaction; the shell exits non-zero
    LOG = "log"  # count the message as done (skipped) and keep acknowledging


class AckTrackerError(RuntimeError):
    """The shell called the tracker out of protocol order (a bug, not a data problem)."""


@dataclass(frozen=True, slots=True)
class DeliveryFailure:
    """The first delivery that failed under `FailurePolicy.EXIT`."""

    reason: str
    # end_lsn of the transaction it belongs to, or None when that transaction was still open.
    end_lsn: int | None


class DeliveryToken:
    """One transaction in flight; `sent()` hands the same token out for each of its messages, so
    the shell passes it to the delivery callback without any per-message state."""

    __slots__ = ("end_lsn", "failed", "pending")

    def __init__(self) -> None:
        self.pending = 0
        self.end_lsn: int | None = None  # None until the transaction is committed
        self.failed = False


class AckTracker:
    """Computes `safe_flush_lsn()` from sends, delivery callbacks and transaction ends.

    Under EXIT, once a delivery fails nothing past it is ever acknowledged again; the shell is
    expected to stop, so the transactions queued behind the failure are not trimmed.

    `start_lsn` is the position already safe when the worker starts (the slot's confirmed flush
    LSN, or the snapshot's consistent point), so the first status update does not go backwards.
    """

    def __init__(self, policy: FailurePolicy = FailurePolicy.EXIT, start_lsn: int = 0) -> None:
        self.policy = policy
        self._safe_lsn = start_lsn
        self._last_end_lsn = start_lsn
        # Transactions not yet acknowledgeable, oldest first; the last one may still be open.
        self._in_flight: deque[DeliveryToken] = deque()
        self._open: DeliveryToken | None = None
        self._pending_messages = 0
        self._failure: DeliveryFailure | None = None
        self.failed_count = 0  # failed deliveries, under either policy
        self.delivered_count = 0

    @property
    def failure(self) -> DeliveryFailure | None:
        """The first failure under EXIT; the shell reports it and exits non-zero."""
        return self._failure

    @property
    def pending_messages(self) -> int:
        return self._pending_messages

    @property
    def open_transaction(self) -> bool:
        """Messages of a transaction not committed yet were handed to the producer."""
        return self._open is not None

    def sent(self) -> DeliveryToken:
        """A message was handed to the producer; returns the token to pass to its callback."""
        token = self._open
        if token is None:
            token = self.open_token()
        token.pending += 1
        self._pending_messages += 1
        return token

    def sent_run(self, count: int) -> DeliveryToken:
        """`count` messages of the open transaction are about to be handed to the producer, one
        after another: `sent()` once for all of them. Those of them the caller then does not hand
        over must be given back with `withdrawn`."""
        token = self.sent()  # `sent` stays the one-message hot path; the run adds the rest
        token.pending += count - 1
        self._pending_messages += count - 1
        return token

    def open_token(self) -> DeliveryToken:
        """The open transaction's token, made if there is none, without counting a message: for a
        producer that is told the token before the messages, which are counted (`sent_run`) once
        they are handed over and before any of their reports is served."""
        token = self._open
        if token is None:
            token = self._open = DeliveryToken()
            self._in_flight.append(token)
        return token

    def withdrawn(self, token: DeliveryToken, count: int) -> None:
        """`count` messages announced by `sent_run` were not handed to the producer after all (the
        stream stopped at a failure before them): no delivery report will come for them."""
        if count > token.pending:
            raise AckTrackerError("more messages withdrawn than were sent and not yet reported")
        self._settle(token, count)

    def delivered(self, token: DeliveryToken, count: int = 1) -> None:
        """Kafka durably accepted one message (or `count`) of `token`'s transaction."""
        self._settle(token, count)
        self.delivered_count += count

    def failed(self, token: DeliveryToken, reason: str) -> None:
        """Kafka rejected one message of `token`'s transaction (after the producer's own retries)."""
        self.failed_count += 1
        if self.policy is FailurePolicy.EXIT:
            token.failed = True
            if self._failure is None:
                self._failure = DeliveryFailure(reason, token.end_lsn)
        self._settle(token)

    def _settle(self, token: DeliveryToken, count: int = 1) -> None:
        if token.pending < count:
            raise AckTrackerError("a delivery was reported twice, or for a message never sent")
        token.pending -= count
        self._pending_messages -= count
        if token.pending == 0 and token.end_lsn is not None:
            self._advance()

    def committed(self, transaction: TransactionCommitted) -> None:
        """Every message of the transaction has been sent (or it had none to send)."""
        end_lsn = transaction.end_lsn
        if end_lsn <= self._last_end_lsn:
            raise AckTrackerError(
                f"transaction {transaction.xid} ends at {format_lsn(end_lsn)}, not after the previous "
                f"one at {format_lsn(self._last_end_lsn)}: transactions must be reported in commit order"
            )
        self._last_end_lsn = end_lsn
        token = self._open
        if token is None:  # nothing was sent: the transaction is acknowledgeable as soon as its turn comes
            token = DeliveryToken()
            self._in_flight.append(token)
        self._open = None
        token.end_lsn = end_lsn
        self._advance()

    def _advance(self) -> None:
        """Pop every transaction at the head that is committed and fully delivered. Each one is
        popped once, so this is amortised O(1) per transaction."""
        in_flight = self._in_flight
        stop_at_failure = self.policy is FailurePolicy.EXIT
        while in_flight:
            head = in_flight[0]
            if head.pending or head.end_lsn is None or (stop_at_failure and head.failed):
                return
            in_flight.popleft()
            # max(): a keepalive may have been acknowledged past this (empty) transaction's end.
            self._safe_lsn = max(self._safe_lsn, head.end_lsn)

    def safe_flush_lsn(self) -> int:
        """The end LSN of the newest transaction that, with every earlier one, is fully delivered.
        Under EXIT it never passes a transaction with a failed delivery."""
        return self._safe_lsn

    def idle_position(self, wal_end: int) -> int | None:
        """The position to acknowledge on a keepalive: `wal_end` when nothing is in flight, so an
        idle database retains no WAL; None when something is (then use `safe_flush_lsn()`).

        The shell must not call this while the assembler has a transaction open
        (`ChangeAssembler.in_transaction`): rows decoded but not yet sent are not in flight here.
        """
        if self._in_flight or self._open is not None or self._failure is not None:
            return None
        self._safe_lsn = max(self._safe_lsn, wal_end)
        return self._safe_lsn
