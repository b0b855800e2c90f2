"""Streamed transactions produced before their commit (`--delivery exactly-once`, native producer).

A large transaction streamed while it runs (protocol 2) is still spooled as before, and, while it
runs, its changes are also produced into a Kafka transaction of its own: one producer of a small
pool (`--streamed-producers`, transactional ids `<slot's>-streamed-<n>`, fenced at every start like
the stream's own), so that at its commit only the commit is left to do, not the producing. Its
changes carry `bw.op`, `bw.seq` and `bw.xid` but neither `bw.lsn` nor `bw.commit_ts` (unknown
before the commit); at the Stream Commit the stream's producer first commits what it holds (every
transaction committed before this one), then this transaction's producer produces its commit event
(`kafka_contract.control`, `op` = `commit`: xid, commit LSN and time), records the slot's position
past it and commits, all in one Kafka transaction: a `read_committed` consumer sees the changes and
their commit event together, after every earlier transaction, or nothing of them. A Stream Abort
aborts it; a worker killed meanwhile leaves it open for the next start to abort (fencing), and
Postgres streams the transaction again.

What a transaction cannot do before its commit makes it wait for it after all (one log line; the
spool publishes it at its commit as before, and its Kafka transaction is aborted): a TRUNCATE or
logical message inside it, a change refused under `--on-error`, a rolled-back subtransaction (its
changes are in the Kafka transaction already), a re-snapshot's key texts, every pool producer
busy, a transaction open longer than `OPEN_LIMIT_S` (or two thirds of a lower `-C
transaction.timeout.ms`: well inside the coordinator's timeout), a failed delivery or commit.

Per-key order: before a chunk's changes are produced, the stream's producer has delivered every
message it holds, so a change committed earlier is written to its partition first. Two
transactions never hold the same row at once (row locks), so their changes of a key come in their
commit order, with one exception: an INSERT that waited on a unique index for another
transaction's DELETE of that key wrote its row first; the lake orders them by LSN, a compacted
topic may keep the wrong one (docs/worker.md).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from cdc_worker.core.changes.early_records import KeptRelation, NeedsTopic, judge
from cdc_worker.core.changes.stream_encoding import Serializer, StreamEncoder
from cdc_worker.core.encoding.native import NativeProducer, build_native_producer
from cdc_worker.core.encoding.serializers import EncodedMessage
from cdc_worker.core.pgoutput.decoder import StreamCommit
from cdc_worker.shell.kafka_transactions import KafkaTransactions, TransactionFailed, TransactionsUnavailable
from kafka_contract.topics import streamed_transactional_id

log = logging.getLogger(__name__)

# Their Kafka transactions may stay open as long as the brokers allow by default
# (transaction.max.timeout.ms), not librdkafka's minute.
STREAMED_TRANSACTION_TIMEOUT_MS = 900_000
# A streamed transaction still running after this long waits for its commit: its Kafka transaction
# must be committed well before the coordinator aborts it.
OPEN_LIMIT_S = 600.0
# Postgres streams a transaction once this much of it is decoded (`logical_decoding_work_mem`, 64MB by
# default) and sends what is below it at the commit, after it: with transactions produced while they
# run, the worker's walsender streams from 8MB on, which left a third less to do after a 1M-row
# commit (docs/benchmarks.md, "Exactly-once delivery").
STREAM_FROM = "8MB"
# Every report of a pool producer is counted under one batch: a failure gives its transaction up.
BATCH = 0
FLUSH_STEP_S = 1.0
FLUSH_TIMEOUT_S = 60.0


class MainProducer(Protocol):
    """The stream's producer (`KafkaPublisher`): what it holds, and flushing it."""

    def in_flight(self) -> int: ...

    def flush(self, timeout: float) -> int: ...


@dataclass(eq=False)
class PooledProducer:
    tid: str
    native: NativeProducer
    transactions: KafkaTransactions
    # How long a transaction may be produced on it before it waits for its commit instead.
    open_limit_s: float = OPEN_LIMIT_S


@dataclass(eq=False)
class EarlyStream:
    """One streamed transaction being produced: its producer, the next `bw.seq`, the topics of its
    relations, the Relation records the main assembler learns at the commit, and what it produced
    by relation (inserts, updates, deletes, key and value bytes)."""

    xid: int
    producer: PooledProducer
    encoder: StreamEncoder
    opened_at: float
    next_seq: int = 0
    produce_s: float = 0.0  # spent producing its changes
    targets: dict[int, tuple[str, int]] = field(default_factory=dict)
    relations: list[bytes] = field(default_factory=list)
    produced: dict[int, list[int]] = field(default_factory=dict)


def _drained(native: NativeProducer, timeout: float) -> int:
    """Flush `native`, serving its reports; returns how many messages are still in flight."""
    deadline = time.monotonic() + timeout
    while native.in_flight() and time.monotonic() < deadline:
        native.flush(min(FLUSH_STEP_S, max(0.0, deadline - time.monotonic())))
    return native.in_flight()


def start_pool(settings: Mapping[str, Any], tid: str, control_topic: str, size: int) -> list[PooledProducer]:
    """The pool's producers (`settings`: the stream's producer settings), each with its transactions
    started, which fences what a killed worker left open under its id. An empty pool, said in one
    line, when the brokers refuse (a `transaction.max.timeout.ms` below the pool's timeout)."""
    pool: list[PooledProducer] = []
    # -C transaction.timeout.ms wins; a transaction gives up well before the coordinator's abort.
    timeout_ms = int(settings.get("transaction.timeout.ms", STREAMED_TRANSACTION_TIMEOUT_MS))
    open_limit_s = min(OPEN_LIMIT_S, timeout_ms / 1000 * 2 / 3)
    for number in range(size):
        pooled_tid = streamed_transactional_id(tid, number)
        native = build_native_producer(
            {**settings, "transaction.timeout.ms": str(timeout_ms), "transactional.id": pooled_tid}
        )
        transactions = KafkaTransactions(
            native,
            pooled_tid,
            broker=str(settings.get("bootstrap.servers", "")),
            flush=lambda timeout, native=native: _drained(native, timeout),  # type: ignore[misc]
            position_topic=control_topic,
            group_id=tid,  # the stream's position, recorded by whichever producer commits it
        )
        try:
            transactions.start(announce=False)
        except TransactionsUnavailable as exc:
            log.warning(
                "large transactions are produced at their commit, not while they run: %s "
                "(raise the brokers' transaction.max.timeout.ms to %d ms)",
                exc,
                STREAMED_TRANSACTION_TIMEOUT_MS,
            )
            return []
        pool.append(PooledProducer(pooled_tid, native, transactions, open_limit_s))
    log.info(
        "exactly-once: large transactions produced while they run, up to %d at once "
        "(transactional ids %s-streamed-0..%d)",
        size, tid, size - 1,
    )  # fmt: skip
    return pool


def stream_sooner(cursor: Any) -> None:
    """Lower this replication connection's `logical_decoding_work_mem` to `STREAM_FROM` (never
    raise it), before its START_REPLICATION."""
    cursor.execute(
        "SELECT current_setting('logical_decoding_work_mem'), "
        "set_config('logical_decoding_work_mem', %s, false) "
        "WHERE pg_size_bytes(current_setting('logical_decoding_work_mem')) > pg_size_bytes(%s)",
        (STREAM_FROM, STREAM_FROM),
    )
    lowered = cursor.fetchall()
    if lowered:
        log.info(
            "logical_decoding_work_mem lowered from %s to %s for this stream: large transactions are "
            "streamed, and produced, sooner",
            lowered[0][0],
            STREAM_FROM,
        )


class EarlyStreams:
    """The streamed transactions being produced before their commit, on `pool`'s producers.
    `main` is the stream's producer, flushed before a chunk is produced (per-key order); `count` books a
    committed transaction's messages in the stream's counters (table, ops, bytes)."""

    def __init__(
        self,
        pool: list[PooledProducer],
        *,
        serializer: Serializer,
        names: Mapping[int, str],
        main: MainProducer,
        count: Callable[[str, dict[str, int], int], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._free = list(pool)
        self.size = len(pool)
        self.serializer = serializer
        self.names = names
        self._main = main
        self._count = count
        self._clock = clock
        self.streams: dict[int, EarlyStream] = {}
        self.committed = 0
        self.given_up = 0

    def started(self, xid: int, encoder: StreamEncoder) -> None:
        """A streamed transaction's first segment: produced from now on if a producer is free."""
        stale = self.streams.pop(xid, None)
        if stale is not None:  # the same transaction from its start again
            self._abort(stale)
        if not encoder.native:
            return  # its changes take the general path (a re-snapshot wants their key texts)
        if not self._free:
            log.info(
                "streamed transaction %d: all %d producers for large transactions are busy; it is "
                "produced at its commit",
                xid, self.size,
            )  # fmt: skip
            return
        self.streams[xid] = EarlyStream(xid, self._free.pop(), encoder, self._clock())

    def spooled(self, xid: int, records: list[bytes]) -> None:
        """Records of `xid` just spooled: produced now, or the transaction waits for its commit."""
        stream = self.streams.get(xid)
        if stream is None or not records:
            return
        started = time.perf_counter()
        reason = self._produce(stream, records)
        stream.produce_s += time.perf_counter() - started
        if reason is not None:
            self.give_up(xid, reason)

    def _produce(self, stream: EarlyStream, records: list[bytes]) -> str | None:
        limit = stream.producer.open_limit_s
        if self._clock() - stream.opened_at > limit:
            return f"it has run for over {limit:.0f} s"
        main = self._main
        if main.in_flight() and main.flush(FLUSH_TIMEOUT_S):
            return "the stream's producer did not deliver what it holds"
        native, xid = stream.producer.native, str(stream.xid).encode()
        position, end = 0, len(records)
        while position < end:
            after, taken, produced, refused = native.produce_spooled(
                records, position, targets=stream.targets, lsn=b"", xid=xid, commit_ts=b"",
                first_seq=stream.next_seq, stop_on_refusal=True,
            )  # fmt: skip
            stream.next_seq += taken
            for oid, inserts, updates, deletes, size in produced:
                counts = stream.produced.setdefault(oid, [0, 0, 0, 0])
                for slot, n in enumerate((inserts, updates, deletes, size)):
                    counts[slot] += n
            if refused:
                return f"the producer refused a change ({refused[0][2]})"
            position = after
            if position >= end:
                break
            verdict = judge(records[position])
            if type(verdict) is KeptRelation:
                stream.relations.append(records[position])
                stream.targets.clear()  # the relation's topic may change with its new version
                position += 1
            elif type(verdict) is NeedsTopic and verdict.relation_oid not in stream.targets:
                topic = self._topic(stream.encoder, verdict.relation_oid)
                if topic is None:
                    return f"relation {verdict.relation_oid} has no topic yet"
                stream.targets[verdict.relation_oid] = (topic, BATCH)
            else:
                return getattr(verdict, "reason", "a change the native producer does not take")
        _, failed = native.take_reports()
        if failed:
            return f"a change was not delivered ({failed[0][2]})"
        return None

    def _topic(self, encoder: StreamEncoder, relation_oid: int) -> str | None:
        try:
            return self.serializer.topic_for(encoder.assembler.schema(relation_oid))
        except Exception:  # not swallowed: the spool's path at the commit meets it and reports it
            return None

    def cut(self, xid: int) -> None:
        """A subtransaction of `xid` rolled back after some of its changes were spooled."""
        if xid in self.streams:
            self.give_up(xid, "a subtransaction rolled back after its changes were produced")

    def aborted(self, xid: int) -> None:
        """`xid` rolled back: its Kafka transaction is aborted, nothing of it was ever visible."""
        stream = self.streams.pop(xid, None)
        if stream is not None:
            self._abort(stream)

    def give_up(self, xid: int, reason: str) -> None:
        stream = self.streams.pop(xid, None)
        if stream is not None:
            self.drop(stream, reason)

    def take(self, xid: int) -> EarlyStream | None:
        """At `xid`'s Stream Commit: its stream, if it was produced before the commit."""
        return self.streams.pop(xid, None)

    def drop(self, stream: EarlyStream, reason: str) -> None:
        """`stream`'s Kafka transaction aborted: its transaction is published at its commit from the
        spool, for `reason` (also for a stream taken for its commit)."""
        self._abort(stream)
        self.given_up += 1
        log.info("streamed transaction %d is produced at its commit from its spool: %s", stream.xid, reason)

    def commit(self, stream: EarlyStream, commit: StreamCommit, event: EncodedMessage) -> bool:
        """Commit `stream`'s Kafka transaction with its commit `event` and the slot's position past
        it (the commit's end LSN). False when Kafka failed it (aborted: the spool publishes the
        transaction instead); a fenced producer raises."""
        producer = stream.producer
        refused = producer.native.produce(event.topic, event.key, event.value, event.headers, BATCH)
        if refused is not None:
            log.warning("streamed transaction %d's commit event was refused: %s", stream.xid, refused[1])
            self._abort(stream)
            return False
        try:
            producer.transactions.commit(commit.end_lsn)
        except TransactionFailed as exc:
            log.warning("streamed transaction %d is produced again from its spool: %s", stream.xid, exc)
            self._release(producer)
            return False
        self._release(producer)
        self.committed += 1
        for oid, (inserts, updates, deletes, size) in stream.produced.items():
            ops = {op: n for op, n in (("c", inserts), ("u", updates), ("d", deletes)) if n}
            self._count(self.names.get(oid, str(oid)), ops, size)
        return True

    def _abort(self, stream: EarlyStream) -> None:
        stream.producer.transactions.abort()
        self._release(stream.producer)

    def _release(self, producer: PooledProducer) -> None:
        """Back to the pool, its reports served and its next transaction begun (a producer that
        cannot begin one, fatally failed, leaves the pool)."""
        producer.native.take_reports()
        transactions = producer.transactions
        if not transactions.open and transactions.fatal_error is None:
            try:
                transactions.begin()
            except TransactionFailed as exc:
                log.warning("producer %s for large transactions left out: %s", producer.tid, exc)
        if transactions.open:
            self._free.append(producer)

    def close(self) -> None:
        """The session ends: what is being produced is aborted (Postgres streams it again)."""
        for xid in list(self.streams):
            self.aborted(xid)
