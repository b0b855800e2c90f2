"""Publishing inside the stream's open transaction, tracked for acknowledgement.

Every message handed to Kafka takes a delivery token from the `AckTracker`; its delivery report
settles the token. A message Kafka did not take, one over the size limit, or an event that could
not be encoded counts as a failed message of its transaction, so that under `--on-error=exit`
nothing past it is acknowledged; under `log` it is counted and skipped. A Kafka outage fails every
message in flight alike: the first failure of each kind and table is logged in full, the rest
counted and summed up once at the end (`report_failure_counts`).

With the native producer (`native`), every message of the stream goes through it, so that no two
messages of a key can pass each other between two producers: runs of row changes are encoded and
produced from Rust in one call (`settle_run` books them afterwards), as are a committed streamed
transaction's spooled records (`produce_spooled`); everything else one message at a time. Its
delivery reports are counted in Rust per batch (one per transaction and table, released once the
transaction is acknowledgeable) and handed to the tracker in bulk at each poll.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Mapping
from functools import partial

from confluent_kafka import KafkaError, Message

from cdc_worker.core.ack import AckTracker, DeliveryToken, FailurePolicy
from cdc_worker.core.changes.native_changes import NativeItem
from cdc_worker.core.changes.spool import SpoolChunk
from cdc_worker.core.encoding.native import NativeProducer, ProducedChanges
from cdc_worker.core.encoding.native_extension import SpoolTargets
from cdc_worker.core.encoding.serializers import EncodedMessage, TransactionHeaders
from cdc_worker.core.errors import InfrastructureError
from cdc_worker.core.failure_tally import FailureTally
from cdc_worker.core.lsn import format_lsn
from cdc_worker.shell.kafka_publisher import KafkaPublisher, MessageTooLarge
from cdc_worker.shell.metrics import WorkerMetrics

log = logging.getLogger(__name__)


class TrackedPublisher:
    """The stream's side of Kafka: produce, delivery reports, failures under the policy, counters.

    `while_waiting` runs while the producer's queue is full (the stream's status updates);
    `current_lsn` names the transaction being published in error messages."""

    def __init__(
        self,
        *,
        publisher: KafkaPublisher,
        tracker: AckTracker,
        policy: FailurePolicy,
        metrics: WorkerMetrics | None,
        while_waiting: Callable[[], object],
        current_lsn: Callable[[], int],
        native: NativeProducer | None = None,
    ) -> None:
        self.publisher = publisher
        self.tracker = tracker
        self.policy = policy
        self.metrics = metrics
        self._while_waiting = while_waiting
        self._current_lsn = current_lsn
        self.published = self.skipped = 0
        self.untracked = 0  # messages outside any transaction (`produce_untracked`)
        self.delivery_failures = FailureTally()
        self._event_counts: dict[tuple[str, str], int] = {}
        self._byte_counts: dict[str, int] = {}
        self._callback_token: DeliveryToken | None = None
        self._callbacks: dict[str, Callable[[KafkaError | None, Message], None]] = {}
        self.native = native
        # The native producer's batches: those of the open transaction by table, and every batch
        # whose reports may still come, with its transaction's token.
        self._batch_token: DeliveryToken | None = None
        self._batch_ids: dict[str, int] = {}
        self._live_batches: deque[tuple[int, DeliveryToken]] = deque()
        self._untracked_batches: dict[str, int] = {}  # by what their messages are

    def _on_delivery(
        self, token: DeliveryToken, table: str, error: KafkaError | None, message: Message
    ) -> None:
        if error is None:
            self.tracker.delivered(token)
            return
        self._not_delivered(token, table, message.topic() or "", error.str())

    def _not_delivered(self, token: DeliveryToken, table: str, topic: str, error: str) -> None:
        reason = (
            f"change of {table} not delivered to topic {topic}: {error} (commit LSN "
            f"{format_lsn(token.end_lsn) if token.end_lsn else 'open'}); check Kafka, then restart"
        )
        self.count_error("delivery")
        self.tracker.failed(token, reason)
        # An outage fails every message in flight alike: the first in full, the rest in a count.
        if self.delivery_failures.record((f"changes not delivered: {error}", table), reason):
            self._report(reason)
        elif self.policy is FailurePolicy.LOG:
            self.skipped += 1

    def _native_failed(self, token: DeliveryToken, table: str, topic: str, error: str, count: int) -> None:
        for _ in range(count):
            self._not_delivered(token, table, topic, error)

    def native_batch(self, table: str) -> int:
        """The native producer's batch of the open transaction's messages for `table`."""
        token = self.tracker.open_token()
        if token is not self._batch_token:
            self._batch_token = token
            self._batch_ids = {}
        batch = self._batch_ids.get(table)
        if batch is None:
            batch = self.publisher.native_batch(
                partial(self._native_failed, token, table), partial(self.tracker.delivered, token)
            )
            self._batch_ids[table] = batch
            self._live_batches.append((batch, token))
        return batch

    def release_settled_batches(self) -> None:
        """Let go of the batches of transactions whose every report has come, oldest first (they
        settle in about commit order, so this stops at the first one still waiting)."""
        live = self._live_batches
        while live and not live[0][1].pending and live[0][1].end_lsn is not None:
            self.publisher.release_batch(live.popleft()[0])

    def _report(self, reason: str) -> None:
        if self.policy is FailurePolicy.EXIT:
            log.error("%s", reason)
        else:
            self.skipped += 1
            log.warning("skipped (--on-error=log): %s", reason)

    def count_error(self, kind: str) -> None:
        if self.metrics is not None:
            self.metrics.errors.labels(kind).inc()

    def _callback(self, token: DeliveryToken, table: str) -> Callable[[KafkaError | None, Message], None]:
        """The delivery callback of `token`'s transaction for `table`: one per transaction and
        table, not one per message."""
        if token is not self._callback_token:
            self._callback_token = token
            self._callbacks = {}
        callback = self._callbacks.get(table)
        if callback is None:
            callback = self._callbacks[table] = partial(self._on_delivery, token, table)
        return callback

    def produce(self, message: EncodedMessage, table: str, op: str) -> None:
        """Hand one message to the producer as part of the open transaction. The hot path: one
        delivery callback per transaction and table (not per message), counters kept in plain
        dicts and handed to Prometheus on each status tick."""
        token = self.tracker.sent()
        native = self.native
        if native is not None:
            refused = native.produce(
                message.topic, message.key, message.value, message.headers, self.native_batch(table)
            )
            if refused is not None:
                self._refused(token, table, message.topic, refused)
                return
        else:
            try:
                self.publisher.produce(
                    message, self._callback(token, table), while_waiting=self._while_waiting
                )
            except MessageTooLarge as exc:
                self._too_large(exc, token, table)
                return
        self.published += 1
        counter = (table, op)
        self._event_counts[counter] = self._event_counts.get(counter, 0) + 1
        self._byte_counts[table] = (
            self._byte_counts.get(table, 0) + len(message.value or b"") + len(message.key or b"")
        )

    @property
    def produced(self) -> int:
        """Messages handed to the producer so far, of any kind (the exactly-once grouping's count)."""
        return self.published + self.untracked

    def produce_run(self, items: list[NativeItem], table: str, messages: int) -> bool:
        """The items of a native run (`NativeChangePath.encode_run`: `messages` messages, the rest
        exceptions) in order, each as `produce` or `data_error` takes it, with one
        `AckTracker.sent_run` for all the messages. False when a failure under --on-error=exit
        stopped it: as the per-change path, which stops at the failed change, nothing after the
        failure is handed to the producer."""
        tracker = self.tracker
        token = tracker.sent_run(messages)
        callback = self._callback(token, table)
        produce, while_waiting = self.publisher.produce, self._while_waiting
        ops: dict[str, int] = {}
        handed = size = 0
        stopped = False
        for encoded, op in items:
            if isinstance(encoded, Exception):
                self.data_error(table, encoded)
            else:
                handed += 1
                try:
                    produce(encoded, callback, while_waiting=while_waiting)
                except MessageTooLarge as exc:
                    self._too_large(exc, token, table)
                else:
                    ops[op] = ops.get(op, 0) + 1
                    size += len(encoded.value or b"") + len(encoded.key or b"")
            # A data error, or a delivery report served while the queue was full.
            if tracker.failure is not None:
                stopped = True
                break
        if handed < messages:
            tracker.withdrawn(token, messages - handed)
        self._count_published(table, ops, size)
        return not stopped

    def produce_untracked(self, message: EncodedMessage, what: str) -> None:
        """A message outside any transaction, whose loss loses nothing (a restart sends it again):
        not tracked, a failed delivery only logged, naming `what` it was. Through the same producer
        as the stream's other messages."""
        self.untracked += 1
        native = self.native
        if native is None:
            self.publisher.produce(message, partial(_log_untracked_failure, what))
            return
        batch = self._untracked_batches.get(what)
        if batch is None:
            batch = self.publisher.native_batch(partial(_log_untracked_native_failure, what))
            self._untracked_batches[what] = batch
        refused = native.produce(message.topic, message.key, message.value, message.headers, batch)
        if refused is not None:
            _log_untracked_native_failure(what, message.topic, refused[1], 1)

    def settle_run(self, done: ProducedChanges, table: str, topic: str) -> bool:
        """Book a run the native producer took (`NativeChangePath.produce_run`): its messages as
        sent for the open transaction (before any of their reports is served), then its problems
        in order, as `produce` and `data_error` take them. False when a failure under
        --on-error=exit stopped it."""
        tracker = self.tracker
        token = tracker.open_token()
        if done.messages:
            tracker.sent_run(done.messages)
        for problem in done.problems:
            if isinstance(problem, Exception):
                self.data_error(table, problem)
            else:
                self._refused(token, table, topic, problem[1:])
        self._count_published(table, done.ops, done.size)
        return tracker.failure is None

    def produce_spooled(  # noqa: PLR0917 - `spooled_commit.BulkProducer` with the commit bound
        self,
        headers: TransactionHeaders,
        tables: Mapping[int, str],
        chunk: SpoolChunk,
        position: int,
        targets: SpoolTargets,
        first_seq: int,
    ) -> tuple[int, int] | None:
        """The records of a committed streamed transaction's spool `chunk` that the native producer
        takes from `position` on (`core.changes.spooled_commit`), with the commit's `headers`,
        booked as `settle_run` books a run (`tables`: the relations' names). Returns the position
        after them and how many records they were, or None once a failure under --on-error=exit
        stopped the transaction (nothing after the failure is produced)."""
        native, tracker = self.native, self.tracker
        if native is None:
            raise RuntimeError("produce_spooled needs the native producer")
        if tracker.failure is not None:
            return None
        (_, lsn), (_, xid), (_, commit_ts) = headers
        after, taken, produced, refused = native.produce_spooled(
            chunk, position, targets=targets, lsn=lsn, xid=xid, commit_ts=commit_ts, first_seq=first_seq,
            stop_on_refusal=self.policy is FailurePolicy.EXIT,
        )  # fmt: skip
        token = tracker.open_token()
        messages = sum(c + u + d for _, c, u, d, _ in produced) + len(refused)
        if messages:
            tracker.sent_run(messages)
        for oid, size, reason, too_large in refused:
            self._refused(token, tables[oid], targets[oid][0], (size, reason, too_large))
        for oid, inserts, updates, deletes, size in produced:
            ops = {op: n for op, n in (("c", inserts), ("u", updates), ("d", deletes)) if n}
            self._count_published(tables[oid], ops, size)
        return None if tracker.failure is not None else (after, taken)

    def count_published(self, table: str, ops: dict[str, int], size: int) -> None:
        """Messages produced elsewhere (a streamed transaction's own producer), in the counters."""
        self._count_published(table, ops, size)

    def _count_published(self, table: str, ops: dict[str, int], size: int) -> None:
        """A run's produced messages per op and their key and value bytes, into the counters."""
        counts = self._event_counts
        for op, count in ops.items():
            self.published += count
            counts[table, op] = counts.get((table, op), 0) + count
        self._byte_counts[table] = self._byte_counts.get(table, 0) + size

    def _refused(self, token: DeliveryToken, table: str, topic: str, refused: tuple[int, str, bool]) -> None:
        """A message the native producer refused when handed it: over the size limit (a data
        error), or anything else librdkafka says, as a failed delivery."""
        size, reason, too_large = refused
        if too_large:
            self._too_large(self.publisher.too_large(size, topic), token, table)
        else:
            self._not_delivered(token, table, topic, reason)

    def _too_large(self, exc: MessageTooLarge, token: DeliveryToken, table: str) -> None:
        self.count_error("message_too_large")
        reason = (
            f"{exc} (table {table}, commit LSN {format_lsn(self._current_lsn())}): raise the topic's "
            "max.message.bytes and -C message.max.bytes, or exclude the table"
        )
        self.tracker.failed(token, reason)
        self._report(reason)

    def flush_counters(self) -> None:
        metrics = self.metrics
        if metrics is None:
            return
        for (table, op), count in self._event_counts.items():
            metrics.events.labels(table, op).inc(count)
        for table, size in self._byte_counts.items():
            metrics.bytes.labels(table).inc(size)
        self._event_counts.clear()
        self._byte_counts.clear()

    def data_error(self, table: str, exc: Exception) -> None:
        """An event that cannot be encoded: counted as a failed message of its transaction, so that
        under EXIT nothing past it is acknowledged."""
        kind = "registry" if isinstance(exc, InfrastructureError) else "encoding"
        self.count_error(kind)
        reason = f"change of {table} at commit LSN {format_lsn(self._current_lsn())} cannot be encoded: {exc}"
        if kind == "registry":
            reason += (
                "; check that the schema registry is reachable and accepts the schema (compatibility level)"
            )
        self.tracker.failed(self.tracker.sent(), reason)
        self._report(reason)

    def report_failure_counts(self) -> None:
        """The failures counted but not logged one by one, one line per kind and table."""
        for line in self.delivery_failures.summary():
            if self.policy is FailurePolicy.EXIT:
                log.error("%s", line)
            else:
                log.warning("skipped (--on-error=log): %s", line)


def _log_untracked_failure(what: str, error: KafkaError | None, message: Message) -> None:
    if error is not None:
        log.warning("%s was not delivered to %s: %s", what, message.topic(), error.str())


def _log_untracked_native_failure(what: str, topic: str, reason: str, count: int) -> None:
    log.warning("%s was not delivered to %s: %s", what, topic, reason)
