"""The stream's transactional producer under `--delivery exactly-once`: init, commit, abort, and
each way they fail said in one line with what to do.

`transactional.id` is the slot's (`kafka_contract.topics.transactional_id`): a worker that starts
on a slot fences any other producer still holding it (a second worker, a zombie that lost its
Postgres connection but not its Kafka one) and aborts whatever transaction a killed one left open,
before it produces anything. The same producer (the native one when the stream uses it, else
confluent-kafka's) takes every message of the stream, so one transaction holds them all in their
order. The snapshot's readers have transactional producers of their own, each table a transaction
(`shell.snapshot.table_commits`), whose commits record positions under another group
(`group_id`) and name the topic they record it on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from cdc_worker.core.encoding.native import NativeProducer, build_native_producer
from cdc_worker.core.encoding.native_extension import TransactionCalls, TxnError
from cdc_worker.core.errors import ConfigurationError, InfrastructureError
from cdc_worker.core.kafka_transactions import AlreadyInKafka
from cdc_worker.core.lsn import format_lsn

log = logging.getLogger(__name__)

# How long init_transactions may take: it finds the coordinator, fences the previous producer and
# waits for its open transaction to be aborted.
INIT_TIMEOUT_S = 60.0
COMMIT_TIMEOUT_S = 60.0
ABORT_TIMEOUT_S = 30.0
# Retriable commit failures (a coordinator moving) are retried this many times.
COMMIT_ATTEMPTS = 3

_FENCED = frozenset({"_FENCED", "PRODUCER_FENCED", "INVALID_PRODUCER_EPOCH"})
# How librdkafka words a fenced producer's failed deliveries and calls.
_FENCED_WORDS = ("fenced", "old epoch", "_FENCED")
_REFUSED = frozenset({"TRANSACTIONAL_ID_AUTHORIZATION_FAILED", "CLUSTER_AUTHORIZATION_FAILED"})
_TIMED_OUT = frozenset({"TRANSACTION_TIMED_OUT", "INVALID_TXN_STATE", "INVALID_PRODUCER_ID_MAPPING"})


class ProducerFenced(ConfigurationError):
    """Another producer took the slot's transactional.id: two workers on one slot."""


class TransactionsUnavailable(ConfigurationError):
    """The brokers cannot run transactions for the worker (settings, version, ACLs)."""


class TransactionFailed(InfrastructureError):
    """A Kafka transaction was aborted (timed out, a delivery failed): restart from the slot."""


class ConfluentCalls:
    """confluent-kafka's Producer, its KafkaException turned into a `TxnError`. `group`: a consumer
    of the position's group, whose group metadata `send_offsets_to_transaction` takes."""

    def __init__(self, producer: Producer, group: Consumer) -> None:
        self.producer = producer
        self.group = group

    @staticmethod
    def _call(call: Callable[[], object]) -> TxnError | None:
        try:
            call()
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            if isinstance(error, KafkaError):
                return (
                    error.name(),
                    error.str(),
                    error.fatal(),
                    error.txn_requires_abort(),
                    error.retriable(),
                )
            return ("unknown", str(exc), False, False, False)
        return None

    def init_transactions(self, timeout: float) -> TxnError | None:
        return self._call(lambda: self.producer.init_transactions(timeout))

    def begin_transaction(self) -> TxnError | None:
        return self._call(self.producer.begin_transaction)

    def commit_transaction(self, timeout: float) -> TxnError | None:
        return self._call(lambda: self.producer.commit_transaction(timeout))

    def abort_transaction(self, timeout: float) -> TxnError | None:
        return self._call(lambda: self.producer.abort_transaction(timeout))

    def send_position(
        self, topic: str, partition: int, offset: int, group_id: str, timeout: float
    ) -> TxnError | None:
        offsets = [TopicPartition(topic, partition, offset)]
        metadata = self.group.consumer_group_metadata()
        return self._call(lambda: self.producer.send_offsets_to_transaction(offsets, metadata, timeout))


def _said(error: TxnError) -> str:
    name, text, *_ = error
    return f"{text} ({name})" if text else name


def fenced_error(tid: str, error: TxnError) -> ProducerFenced:
    return ProducerFenced(
        f"fenced: another producer with transactional.id {tid} started (a second worker on this slot, "
        f"{_said(error)}); this worker stops without acknowledging its open transaction: run one worker "
        "per slot"
    )


class KafkaTransactions:
    """The stream's transactions on one producer: `start` (init and the first begin), then `commit`
    (which begins the next one) and `abort`. A commit is preceded by `flush`, which serves every
    delivery report first, so the tracker has counted every message the commit makes visible."""

    def __init__(
        self,
        calls: TransactionCalls,
        tid: str,
        *,
        broker: str,
        flush: Callable[[float], int],
        position_topic: str,
        group: Consumer | None = None,
        group_id: str | None = None,
    ) -> None:
        self.calls = calls
        self.tid = tid
        # The consumer group whose committed offsets are the positions (the transactional id's own
        # for the stream; the snapshot's producers share one, an offset per table's topic).
        self.group_id = group_id or tid
        self.broker = broker
        self._flush = flush
        # Where each commit records the position it made visible: group `tid`'s committed offset of
        # partition 0 of `position_topic` (the control topic), written inside the transaction.
        self.position_topic = position_topic
        self._group = group
        self.committed_lsn = 0  # the newest position a commit recorded (`load_position` at start)
        self.fatal_error: TxnError | None = None  # what a transactional call last answered, if fatal
        self.open = False
        self.commit_seconds = 0.0  # time spent committing, for the log and the measurements

    def start(self, timeout: float = INIT_TIMEOUT_S, *, announce: bool = True) -> None:
        """init_transactions (fences the slot's previous producer, aborts its open transaction),
        then begin the first transaction. Raises `TransactionsUnavailable` in one line. `announce`:
        say so at info (the stream's one producer), else at debug (the snapshot readers' many)."""
        error = self.calls.init_transactions(timeout)
        if error is not None:
            if error[0] in _REFUSED:
                raise TransactionsUnavailable(
                    f"Kafka at {self.broker} refuses transactional.id {self.tid} ({_said(error)}): grant the "
                    "worker's principal WRITE and DESCRIBE on that TransactionalId, or run with --delivery "
                    "at-least-once"
                )
            raise TransactionsUnavailable(
                f"Kafka at {self.broker} did not start transactions for {self.tid} within {timeout:.0f}s "
                f"({_said(error)}): the brokers need the transaction coordinator (Kafka 2.5+, "
                "transaction.state.log.replication.factor and transaction.state.log.min.isr no more "
                "than the brokers there are), or run with --delivery at-least-once"
            )
        log.log(
            logging.INFO if announce else logging.DEBUG,
            "exactly-once delivery: transactional.id %s ready, earlier producers fenced",
            self.tid,
        )
        self._begin()

    def begin(self) -> None:
        """Begin the next transaction after one that failed (`commit` and `abort` begin it)."""
        self._begin()

    def _begin(self) -> None:
        error = self.calls.begin_transaction()
        if error is not None:
            raise self._failure("begin", error)
        self.open = True

    def load_position(self, timeout: float = INIT_TIMEOUT_S) -> int:
        """The position the last committed transaction recorded (0: none), kept as `committed_lsn`.
        Postgres' confirmed position may trail it (a worker killed between a Kafka commit and its
        status update): the stream must start here, not there, or it publishes those again."""
        if self._group is None:
            return self.committed_lsn
        try:
            committed = self._group.committed([TopicPartition(self.position_topic, 0)], timeout=timeout)
        except KafkaException as exc:
            raise TransactionsUnavailable(
                f"cannot read the position Kafka committed for {self.tid} on {self.broker} ({exc}): "
                "grant the worker's principal READ on its consumer group of that name, or run with "
                "--delivery at-least-once"
            ) from None
        offset = committed[0].offset if committed else -1
        self.committed_lsn = max(self.committed_lsn, offset if offset is not None and offset > 0 else 0)
        return self.committed_lsn

    def already_in_kafka(
        self, slot_lsn: int, table_points: Mapping[int, int] | None = None
    ) -> AlreadyInKafka | None:
        """What of the stream from the slot's `slot_lsn` Kafka holds already (None: nothing). Past
        the slot when the worker was killed between a Kafka commit and its acknowledgement, or while
        a re-snapshot held the slot at its watermark: the stream still starts from the slot (the
        watermark must be read again) and publishes nothing up to here. `table_points`: the tables
        whose snapshot was read after `slot_lsn`, and at which LSN (`AlreadyInKafka`)."""
        points = {oid: point for oid, point in (table_points or {}).items() if point > slot_lsn}
        if points:
            log.info(
                "%d tables' snapshots were read after the slot's %s (the newest at %s): their changes "
                "before that are read again and not published",
                len(points),
                format_lsn(slot_lsn),
                format_lsn(max(points.values())),
            )
        if self.committed_lsn <= slot_lsn:
            return AlreadyInKafka(0, points) if points else None
        log.info(
            "Kafka committed up to %s, past the slot's %s: the transactions up to there are read again "
            "and not published",
            format_lsn(self.committed_lsn),
            format_lsn(slot_lsn),
        )
        return AlreadyInKafka(self.committed_lsn, points)

    def commit(self, position: int | None = None, *, restart: bool = False, topic: str | None = None) -> None:
        """Make the open transaction visible, recording `position` (the end LSN of its newest
        Postgres transaction) with it, then begin the next one. Raises `ProducerFenced` or
        `TransactionFailed` (after aborting it) in one line. `restart`: record `position` even if
        it is behind the one recorded (a new slot starts over, from its snapshot's point). `topic`:
        record it as partition 0 of that topic instead of `position_topic`."""
        started = time.monotonic()
        try:
            missing = self._flush(COMMIT_TIMEOUT_S)
        except Exception as exc:  # confluent-kafka raises a fatal error from inside its flush
            self.abort(begin_next=False)  # a fenced producer answers with its fatal error
            fenced = self.fenced_by(str(exc))
            if fenced is not None:
                raise fenced from None
            raise TransactionFailed(
                f"the Kafka transaction could not be flushed ({exc}); it was aborted and the worker "
                "restarts from the slot's last acknowledged position"
            ) from None
        if missing:
            self.abort(begin_next=False)
            raise TransactionFailed(
                f"{missing} messages not delivered to Kafka within {COMMIT_TIMEOUT_S:.0f}s: the open "
                "transaction was aborted; the worker restarts from the slot's last acknowledged position"
            )
        if position is not None and (restart or position > self.committed_lsn):
            error = self.calls.send_position(
                topic or self.position_topic, 0, position, self.group_id, COMMIT_TIMEOUT_S
            )
            if error is not None:
                raise self._failure("record its position", error)
        for attempt in range(COMMIT_ATTEMPTS):
            error = self.calls.commit_transaction(COMMIT_TIMEOUT_S)
            if error is None:
                break
            retriable = error[4] and not error[2] and not error[3]
            if not retriable or attempt == COMMIT_ATTEMPTS - 1:
                raise self._failure("commit", error)
            log.warning("committing the Kafka transaction again: %s", _said(error))
        self.open = False
        if position is not None:
            self.committed_lsn = position if restart else max(self.committed_lsn, position)
        self.commit_seconds += time.monotonic() - started
        self._begin()

    def fenced_by(self, reason: str) -> ProducerFenced | None:
        """The fenced error, when `reason` (a failed delivery's, an exception's) or the fatal error
        a transactional call last answered says the producer was fenced: a stream that stops on its
        deliveries ("Purged in queue") then says that, not "check Kafka"."""
        fatal = self.fatal_error
        if fatal is not None and (fatal[0] in _FENCED or any(word in fatal[1] for word in _FENCED_WORDS)):
            return fenced_error(self.tid, fatal)
        if any(word in reason for word in _FENCED_WORDS):
            self.open = False
            return fenced_error(
                self.tid, ("_FENCED", reason.split(" (commit LSN", maxsplit=1)[0], True, False, False)
            )
        return None

    def raise_if_fenced(self, reason: str) -> None:
        """A stream that stopped on a failed delivery (`reason`) stops as fenced when it was."""
        fenced = self.fenced_by(reason)
        if fenced is not None:
            raise fenced

    def fatal(self, error: BaseException) -> ProducerFenced | None:
        """For an error the producer raised while producing (confluent-kafka's "Local: Fatal
        error"): the fenced error when the fatal error behind it is fencing. A transactional call
        on a producer in that state answers with the original error."""
        if not isinstance(error, KafkaException):
            return None
        fenced = self.fenced_by(str(error))
        if fenced is not None:
            return fenced
        cause = error.args[0] if error.args else None
        if not isinstance(cause, KafkaError) or not (cause.fatal() or cause.code() == KafkaError._FATAL):
            return None
        self.open = False
        answer = self.calls.abort_transaction(0.1)
        if answer is not None and (answer[0] in _FENCED or self.fenced_by(answer[1]) is not None):
            return fenced_error(self.tid, answer)
        return None

    def abort(self, *, begin_next: bool = True) -> None:
        """Abort the open transaction (its messages are never visible), then begin the next one.
        Nothing of it was acknowledged, so a failing abort only costs a log line."""
        if not self.open:
            return
        self.open = False
        error = self.calls.abort_transaction(ABORT_TIMEOUT_S)
        if error is not None:
            if error[2]:
                self.fatal_error = error
            else:
                log.warning("could not abort the open Kafka transaction: %s", _said(error))
            return
        if begin_next:
            begin = self.calls.begin_transaction()
            if begin is None:
                self.open = True

    def _failure(self, what: str, error: TxnError) -> Exception:
        name, _, fatal, abortable, _ = error
        if name in _FENCED or (fatal and "fenced" in error[1].lower()):
            self.open = False
            return fenced_error(self.tid, error)
        if abortable:
            self.abort(begin_next=False)
        else:
            self.open = False
        if name in _TIMED_OUT or "timed out" in error[1].lower():
            return TransactionFailed(
                f"Kafka aborted the worker's transaction ({_said(error)}): it stayed open past "
                "transaction.timeout.ms (the worker stalled, or a Postgres transaction took longer to "
                "produce than that); the worker restarts from the slot's last acknowledged position "
                "(raise -C transaction.timeout.ms, up to the broker's transaction.max.timeout.ms, if "
                "this repeats)"
            )
        return TransactionFailed(
            f"the Kafka transaction could not {what} ({_said(error)}); it was aborted and the worker "
            "restarts from the slot's last acknowledged position"
        )


def start_transactions(
    settings: dict[str, Any],
    group_settings: dict[str, Any],
    *,
    native: bool,
    broker: str,
    flush: Callable[[float], int],
    position_topic: str,
    announce: bool = True,
) -> tuple[KafkaTransactions, tuple[Producer | None, NativeProducer | None]]:
    """The stream's transactional producer (`settings`, with its `transactional.id`; the native
    one when `native`, else confluent-kafka's) with its transactions started, and the position's
    consumer group (`group_settings`: read at start, and for confluent-kafka its metadata goes with
    each commit). Returns the transactions and the producer, to be used once the snapshot is done."""
    group = Consumer({**group_settings, "enable.auto.commit": False, "isolation.level": "read_committed"})
    calls: TransactionCalls
    producers: tuple[Producer | None, NativeProducer | None]
    if native:
        native_producer = build_native_producer(settings)
        producers, calls = (None, native_producer), native_producer
    else:
        producer = Producer(settings)
        producers, calls = (producer, None), ConfluentCalls(producer, group)
    transactions = KafkaTransactions(
        calls,
        settings["transactional.id"],
        broker=broker,
        flush=flush,
        position_topic=position_topic,
        group=group,
        group_id=group_settings["group.id"],
    )
    transactions.start(announce=announce)
    return transactions, producers
