"""Streaming: read pgoutput from the slot, publish every change, acknowledge only what Kafka holds.

One thread does everything in order: read, decode (`pgoutput`, or `fast_insert` for Inserts),
assemble (`changes`), encode (`encoding`), produce, serve delivery reports and send status
updates. Delivery reports feed the `AckTracker`, which alone decides the `flush_lsn`.

Status updates go out at least every `status_interval` seconds, from every wait (including waits
for room in the producer's queue), and sooner when the acknowledgeable position moved; see
`heartbeat` for why they must never stop, even while this thread is busy elsewhere.
"""

from __future__ import annotations

import logging
import select
import threading
import time
from collections.abc import Iterable, Iterator, MutableMapping
from typing import Any

import psycopg2
import psycopg2.extensions

from cdc_worker.core.ack import AckTracker, FailurePolicy
from cdc_worker.core.changes.assembler import (
    AssembledEvent,
    ChangeAssembler,
    OpenTransaction,
    replica_identity_key_columns,
)
from cdc_worker.core.changes.fast_insert import FastInsertPath
from cdc_worker.core.changes.native_changes import NativeChangePath
from cdc_worker.core.changes.spool import Spool
from cdc_worker.core.changes.spooled_streams import STREAM_ABORT, STREAM_COMMIT, STREAM_START, SpooledStreams
from cdc_worker.core.changes.stream_encoding import RefusedChange, ReplayedChange, StreamEncoder, replay
from cdc_worker.core.ddl import DdlEvent
from cdc_worker.core.encoding.avro_serializer import AvroEventSerializer
from cdc_worker.core.encoding.json_serializer import JsonEventSerializer
from cdc_worker.core.errors import ConfigurationError
from cdc_worker.core.incremental import DEFAULT_CHUNK_ROWS, IncrementalSnapshot
from cdc_worker.core.lsn import format_lsn
from cdc_worker.core.model import (
    ChangeEvent,
    TableSchema,
    TransactionCommitted,
    TruncateEvent,
    TypeInfo,
)
from cdc_worker.core.pgoutput.decoder import (
    Begin,
    LogicalMessage,
    PgOutputDecoder,
    PgOutputMessage,
    Relation,
    StreamCommit,
)
from cdc_worker.core.pgoutput.messages import ROW_CHANGES
from cdc_worker.shell.kafka_publisher import KafkaPublisher, TopicSpec
from cdc_worker.shell.metrics import WorkerMetrics
from cdc_worker.shell.postgres.catalog import load_tables, load_type_infos
from cdc_worker.shell.stream.ddl_events import DdlPublisher, DdlSelection
from cdc_worker.shell.stream.heartbeat import StatusChannel, StatusHeartbeat
from cdc_worker.shell.stream.publishing import TrackedPublisher
from cdc_worker.shell.stream.resnapshot import ResnapshotDriver
from cdc_worker.shell.stream.resnapshot_reader import ChunkSource
from kafka_contract.topics import topic_name

log = logging.getLogger(__name__)

PROTOCOL_VERSION = 1  # commit order, no in-progress streaming
# With a spool (Postgres 14+, --no-stream-in-progress not given): large transactions are streamed
# while they run, spooled, and published at their commit, still in commit order (DESIGN.md).
STREAMING_PROTOCOL_VERSION = 2
_STREAM_CONTROL = frozenset({STREAM_START, STREAM_COMMIT, STREAM_ABORT})
# Acknowledge a moved position at most this often; the interval is the upper bound.
# (Status updates are a few bytes; at this pace the slot's confirmed position trails Kafka by less
# than a tenth of a second, not a fifth.)
MIN_ACK_INTERVAL_S = 0.05
SELECT_TIMEOUT_S = 0.5
IN_FLIGHT_WAIT_S = 0.005
POLL_EVERY_MESSAGES = 200
SHUTDOWN_FLUSH_TIMEOUT_S = 60.0
# The most row changes one native run holds before it is encoded and produced: bounds its memory
# and how long its first change waits in the worker.
RUN_CHANGES = 1000

Serializer = AvroEventSerializer | JsonEventSerializer


class StreamError(ConfigurationError, RuntimeError):
    """The stream cannot go on (bad schema, unkeyed table added without -u ...)."""


class StreamSession:
    """Streams from `start_lsn` until `stop` is set or an error under `--on-error=exit`.

    `catalog` is an ordinary connection for the catalog look-ups a Relation message needs (key
    columns, non-builtin types). `type_infos` is the mapping the serializer resolves types through;
    it is extended in place when a relation uses a type not seen before.
    """

    def __init__(
        self,
        *,
        repl_conn: psycopg2.extensions.connection,
        catalog: psycopg2.extensions.connection,
        slot: str,
        publications: list[str],
        start_lsn: int,
        publisher: KafkaPublisher,
        serializer: Serializer,
        type_infos: MutableMapping[int, TypeInfo],
        policy: FailurePolicy,
        allow_unkeyed: bool,
        status_interval: float,
        topic_prefix: str | None = None,
        metrics: WorkerMetrics | None = None,
        stop: threading.Event | None = None,
        resnapshot_chunk_rows: int = DEFAULT_CHUNK_ROWS,
        native_codec: bool = False,
        logical_messages: bool = True,
        ddl: DdlSelection | None = None,
        spool: Spool | None = None,
    ) -> None:
        self.repl_conn = repl_conn
        self.catalog = catalog
        self.slot = slot
        self.publications = publications
        self.start_lsn = start_lsn
        self.publisher = publisher
        self.serializer = serializer
        self.type_infos = type_infos
        self.policy = policy
        self.allow_unkeyed = allow_unkeyed
        self.topic_prefix = topic_prefix
        self.status_interval = status_interval
        self.metrics = metrics
        self.stop = stop or threading.Event()
        self.tracker = AckTracker(policy, start_lsn=start_lsn)
        self._table_names: dict[int, str] = {}
        # `spool`: ask for in-progress streaming and keep streamed transactions there, encoded as
        # they arrive, until their commit.
        self._native_codec = native_codec
        self._spooled = SpooledStreams(spool, self._stream_encoder) if spool is not None else None
        self.protocol_version = STREAMING_PROTOCOL_VERSION if spool is not None else PROTOCOL_VERSION
        self.decoder = PgOutputDecoder(self.protocol_version)
        self.resnapshot = IncrementalSnapshot(slot, resnapshot_chunk_rows)
        self.logical_messages = logical_messages
        self._chunks = ChunkSource(catalog, slot, publications)
        self._resnapshots = ResnapshotDriver(
            state=self.resnapshot,
            chunks=self._chunks,
            stream=self,
            publisher=publisher,
            serializer=serializer,
            topic_prefix=topic_prefix,
            remember_table=self._table_names.__setitem__,
        )
        self._begin: Begin | None = None
        # Every message of the open transaction goes out through this, tracked for acknowledgement.
        self._current_lsn = 0  # commit LSN of the transaction being published, for error messages
        self.out = TrackedPublisher(
            publisher=publisher,
            tracker=self.tracker,
            policy=policy,
            metrics=metrics,
            while_waiting=self.tick,
            current_lsn=lambda: self._current_lsn,
            # The native producer takes every message of the stream, or none (per-key order).
            native=publisher.native if native_codec else None,
        )
        self.produce_tracked = self.out.produce
        self.produce_untracked = self.out.produce_untracked
        self.count_error = self.out.count_error
        self._data_error = self.out.data_error
        self.assembler = ChangeAssembler(self._key_columns_for, capture_ddl=ddl is not None)
        # --capture-ddl: the event trigger's messages, published to the control topic.
        self._ddl: DdlPublisher | None = None
        if ddl is not None:
            self._ddl = DdlPublisher(ddl, serializer, self.produce_tracked, self._data_error)
        self._fast_insert = FastInsertPath(self.decoder, self.assembler, serializer)
        # The native codec's path for Inserts, Updates and Deletes, when the worker uses it.
        self._native_changes = (
            NativeChangePath(self.decoder, self.assembler, serializer) if native_codec else None
        )
        # The pending run of row changes for the native codec (`handle`), and its relation's OID as
        # the 4 bytes that follow a row change's type byte.
        self._run: list[bytes] = []
        self._run_relation = b""
        self.cursor: Any = None
        self._acked = start_lsn
        self._status = StatusChannel()
        self._oldest_unacked_commit: float | None = None

    # -- catalog look-ups for new relation versions ---------------------------------------------

    def _key_columns_for(self, table: TableSchema) -> tuple[str, ...]:
        """The key the catalog gives (primary key, or replica identity index); pgoutput's flags when
        the catalog has moved on (a key column renamed or dropped since this WAL was written)."""
        found = load_tables(self.catalog, oids=[table.oid])
        names = {c.name for c in table.columns}
        if found and all(k in names for k in found[0].schema.key_columns):
            key = found[0].schema.key_columns
        else:
            key = replica_identity_key_columns(table)
        if not key and not self.allow_unkeyed:
            raise StreamError(
                f"table {table.qualified_name} has no primary key or replica identity index (at LSN "
                f"{format_lsn(self._current_lsn)}): add one, remove the table from the publication, or "
                "restart with -u/--allow-unkeyed"
            )
        return key

    def _prepare_relation(self, message: Relation) -> None:
        self._table_names[message.schema.oid] = message.schema.qualified_name
        self._prepare_types(message)

    def _prepare_types(self, message: Relation) -> None:
        missing = {c.type_oid for c in message.schema.columns} - self.type_infos.keys()
        if missing:
            self.type_infos.update(load_type_infos(self.catalog, missing))

    # -- publishing ----------------------------------------------------------------------------

    def publish_change(self, event: ChangeEvent) -> None:
        table = self._table_names[event.table.oid]
        if self.resnapshot.chunk_table == event.table.oid:
            # Before encoding: a change skipped under --on-error=log still makes the chunk's row stale.
            self.resnapshot.observe(event.table.oid, event.key, event.xid)  # type: ignore[arg-type]
        try:
            message = self.serializer(event)
        except Exception as exc:  # data errors and registry failures, under the policy
            self._data_error(table, exc)
            return
        if message is not None:
            self.produce_tracked(message, table, event.op.value)

    def _publish_truncate(self, event: TruncateEvent) -> None:
        for truncated in event.tables:
            self.resnapshot.truncated(truncated.oid, event.xid)
        try:
            messages = self.serializer.truncate(event)
        except Exception as exc:
            self._data_error(",".join(t.qualified_name for t in event.tables), exc)
            return
        for message, table in zip(messages, event.tables, strict=True):
            self.produce_tracked(message, table.qualified_name, "t")

    def _ensure_topic(self, relation_oid: int) -> None:
        schema = self.assembler.schema(relation_oid)
        # naming, not the serializer: compiling a plan would register schemas, a data-path step
        # that must fail under --on-error with the event, not here.
        self.publisher.ensure_topics([TopicSpec(topic_name(schema, self.topic_prefix), schema.is_keyed)])

    def handle(self, payload: bytes) -> None:
        run = self._run
        if run:
            # The hot path: a row change of the run's relation joins it, one list append.
            if payload[1:5] == self._run_relation and payload[0] in ROW_CHANGES:
                run.append(payload)
                if len(run) >= RUN_CHANGES:
                    self.flush_run()
                return
            if not self.flush_run():
                return  # stopped at a failure inside the run, as the per-change path stops
            run = self._run  # flush_run started a new list: a run of another relation joins that one
        spooled = self._spooled
        if spooled is not None and (spooled.in_chunk or (payload and payload[0] in _STREAM_CONTROL)):
            self._handle_streamed(spooled, payload)
            return
        # Most messages of a busy stream are row changes: the native codec takes consecutive ones of
        # a relation as a run, encoded with one call when the run ends (`flush_run`); until then
        # nothing of them is decoded, numbered or produced. Every other message ends the run first,
        # so a run never spans a Commit, a Relation message or a re-snapshot signal.
        # (While a re-snapshot chunk is out every change must be seen as an event: see `incremental`.)
        native = self._native_changes
        if native is not None and self.resnapshot.chunk_table is None and native.starts_run(payload):
            run.append(payload)
            self._run_relation = payload[1:5]
            return
        self._handle_one(payload)

    def flush_run(self) -> bool:
        """Encode and produce the pending run of native row changes, in order. False when a failure
        under --on-error=exit stopped it (the stream then stops, as after that change alone)."""
        run, self._run = self._run, []
        native = self._native_changes
        if not run or native is None:
            return True
        out = self.out
        if out.native is not None:
            produced = native.produce_run(
                run,
                out.native,
                lambda table: out.native_batch(self._table_names[table.oid]),
                stop_on_problem=self.policy is FailurePolicy.EXIT,
            )
            if produced is None:
                return self._handle_each(run)
            done, changed, topic = produced
            return out.settle_run(done, self._table_names[changed.oid], topic) and self._handle_each(
                run[done.rest :]
            )
        encoded = native.encode_run(run)
        if encoded is None:
            return self._handle_each(run)
        items, changed, messages = encoded
        return out.produce_run(items, self._table_names[changed.oid], messages)

    def _handle_each(self, payloads: list[bytes]) -> bool:
        """Payloads of a run the codec refused, one at a time, so that the general path raises the
        precise error at its place; False when a failure under --on-error=exit stopped them."""
        for payload in payloads:
            self._handle_one(payload)
            if self.tracker.failure is not None:
                return False
        return True

    def _handle_one(self, payload: bytes) -> None:
        """One message, outside a run: the per-change native path, the fused Insert, or decoded."""
        if self._native_changes is not None and self.resnapshot.chunk_table is None:
            native = self._native_changes(payload)
            if native is not None:
                items, changed = native
                name = self._table_names[changed.oid]
                for encoded, op in items:
                    if isinstance(encoded, Exception):
                        self._data_error(name, encoded)
                    else:
                        self.produce_tracked(encoded, name, op)
                return
        fused = None if self.resnapshot.chunk_table is not None else self._fast_insert(payload)
        if fused is not None:
            encoded, table = fused
            self.produce_tracked(encoded, self._table_names[table.oid], "c")
            return
        message = self.decoder.decode(payload)
        kind = type(message)
        if kind is Begin:
            # Remembered for error messages and the lag metric; the Begin itself yields no event.
            self._begin = message  # type: ignore[assignment]
            self._current_lsn = message.final_lsn  # type: ignore[union-attr]
            if self._oldest_unacked_commit is None:
                self._oldest_unacked_commit = message.commit_ts.timestamp()  # type: ignore[union-attr]
        elif kind is Relation:
            self._prepare_relation(message)  # type: ignore[arg-type]
        elif kind is LogicalMessage:
            self._resnapshots.signal(message, self._begin, self._current_lsn)  # type: ignore[arg-type]
        committed = self._publish_events(self.assembler.feed(message))
        if kind is Relation:
            self._ensure_topic(message.schema.oid)  # type: ignore[union-attr]
        self._read_chunks_after(committed)

    def _stream_encoder(self, xid: int) -> StreamEncoder:
        return StreamEncoder(
            xid,
            key_columns_for=self._key_columns_for,
            serializer=self.serializer,
            prepare_relation=self._prepare_types,
            native=self._native_codec,
            # A re-snapshot's chunk must drop the rows a transaction committing in its window
            # changes: that takes each change's key text (and the general path, which has it).
            keep_keys=self.resnapshot.active,
        )

    def _read_chunks_after(self, committed: bool) -> None:
        # Not while a streamed transaction whose changes were spooled without their keys is open:
        # it could commit inside the chunk's window (see `_stream_encoder`).
        keyless = self._spooled is not None and self._spooled.keyless_pending
        if committed and self.resnapshot.wants_chunk and not keyless:
            self._resnapshots.read_chunks(self._current_lsn)

    def _handle_streamed(self, spooled: SpooledStreams, payload: bytes) -> None:
        """A payload of a streamed transaction: encoded and spooled until its Stream Commit, then
        published with the commit's headers, in order, and committed to the tracker."""
        if spooled.take(payload):
            if payload[0] == STREAM_ABORT:
                # The aborted transaction may be the one that held re-snapshot chunks back; reading
                # one only at the next commit could wait as long as the database stays idle.
                self._read_chunks_after(True)
            return
        ended = spooled.commit(payload)
        if ended is None:  # a Stream Commit inside a chunk: let the assembler say what is wrong
            self._publish_events(self.assembler.feed(self.decoder.decode(payload)))
            return
        commit, records, encoder = ended
        # What a Begin would have said: re-snapshot signals inside the transaction need it.
        self._begin = Begin(commit.commit_lsn, commit.commit_ts, commit.commit_ts_us, commit.xid)
        self._current_lsn = commit.commit_lsn
        if self._oldest_unacked_commit is None:
            self._oldest_unacked_commit = commit.commit_ts.timestamp()
        self._publish_spooled(commit, records, encoder)
        self._read_chunks_after(True)

    def _publish_spooled(
        self, commit: StreamCommit, records: Iterator[bytes], encoder: StreamEncoder
    ) -> None:
        """Every record of a committed streamed transaction, in order (`stream_encoding.replay`); a
        kept message goes through the assembler at its place, as `handle` takes one."""
        txn = self.assembler.begin_spooled(commit)
        topic_of = self._spooled_topic
        for item in replay(records, txn, encoder, topic_of):
            kind = type(item)
            if kind is ReplayedChange:
                oid = item.relation_oid  # type: ignore[union-attr]
                if oid == self.resnapshot.chunk_table:
                    self.resnapshot.observe(oid, item.key_text, commit.xid)  # type: ignore[union-attr]
                self.produce_tracked(item.message, self._table_names[oid], item.op)  # type: ignore[union-attr]
            elif kind is RefusedChange:
                oid = item.relation_oid  # type: ignore[union-attr]
                self._data_error(self._table_names.get(oid, str(oid)), item.error)  # type: ignore[union-attr]
            else:
                self._replay_kept(item, txn)  # type: ignore[arg-type]
        self._publish_events((self.assembler.end_spooled(txn, commit),))

    def _spooled_topic(self, relation_oid: int) -> str:
        return self.serializer.topic_for(self.assembler.schema(relation_oid))

    def _replay_kept(self, message: PgOutputMessage, txn: OpenTransaction) -> None:
        kind = type(message)
        if kind is Relation:
            self._prepare_relation(message)  # type: ignore[arg-type]
        elif kind is LogicalMessage:
            self._resnapshots.signal(message, self._begin, self._current_lsn)  # type: ignore[arg-type]
        self._publish_events(self.assembler.replay_spooled(message, txn))
        if kind is Relation:
            self._ensure_topic(message.schema.oid)  # type: ignore[union-attr]

    def _publish_events(self, events: Iterable[AssembledEvent]) -> bool:
        """Publish what the assembler returned; True when it committed a transaction."""
        committed = False
        for event in events:
            kind_of_event = type(event)
            if kind_of_event is ChangeEvent:
                self.publish_change(event)  # type: ignore[arg-type]
            elif kind_of_event is TransactionCommitted:
                self.tracker.committed(event)  # type: ignore[arg-type]
                self._chunks.decoded(event.xid)
                committed = True
            elif kind_of_event is DdlEvent:
                if self._ddl is not None:
                    self._ddl.publish(event)  # type: ignore[arg-type]
            else:
                self._publish_truncate(event)  # type: ignore[arg-type]
        return committed

    @property
    def in_transaction(self) -> bool:
        """A transaction is open, buffered or spooled: no keepalive position may be acknowledged."""
        return self.assembler.in_transaction or (self._spooled is not None and self._spooled.pending)

    # -- acknowledgement -----------------------------------------------------------------------

    def ack_position(self) -> int:
        """What may be acknowledged now: the tracker's safe LSN, or with nothing in flight and no
        transaction open, the server's WAL end from its last keepalive."""
        position = self.tracker.safe_flush_lsn()
        if not self.in_transaction and self.cursor is not None:
            idle = self.tracker.idle_position(self.cursor.wal_end)
            if idle is not None:
                position = idle
        hold = self.resnapshot.hold_lsn
        # While a re-snapshot runs, its newest watermark (which says where it is) must be read
        # again after a restart: acknowledge up to its commit, never past it.
        return position if hold is None else min(position, max(hold, self._acked))

    def tick(self, *, force: bool = False) -> None:
        """Send a status update if the position moved (at most every MIN_ACK_INTERVAL_S) or the
        status interval has passed since the last one."""
        if self.cursor is None:
            return
        now = time.monotonic()
        since = now - self._status.last_sent
        position = self.ack_position()
        if force or since >= self.status_interval or (position > self._acked and since >= MIN_ACK_INTERVAL_S):
            self._status.send(position)
            if position > self._acked:
                log.debug("acknowledged %s", format_lsn(position))
            self._acked = max(self._acked, position)
            if self.metrics is not None:
                self.metrics.acked_lsn.set(self._acked)
        self.out.release_settled_batches()
        if self.metrics is not None:
            self.out.flush_counters()
            self.metrics.in_flight.set(self.tracker.pending_messages)
            if self.tracker.pending_messages == 0 and not self.in_transaction:
                self._oldest_unacked_commit = None
            self.metrics.set_oldest_unacknowledged(self._oldest_unacked_commit)

    # -- the loop ------------------------------------------------------------------------------

    def start(self) -> None:
        self.cursor = self._status.cursor = self.repl_conn.cursor()
        names = ",".join('"' + name.replace('"', '""') + '"' for name in self.publications)
        self.cursor.start_replication(
            slot_name=self.slot,
            decode=False,
            start_lsn=self.start_lsn,
            options=self._options(names),
            status_interval=self.status_interval,
        )
        log.info(
            "streaming slot %s from %s (publications %s)",
            self.slot,
            format_lsn(self.start_lsn),
            ", ".join(self.publications),
            extra={"lsn": format_lsn(self.start_lsn)},
        )

    def _options(self, publication_names: str) -> dict[str, str]:
        options = {"proto_version": str(self.protocol_version), "publication_names": publication_names}
        if self._spooled is not None:
            options["streaming"] = "on"
        if self.logical_messages:  # the re-snapshot signals; Postgres 12 and 13 refuse the option
            options["messages"] = "true"
        return options

    def run(self) -> bool:
        """Stream until stopped; True on a clean stop, False after an error under EXIT."""
        if self.cursor is None:
            self.start()
        publisher, tracker, handle = self.publisher, self.tracker, self.handle
        read_payloads = self._status.read_payloads
        unpolled = 0
        heartbeat = StatusHeartbeat(self._status, self.status_interval)
        try:
            while not self.stop.is_set():
                payloads = read_payloads(POLL_EVERY_MESSAGES)
                if payloads:
                    for payload in payloads:
                        handle(payload)
                        # Under exit nothing after a failure is handled (the rest is read again
                        # after the restart, from the last acknowledged position).
                        if tracker.failure is not None:
                            break
                    if tracker.failure is not None:
                        break
                    unpolled += len(payloads)
                    if unpolled >= POLL_EVERY_MESSAGES:
                        unpolled = 0
                        publisher.poll(0)
                        self.tick()
                    continue
                # Nothing to read for now: a pending run goes out rather than wait for its end.
                if self._run and not self.flush_run():
                    break
                publisher.poll(0)
                self.tick()
                if tracker.failure is not None:
                    break
                # Wake as soon as Postgres sends more. With deliveries outstanding, look at Kafka's
                # reports (they drive acknowledgement and latency) again after a moment: waiting on
                # Kafka alone instead left Postgres' next messages unread meanwhile.
                select.select([self.repl_conn], [], [], self._idle_wait())
        finally:
            heartbeat.stop()
        return self.shutdown()

    def _idle_wait(self) -> float:
        """How long the loop may wait for Postgres when it has nothing to read: a moment while
        deliveries are outstanding; with a moved position not acknowledged yet (the last delivery
        came within MIN_ACK_INTERVAL_S of the previous update), until that update is due, not a
        whole SELECT_TIMEOUT_S later."""
        if self.tracker.pending_messages:
            return IN_FLIGHT_WAIT_S
        if self.ack_position() > self._acked:
            return max(0.0, MIN_ACK_INTERVAL_S - (time.monotonic() - self._status.last_sent))
        return SELECT_TIMEOUT_S

    def shutdown(self) -> bool:
        """Stop reading, wait for deliveries, send the final acknowledgement."""
        if self._spooled is not None:
            self._spooled.close()  # unfinished streamed transactions: Postgres resends them
        missing = self.publisher.flush(SHUTDOWN_FLUSH_TIMEOUT_S, tick=self.tick)
        if missing:
            log.error(
                "%d messages still undelivered after %.0fs; they will be sent again on restart",
                missing,
                SHUTDOWN_FLUSH_TIMEOUT_S,
            )
        self.tick(force=True)
        self.out.report_failure_counts()
        failure = self.tracker.failure
        log.info(
            "stream stopped: %d messages published, %d skipped, acknowledged up to %s",
            self.out.published,
            self.out.skipped,
            format_lsn(self._acked),
            extra={"lsn": format_lsn(self._acked)},
        )
        if failure is not None:
            log.error("stopped after an error (--on-error=exit): %s", failure.reason)
            return False
        return True
