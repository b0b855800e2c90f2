"""Transactions Postgres streams while they run (protocol 2, `streaming 'on'`, Postgres 14+),
spooled until their commit and published then, still in commit order (docs/worker.md, "Large transactions").

Between Stream Start and Stream Stop every payload is the streamed transaction's: `SpooledStreams`
(`core.changes.spooled_streams`) has it encoded on arrival by the transaction's `StreamEncoder` into
the bounded `Spool`. At its Stream Commit the records are read back in order, given the commit's
`bw.lsn`, `bw.seq` and `bw.commit_ts`, and produced as part of that transaction: with the native
producer in bulk, tens of thousands of records per call into Rust (`spooled_commit`), else one at a
time (`replay`, the reference); a kept message (Relation, Truncate, logical message) goes back to
the session's dispatch at its place, as a live one would. Nothing of a streamed transaction is
acknowledged before its commit, nor published before it, except under exactly-once with the native
producer: then its changes are also produced while it runs, into a Kafka transaction of its own
that its commit commits (`early_streams`), and its spool is only the way back when that cannot be.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from functools import partial
from time import perf_counter
from typing import Any, Protocol

from cdc_worker.core.changes.assembler import AssembledEvent, ChangeAssembler, KeyColumnsFor, OpenTransaction
from cdc_worker.core.changes.spool import Spool, SpoolChunk, chunk_records
from cdc_worker.core.changes.spooled_commit import Target, commit_in_bulk
from cdc_worker.core.changes.spooled_streams import (
    STREAM_ABORT,
    STREAM_COMMIT,
    STREAM_START,
    CommittedStream,
    SpooledStreams,
)
from cdc_worker.core.changes.stream_encoding import (
    RefusedChange,
    ReplayedChange,
    Serializer,
    StreamEncoder,
    replay,
)
from cdc_worker.core.incremental import IncrementalSnapshot
from cdc_worker.core.kafka_transactions import AlreadyInKafka, is_signal
from cdc_worker.core.lsn import format_lsn
from cdc_worker.core.pgoutput.decoder import (
    Begin,
    LogicalMessage,
    PgOutputMessage,
    Relation,
    StreamCommit,
    Truncate,
)
from cdc_worker.shell.stream.early_streams import EarlyStream, EarlyStreams, PooledProducer, stream_sooner
from cdc_worker.shell.stream.position import StreamPosition
from cdc_worker.shell.stream.publishing import TrackedPublisher

log = logging.getLogger(__name__)

# The payload types this collaborator owns outside a stream chunk (inside one it owns them all).
STREAM_CONTROL = frozenset({STREAM_START, STREAM_COMMIT, STREAM_ABORT})


class Dispatch(Protocol):
    """What a committed streamed transaction needs of the session: its kept messages and its
    commit dispatched as live ones are."""

    def assembled(self, message: PgOutputMessage, events: Iterable[AssembledEvent]) -> bool: ...

    def publish_events(self, events: Iterable[AssembledEvent]) -> bool: ...

    def decoded(self, payload: bytes) -> None: ...

    def read_chunks_after(self, committed: bool) -> None: ...

    def commit_kafka(self) -> bool: ...


class InProgressTransactions:
    """Owns the spooled streamed transactions. `native` encodes their row changes with the native
    codec; `key_columns_for` and `prepare_types` are the catalog look-ups of a new relation version
    (`relations`), `names` the relation names by OID."""

    def __init__(
        self,
        *,
        spool: Spool,
        native: bool,
        key_columns_for: KeyColumnsFor,
        prepare_types: Callable[[Relation], None],
        names: dict[int, str],
        serializer: Serializer,
        assembler: ChangeAssembler,
        resnapshot: IncrementalSnapshot,
        position: StreamPosition,
        out: TrackedPublisher,
        dispatch: Dispatch,
        early_pool: list[PooledProducer] | None = None,
    ) -> None:
        self.native = native
        self.key_columns_for = key_columns_for
        self.prepare_types = prepare_types
        self.names = names
        self.serializer = serializer
        self.assembler = assembler
        self.resnapshot = resnapshot
        self.position = position
        self.out = out
        self.dispatch = dispatch
        # Under exactly-once: streamed transactions produced while they run (None: at their commit).
        self.early: EarlyStreams | None = None
        if early_pool and out.native is not None:
            self.early = EarlyStreams(
                early_pool, serializer=serializer, names=names, main=out.publisher, count=out.count_published
            )
        self.streams = SpooledStreams(spool, self.encoder_for, self.early)
        # Exactly-once after a restart: the streamed transactions Kafka holds already (the session's).
        self.already_in_kafka: AlreadyInKafka | None = None

    @property
    def in_chunk(self) -> bool:
        """Between a Stream Start and its Stream Stop: every payload is the stream's."""
        return self.streams.in_chunk

    @property
    def pending(self) -> bool:
        """A streamed transaction was started and has not ended (no keepalive may be acknowledged)."""
        return self.streams.pending

    @property
    def keyless_pending(self) -> bool:
        """Some pending transaction's changes were spooled without their key text: no re-snapshot
        chunk may be read while it could commit inside the chunk's window (see `encoder_for`)."""
        return self.streams.keyless_pending

    def before_streaming(self, cursor: Any) -> None:
        """On the replication connection, before START_REPLICATION: with transactions produced while
        they run, Postgres streams them sooner (`early_streams.stream_sooner`)."""
        if self.early is not None:
            stream_sooner(cursor)

    def close(self) -> None:
        """Drop every unfinished streamed transaction: Postgres resends them."""
        self.streams.close()
        if self.early is not None:
            self.early.close()

    def encoder_for(self, xid: int) -> StreamEncoder:
        return StreamEncoder(
            xid,
            key_columns_for=self.key_columns_for,
            serializer=self.serializer,
            prepare_relation=self.prepare_types,
            native=self.native,
            # A re-snapshot's chunk must drop the rows a transaction committing in its window
            # changes: that takes each change's key text (and the general path, which has it).
            keep_keys=self.resnapshot.active,
        )

    def take(self, payload: bytes) -> None:
        """A payload of a streamed transaction: encoded and spooled until its Stream Commit, then
        published with the commit's headers, in order, and committed to the tracker."""
        streams = self.streams
        if streams.take(payload):
            if payload[0] == STREAM_ABORT:
                # The aborted transaction may be the one that held re-snapshot chunks back; reading
                # one only at the next commit could wait as long as the database stays idle.
                self.dispatch.read_chunks_after(True)
            return
        ended = streams.commit(payload)
        if ended is None:  # a Stream Commit inside a chunk: let the assembler say what is wrong
            self.dispatch.decoded(payload)
            return
        commit = ended.commit
        early = None if self.early is None else self.early.take(commit.xid)
        held = self.already_in_kafka
        if held is not None and held.streamed_held(commit.commit_lsn):
            if early is not None:
                self._drop(early, "Kafka holds it already")
            self._read_again(commit, ended.chunks, ended.encoder, held)
            self.dispatch.read_chunks_after(True)
            return
        # What a Begin would have said: re-snapshot signals inside the transaction need it.
        self.position.began(Begin(commit.commit_lsn, commit.commit_ts, commit.commit_ts_us, commit.xid))
        started = perf_counter()
        # Committed before some table's snapshot point: that table's changes are in its rows.
        past_points = held if held is not None and commit.commit_lsn < held.points_until else None
        if early is not None and past_points is not None:
            self._drop(early, "some of its tables' snapshots were read after it")
            early = None
        if early is not None and self._commit_early(ended, early):
            done = f"produced as they came (in {early.produce_s:.2f} s); committed in Kafka"
        else:
            self._publish(commit, ended.chunks, ended.encoder, past_points)
            done = "handed to the producer"
        pace = ended.pace
        log.info(
            "streamed transaction %d: %d payloads spooled in %.2f s of encoding while its chunks came "
            "over %.2f s; %s %.2f s after its commit arrived",
            commit.xid, pace.payloads, pace.encode_s, pace.chunks_s, done, perf_counter() - started,
            extra={"lsn": format_lsn(commit.commit_lsn)},
        )  # fmt: skip
        self.dispatch.read_chunks_after(True)

    def _drop(self, early: EarlyStream, reason: str) -> None:
        assert self.early is not None
        self.early.drop(early, reason)

    def _commit_early(self, ended: CommittedStream, early: EarlyStream) -> bool:
        """Commit a transaction produced while it ran (`early_streams`): what the stream's producer
        holds first (every transaction committed before it), then its own Kafka transaction with
        its commit event; then its Relations to the main assembler and its commit handed on, as
        `_publish` does. False, with its Kafka transaction aborted, when it must be published from
        its spool instead."""
        commit = ended.commit
        if self.out.tracker.failure is not None or self.resnapshot.chunk_table is not None:
            self._drop(early, "the stream is stopping or a re-snapshot chunk is open")
            return False
        if not self.dispatch.commit_kafka():
            self._drop(early, "the transactions before it could not be committed first")
            return False
        assert self.early is not None
        event = self.serializer.streamed_commit(commit.xid, commit.commit_lsn, commit.commit_ts)
        if not self.early.commit(early, commit, event):
            return False
        ended.discard()
        assembler = self.assembler
        txn: OpenTransaction = assembler.begin_spooled(commit)
        for item in replay(early.relations, txn, ended.encoder, self._topic):
            self.dispatch.assembled(item, assembler.replay_spooled(item, txn))  # type: ignore[arg-type]
        txn.next_seq = early.next_seq
        self.dispatch.publish_events((assembler.end_spooled(txn, commit),))
        return True

    def _publish(
        self,
        commit: StreamCommit,
        chunks: Iterator[SpoolChunk],
        encoder: StreamEncoder,
        past_points: AlreadyInKafka | None = None,
    ) -> None:
        """Every record of a committed streamed transaction, in order: with the native producer in
        bulk (`spooled_commit.commit_in_bulk`), else one at a time (`stream_encoding.replay`, the
        reference). What the bulk leaves (a kept message, a refused change, a change of the
        re-snapshot's chunk table) is handled here, a kept message by the assembler and the
        session's dispatch at its place. `past_points`: one at a time, without the changes that
        tables read after it hold (`AlreadyInKafka.table_held`)."""
        assembler, out, names, resnapshot = self.assembler, self.out, self.names, self.resnapshot
        txn: OpenTransaction = assembler.begin_spooled(commit)
        if out.native is None or past_points is not None:
            items = replay(chunk_records(chunks), txn, encoder, self._topic)
            if past_points is not None:
                items = _past_points(items, past_points, commit.commit_lsn)
        else:
            headers = self.serializer.transaction_headers(commit.commit_lsn, commit.xid, commit.commit_ts)
            items = commit_in_bulk(
                chunks,
                txn,
                encoder,
                bulk=partial(out.produce_spooled, headers, names),
                target_of=self._target,
                topic_of=self._topic,
            )
        for item in items:
            kind = type(item)
            if kind is ReplayedChange:
                oid = item.relation_oid  # type: ignore[union-attr]
                if oid == resnapshot.chunk_table:
                    resnapshot.observe(oid, item.key_text, commit.xid)  # type: ignore[union-attr]
                out.produce(item.message, names[oid], item.op)  # type: ignore[union-attr]
            elif kind is RefusedChange:
                oid = item.relation_oid  # type: ignore[union-attr]
                out.data_error(names.get(oid, str(oid)), item.error)  # type: ignore[union-attr]
            else:
                self.dispatch.assembled(item, assembler.replay_spooled(item, txn))  # type: ignore[arg-type]
        if out.native is not None and out.tracker.failure is not None:
            return  # the bulk stopped at a failure under --on-error=exit: the stream stops
        self.dispatch.publish_events((assembler.end_spooled(txn, commit),))

    def _read_again(
        self, commit: StreamCommit, chunks: Iterator[SpoolChunk], encoder: StreamEncoder, held: AlreadyInKafka
    ) -> None:
        """A committed streamed transaction Kafka already holds (`AlreadyInKafka`): nothing of it
        published again, its Relations and re-snapshot signals handled at their place as a first
        reading did, and its commit handed on so that the slot may pass it."""
        assembler, dropped = self.assembler, 0
        txn: OpenTransaction = assembler.begin_spooled(commit)
        for item in replay(chunk_records(chunks), txn, encoder, self._topic):
            # Not a captured DDL either: it was published the first time.
            if isinstance(item, ReplayedChange | RefusedChange | Truncate) or (
                isinstance(item, LogicalMessage) and not is_signal(item)
            ):
                dropped += 1
                continue
            self.dispatch.assembled(item, assembler.replay_spooled(item, txn))
        held.dropped_in_stream(dropped)
        self.dispatch.publish_events((assembler.end_spooled(txn, commit),))

    def _target(self, relation_oid: int) -> Target | None:
        """Where the bulk sends a relation's changes; None for the re-snapshot's chunk table, whose
        changes go one at a time (each observed against the chunk)."""
        if relation_oid == self.resnapshot.chunk_table:
            return None
        return self._topic(relation_oid), self.out.native_batch(self.names[relation_oid])

    def _topic(self, relation_oid: int) -> str:
        return self.serializer.topic_for(self.assembler.schema(relation_oid))


Replayed = ReplayedChange | RefusedChange | PgOutputMessage


def _past_points(items: Iterable[Replayed], held: AlreadyInKafka, commit_lsn: int) -> Iterator[Replayed]:
    """`items` without the changes (and TRUNCATE targets) of tables whose snapshot rows, read after
    `commit_lsn`, show them already."""
    dropped = 0
    for item in items:
        if isinstance(item, ReplayedChange | RefusedChange) and held.table_held(
            item.relation_oid, commit_lsn
        ):
            dropped += 1
            continue
        if isinstance(item, Truncate):
            kept = held.truncated(item.relation_oids, commit_lsn)
            if len(kept) < len(item.relation_oids):
                dropped += 1
                if kept:
                    yield replace(item, relation_oids=tuple(kept))
                continue
        yield item
    held.dropped_in_stream(dropped)
