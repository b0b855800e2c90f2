"""Exactly-once delivery (`--delivery exactly-once`): which committed Postgres transactions make up
one Kafka transaction, and which slot position a Kafka commit lets the worker acknowledge.

The stream publishes through a transactional producer and keeps one Kafka transaction open at all
times. Committed Postgres transactions join it whole; it is committed only between two of them
(never while one's messages are being produced), once it holds `COMMIT_RECORDS` messages, has been
open `COMMIT_INTERVAL_S` (and `COMMIT_SPACING` times as long as the last commit took), or the slot
has nothing more to send right now. A `read_committed`
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

The constants were measured against the stack's single broker (docs/worker.md, "Delivery
guarantees"): a commit of a few messages costs a few milliseconds (the position's and the commit's
round trips to the coordinators, markers on every partition written), so at 1,000 transactions a
second, committed whenever the slot has nothing more to send, a change is visible about as soon as
under at-least-once. Under a full load a commit first waits for a full producer queue to be
delivered (20-30 ms), while the stream produces nothing: committing every 100 ms then ran at 0.79x
at-least-once's rate; spaced at 20 times the last commit's time it costs about a twentieth.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence

from cdc_worker.core.incremental import SIGNAL_PREFIX
from cdc_worker.core.pgoutput.decoder import Begin, LogicalMessage, PgOutputMessage, Truncate, decode_message
from cdc_worker.core.pgoutput.messages import ROW_CHANGES, MessageType

# Commit the open Kafka transaction once it has been open this long...
COMMIT_INTERVAL_S = 0.1
# ... and at least this many times as long as the last commit took: a commit waits for every
# message in flight, and the stream produces nothing meanwhile, so under a full load commits take
# no more than a twentieth of the time (at 0.1 s they took a fifth: 0.79x at-least-once's rate)...
COMMIT_SPACING = 20.0
# ... or once it holds this many messages (bounds what an abort throws away and a restart resends).
COMMIT_RECORDS = 250_000
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
        spacing: float = COMMIT_SPACING,
        max_records: int = COMMIT_RECORDS,
        quiet_s: float = QUIET_COMMIT_S,
        now: float = 0.0,
    ) -> None:
        self.interval_s = interval_s
        self.spacing = spacing
        self.max_records = max_records
        self.last_commit_s = 0.0  # how long the last Kafka commit took
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
        return now - self._opened_at >= max(self.interval_s, self.spacing * self.last_commit_s)

    def kafka_committed(self, now: float, produced: int, took_s: float = 0.0) -> int:
        """The open Kafka transaction committed (and the next one began) in `took_s`: its Postgres
        transactions are visible. Returns the position now acknowledgeable."""
        self.last_commit_s = took_s
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


class AlreadyInKafka:
    """After a restart under exactly-once, the Postgres transactions a Kafka commit already made
    visible, which Postgres sends again because the slot's confirmed position trails the position
    Kafka recorded (a worker killed between a Kafka commit and its acknowledgement; a re-snapshot,
    which holds the slot at its newest watermark so that a restart reads that watermark again).

    The stream starts from the slot, not from Kafka's position, so that what only the WAL holds
    (a re-snapshot's watermarks) is read again; `admit` then says which payloads of those
    transactions not to publish a second time: their row changes, TRUNCATEs and logical messages
    other than the re-snapshot's signals (a captured DDL is published from its message). Begin,
    Commit, Relation and Type still go through, so the stream's state (relations, the acknowledged
    position) is the one a first reading leaves. A transaction streamed while it ran is dropped at
    its Stream Commit (`streamed_held`). `through`: Kafka's recorded position, the end LSN of the newest
    Postgres transaction it holds; a transaction whose commit record starts before it is held.

    `table_points`: per table (relation oid) whose snapshot was read after the slot's point (a
    snapshot finished by a later start, `cdc_worker.snapshot_run`), the LSN it was read at. Its
    changes in a transaction whose commit record starts before that are in its rows already: not
    published (a TRUNCATE naming it and other tables is published for the others).
    Once the stream is past both (`done`), nothing is dropped or held any more."""

    def __init__(self, through: int, table_points: Mapping[int, int] | None = None) -> None:
        self.through = through
        self.table_points = dict(table_points or {})
        self.points_until = max(self.table_points.values(), default=0)
        self.skipping = False  # inside a transaction Kafka already holds
        self.commit_lsn = 0  # of the transaction being read
        self.in_chunk = False  # between a Stream Start and its Stream Stop
        self.dropped = 0  # payloads not published again
        self.transactions = 0  # transactions read again without being published

    @property
    def done(self) -> bool:
        """The stream has passed Kafka's position and every table's point: nothing more to drop."""
        return self.through == 0 and self.points_until == 0

    def streamed_held(self, commit_lsn: int) -> bool:
        """Whether the streamed transaction committing at `commit_lsn` is in Kafka already (then it
        counts among those read again)."""
        held = commit_lsn < self.through
        self.transactions += held
        return held

    def dropped_in_stream(self, messages: int) -> None:
        """A held streamed transaction's `messages` were read again without being published."""
        self.dropped += messages

    def table_held(self, relation_oid: int, commit_lsn: int) -> bool:
        """Whether a change of `relation_oid` in the transaction committing at `commit_lsn` is in the
        table's snapshot rows already."""
        return commit_lsn < self.table_points.get(relation_oid, 0)

    def truncated(self, relation_oids: Sequence[int], commit_lsn: int) -> list[int]:
        """The relations of a TRUNCATE at `commit_lsn` whose snapshot rows do not show it yet."""
        return [oid for oid in relation_oids if not self.table_held(oid, commit_lsn)]

    def admit(self, payload: bytes) -> bytes | None:
        """`payload` (a pgoutput message) to publish, None not to, or a TRUNCATE narrowed to the
        tables whose rows do not show it. Only a Begin, inside a held transaction a logical message,
        and while table points apply a row change's relation and a TRUNCATE are decoded."""
        kind = payload[0]
        if kind in (_STREAM_START, _STREAM_STOP):
            self.in_chunk = kind == _STREAM_START
            return payload
        if self.in_chunk:
            return payload  # a streamed transaction is judged at its Stream Commit
        if kind == _BEGIN:
            begin = decode_message(payload)
            if not isinstance(begin, Begin):
                return payload
            self.commit_lsn = begin.final_lsn
            self.skipping = begin.final_lsn < self.through
            if self.skipping:
                self.transactions += 1
            else:
                self.through = 0  # commits come in LSN order: every later one is new
            if begin.final_lsn >= self.points_until:
                self.points_until = 0
            return payload
        if self.skipping:
            if kind == _COMMIT:
                self.skipping = False
                return payload
            if kind in _DROPPED or (kind == _MESSAGE and not is_signal(decode_message(payload))):
                self.dropped += 1
                return None
            return payload
        if not self.points_until:
            return payload
        if kind in ROW_CHANGES:
            if self.table_held(int.from_bytes(payload[1:5], "big"), self.commit_lsn):
                self.dropped += 1
                return None
            return payload
        if kind == _TRUNCATE:
            truncate = decode_message(payload)
            assert isinstance(truncate, Truncate)
            kept = self.truncated(truncate.relation_oids, self.commit_lsn)
            if len(kept) == len(truncate.relation_oids):
                return payload
            self.dropped += 1
            if not kept:
                return None
            # Its count, options byte and relation ids, for the tables that keep it.
            return (
                payload[:1]
                + len(kept).to_bytes(4, "big")
                + payload[5:6]
                + b"".join(oid.to_bytes(4, "big") for oid in kept)
            )
        return payload


def is_signal(message: PgOutputMessage) -> bool:
    """A re-snapshot's signal (a logical message with its prefix): read again, never dropped."""
    return isinstance(message, LogicalMessage) and message.prefix == SIGNAL_PREFIX


_BEGIN, _COMMIT, _MESSAGE = MessageType.BEGIN.value, MessageType.COMMIT.value, MessageType.MESSAGE.value
_DROPPED = frozenset({*ROW_CHANGES, MessageType.TRUNCATE.value})
_TRUNCATE = MessageType.TRUNCATE.value
_STREAM_START, _STREAM_STOP = MessageType.STREAM_START.value, MessageType.STREAM_STOP.value
