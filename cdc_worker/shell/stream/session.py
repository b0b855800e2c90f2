"""Streaming: read pgoutput from the slot, hand each message to the collaborator that owns its kind,
acknowledge only what Kafka holds.

One thread does everything in order: read, decode, assemble, encode, produce, serve delivery
reports and send status updates. The session itself is the loop (`run`) and the one place that
says who owns what (`_payload_owners`, `_message_owners`, `_event_owners`), as supabase/etl's apply
loop matches each replication message once and Debezium's `PgOutputMessageDecoder` switches per
type. The owners, each with its own state, in their own modules:

- row changes and native runs: `row_changes.RowChanges`
- streamed transactions and the spool: `in_progress.InProgressTransactions`
- Relation messages (keys, types, topics), and partitions attached since: `relations.Relations`
- re-snapshot signals and chunks: `resnapshot.ResnapshotDriver`
- DDL: `ddl_events.DdlPublisher`; truncates: `truncates.TruncatePublisher`
- commits, keepalives and acknowledgement: `acknowledgement.Acknowledgement` (the `AckTracker`
  alone decides the `flush_lsn`)
- under exactly-once, the stream's Kafka transactions: `kafka_commits.StreamCommits`; after a
  restart, what Kafka already holds is read again without being published
  (`core.kafka_transactions.AlreadyInKafka`, the one check in `handle`)

A new capability adds an owner and a line in one of the tables, not a branch in the loop.
"""

from __future__ import annotations

import logging
import select
import threading
from collections.abc import Callable, Iterable, MutableMapping
from typing import Any

import psycopg2.extensions

from cdc_worker.core.ack import AckTracker, FailurePolicy
from cdc_worker.core.changes.assembler import AssembledEvent, ChangeAssembler
from cdc_worker.core.changes.fast_insert import FastInsertPath
from cdc_worker.core.changes.native_changes import NativeChangePath
from cdc_worker.core.changes.spool import Spool
from cdc_worker.core.ddl import DdlEvent
from cdc_worker.core.incremental import DEFAULT_CHUNK_ROWS, IncrementalSnapshot
from cdc_worker.core.kafka_transactions import AlreadyInKafka
from cdc_worker.core.lsn import format_lsn
from cdc_worker.core.model import ChangeEvent, TransactionCommitted, TruncateEvent, TypeInfo
from cdc_worker.core.pgoutput.decoder import Begin, LogicalMessage, PgOutputDecoder, PgOutputMessage, Relation
from cdc_worker.core.pgoutput.messages import ROW_CHANGES
from cdc_worker.shell.kafka_publisher import KafkaPublisher
from cdc_worker.shell.kafka_transactions import KafkaTransactions
from cdc_worker.shell.metrics import WorkerMetrics
from cdc_worker.shell.stream.acknowledgement import Acknowledgement
from cdc_worker.shell.stream.ddl_events import DdlPublisher, DdlSelection
from cdc_worker.shell.stream.early_streams import PooledProducer
from cdc_worker.shell.stream.heartbeat import StatusChannel, StatusHeartbeat
from cdc_worker.shell.stream.in_progress import STREAM_CONTROL, InProgressTransactions
from cdc_worker.shell.stream.kafka_commits import StreamCommits
from cdc_worker.shell.stream.position import StreamPosition
from cdc_worker.shell.stream.progress import ProgressPublisher
from cdc_worker.shell.stream.publishing import TrackedPublisher
from cdc_worker.shell.stream.relations import KeyColumns, Relations, StreamError
from cdc_worker.shell.stream.resnapshot import ResnapshotDriver
from cdc_worker.shell.stream.resnapshot_reader import ChunkSource
from cdc_worker.shell.stream.row_changes import RUN_CHANGES, RowChanges, Serializer
from cdc_worker.shell.stream.truncates import TruncatePublisher

__all__ = ["StreamError", "StreamSession"]

log = logging.getLogger(__name__)

PROTOCOL_VERSION = 1  # commit order, no in-progress streaming
# With a spool (Postgres 14+, --no-stream-in-progress not given): large transactions are streamed
# while they run, spooled, and published at their commit, still in commit order (docs/worker.md,
# "Large transactions").
STREAMING_PROTOCOL_VERSION = 2
POLL_EVERY_MESSAGES = 200
SHUTDOWN_FLUSH_TIMEOUT_S = 60.0


class StreamSession:
    """Streams from `start_lsn` until `stop` is set or an error under `--on-error=exit`.

    `catalog` is an ordinary connection for the catalog look-ups a Relation message needs (key
    columns, non-builtin types). `type_infos` is the mapping the serializer resolves types through;
    it is extended in place when a relation uses a type not seen before. `watch_partitions`:
    partitioned tables are captured as one, on a primary: look for partitions attached since.
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
        watch_partitions: bool = False,
        transactions: KafkaTransactions | None = None,
        already_in_kafka: AlreadyInKafka | None = None,
        streamed_producers: list[PooledProducer] | None = None,
    ) -> None:
        self.repl_conn = repl_conn
        self.slot = slot
        self.publications = publications
        self.start_lsn = start_lsn
        self.publisher = publisher
        self.status_interval = status_interval
        self.logical_messages = logical_messages
        self.stop = stop or threading.Event()
        self.tracker = AckTracker(policy, start_lsn=start_lsn)
        self.position = StreamPosition()
        self.protocol_version = STREAMING_PROTOCOL_VERSION if spool is not None else PROTOCOL_VERSION
        self.decoder = PgOutputDecoder(self.protocol_version)
        key_columns = KeyColumns(catalog, self.position, allow_unkeyed=allow_unkeyed)
        self.assembler = ChangeAssembler(key_columns, capture_ddl=ddl is not None)
        self.relations = Relations(
            catalog=catalog,
            assembler=self.assembler,
            type_infos=type_infos,
            publisher=publisher,
            topic_prefix=topic_prefix,
            publications=publications,
            watch_partitions=watch_partitions,
            announce=logical_messages,
        )
        # Every message of the open transaction goes out through this, tracked for acknowledgement.
        self.out = TrackedPublisher(
            publisher=publisher,
            tracker=self.tracker,
            policy=policy,
            metrics=metrics,
            while_waiting=self.tick,
            current_lsn=lambda: self.position.commit_lsn,
            # The native producer takes every message of the stream, or none (per-key order).
            native=publisher.native if native_codec else None,
        )
        self.produce_tracked = self.out.produce
        self.produce_untracked = self.out.produce_untracked
        self.count_error = self.out.count_error
        self.resnapshot = IncrementalSnapshot(slot, resnapshot_chunk_rows)
        self.rows = RowChanges(
            native=NativeChangePath(self.decoder, self.assembler, serializer) if native_codec else None,
            fast_insert=FastInsertPath(self.decoder, self.assembler, serializer),
            serializer=serializer,
            out=self.out,
            tracker=self.tracker,
            policy=policy,
            resnapshot=self.resnapshot,
            names=self.relations.names,
            decoded=self.decoded,
        )
        self.publish_change = self.rows.publish_change
        self.resnapshots = ResnapshotDriver(
            state=self.resnapshot,
            chunks=ChunkSource(catalog, slot, publications),
            stream=self,
            publisher=publisher,
            serializer=serializer,
            topic_prefix=topic_prefix,
            remember_table=self.relations.names.__setitem__,
            position=self.position,
        )
        # `spool`: ask for in-progress streaming and keep streamed transactions there, encoded as
        # they arrive, until their commit.
        self.in_progress: InProgressTransactions | None = None
        if spool is not None:
            self.in_progress = InProgressTransactions(
                spool=spool,
                native=native_codec,
                key_columns_for=key_columns,
                prepare_types=self.relations.prepare_types,
                names=self.relations.names,
                serializer=serializer,
                assembler=self.assembler,
                resnapshot=self.resnapshot,
                position=self.position,
                out=self.out,
                dispatch=self,
                early_pool=streamed_producers,
            )
        # Exactly-once: the stream's Kafka transactions and which Postgres transactions they hold.
        self.commits = (
            None
            if transactions is None
            else StreamCommits(
                transactions,
                start_lsn,
                tracker=self.tracker,
                produced=lambda: self.out.produced,
                producing=lambda: self.tracker.open_transaction or self.assembler.in_transaction,
            )
        )
        # After a restart: the transactions Postgres sends again that a Kafka commit made visible.
        self.already_in_kafka = already_in_kafka
        if self.in_progress is not None:
            self.in_progress.already_in_kafka = already_in_kafka
        self._status = StatusChannel()
        self.ack = Acknowledgement(
            tracker=self.tracker,
            status=self._status,
            status_interval=status_interval,
            out=self.out,
            resnapshot=self.resnapshot,
            position=self.position,
            in_transaction=lambda: self.in_transaction,
            metrics=metrics,
            start_lsn=start_lsn,
            grouping=None if self.commits is None else self.commits.grouping,
        )
        truncates = TruncatePublisher(serializer=serializer, out=self.out, resnapshot=self.resnapshot)
        # The progress events of the control topic (`progress`), when the worker publishes them.
        self.progress: ProgressPublisher | None = None

        # -- who owns what: the one place a new capability is wired in ----------------------------
        # A payload by its type byte, before anything is decoded; every other kind goes to the
        # general path (`decoded`: decoder, assembler, then the owners below).
        self._payload_owners: dict[int, Callable[[bytes], None]] = dict.fromkeys(ROW_CHANGES, self.rows.take)
        if self.in_progress is not None:
            self._payload_owners.update(dict.fromkeys(STREAM_CONTROL, self.in_progress.take))
        # A decoded message by its kind, once the assembler has taken it.
        self._message_owners: dict[type[PgOutputMessage], Callable[[Any], None]] = {
            Begin: self.position.began,
            Relation: self.relations.described,
            LogicalMessage: self.resnapshots.signal,
        }
        # An assembled event by its kind, in the order the assembler returned them.
        self._event_owners: dict[type[AssembledEvent], Callable[[Any], None]] = {
            ChangeEvent: self.rows.publish_change,
            TransactionCommitted: self._committed,
            TruncateEvent: truncates.publish,
        }
        if ddl is not None:  # --capture-ddl: only then does the assembler make a DdlEvent
            ddl_events = DdlPublisher(ddl, serializer, self.out.produce, self.out.data_error)
            self._event_owners[DdlEvent] = ddl_events.publish

    # -- dispatch ------------------------------------------------------------------------------

    def handle(self, payload: bytes) -> None:
        """One pgoutput message: a row change joining the pending run (the hot path, one list
        append), else after the run is flushed, its owner; inside a streamed transaction's chunk
        every payload is the stream's."""
        held = self.already_in_kafka
        if held is not None:
            admitted = held.admit(payload)
            if admitted is None:
                return
            payload = admitted
            if held.done:
                self._past_kafka(held)
        rows = self.rows
        run = rows.run
        if run:
            if payload[1:5] == rows.run_relation and payload[0] in ROW_CHANGES:
                run.append(payload)
                if len(run) >= RUN_CHANGES:
                    rows.flush_run()
                return
            if not rows.flush_run():
                return  # stopped at a failure inside the run, as the per-change path stops
        in_progress = self.in_progress
        if in_progress is not None and in_progress.in_chunk:
            in_progress.take(payload)
            return
        owner = self._payload_owners.get(payload[0]) if payload else None
        if owner is None:
            self.decoded(payload)
        else:
            owner(payload)

    def _past_kafka(self, held: AlreadyInKafka) -> None:
        self.already_in_kafka = None  # `in_progress` keeps it: done, it holds nothing any more
        log.info(
            "past the position Kafka committed (and every table's snapshot point): %d transactions read "
            "again without publishing them (%d messages not published again)",
            held.transactions,
            held.dropped,
        )

    def decoded(self, payload: bytes) -> None:
        """The general path: decoded, assembled, and handed to the owners of what comes out."""
        message = self.decoder.decode(payload)
        self.read_chunks_after(self.assembled(message, self.assembler.feed(message)))

    def assembled(self, message: PgOutputMessage, events: Iterable[AssembledEvent]) -> bool:
        """The events the assembler made of `message` to their owners, then `message` to its own;
        True when a transaction committed."""
        committed = self.publish_events(events)
        owner = self._message_owners.get(type(message))
        if owner is not None:
            owner(message)
        return committed

    def publish_events(self, events: Iterable[AssembledEvent]) -> bool:
        """Each event to its owner, in order; True when a transaction committed."""
        committed = False
        owners = self._event_owners
        for event in events:
            kind = type(event)
            owners[kind](event)
            if kind is TransactionCommitted:
                committed = True
        return committed

    def _committed(self, event: TransactionCommitted) -> None:
        self.ack.committed(event)
        self.resnapshots.committed(event)
        if self.commits is not None:
            self.commits.postgres_committed(event.end_lsn)

    def commit_kafka(self) -> bool:
        return self.commits is None or self.commits.commit_pending()

    def read_chunks_after(self, committed: bool) -> None:
        """After a commit, the next re-snapshot chunk when one is wanted; not while a streamed
        transaction whose changes were spooled without their keys is open: it could commit inside
        the chunk's window (see `InProgressTransactions.encoder_for`)."""
        keyless = self.in_progress is not None and self.in_progress.keyless_pending
        if committed and self.resnapshot.wants_chunk and not keyless:
            self.resnapshots.read_chunks(self.position.commit_lsn)

    @property
    def in_transaction(self) -> bool:
        """A transaction is open, buffered or spooled: no keepalive position may be acknowledged."""
        return self.assembler.in_transaction or (self.in_progress is not None and self.in_progress.pending)

    def tick(self, *, force: bool = False) -> None:
        """A Kafka commit if one is due (exactly-once), a status update if one is due
        (`Acknowledgement.tick`), then the progress event if one is ready (`progress`: it needs the
        position acknowledged, and the streaming thread)."""
        if self.commits is not None:
            self.commits.commit()
        self.ack.tick(force=force)
        if self.progress is not None:
            self.progress.note_acked(self.ack.acked)
            self.progress.publish_ready()

    # -- the loop ------------------------------------------------------------------------------

    def start(self) -> None:
        self._status.cursor = self.repl_conn.cursor()
        if self.in_progress is not None:
            self.in_progress.before_streaming(self._status.cursor)
        names = ",".join('"' + name.replace('"', '""') + '"' for name in self.publications)
        self._status.cursor.start_replication(
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
        if self.in_progress is not None:
            options["streaming"] = "on"
        if self.logical_messages:  # the re-snapshot signals; Postgres 12 and 13 refuse the option
            options["messages"] = "true"
        return options

    def run(self) -> bool:
        """Stream until stopped; True on a clean stop, False after an error under EXIT."""
        if self._status.cursor is None:
            self.start()
        publisher, tracker, handle, rows = self.publisher, self.tracker, self.handle, self.rows
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
                        self.relations.check_partitions()
                    continue
                # Nothing to read for now: a pending run goes out rather than wait for its end.
                if rows.run and not rows.flush_run():
                    break
                publisher.poll(0)
                if self.commits is not None:  # nothing more to read: waiting would only add latency
                    self.commits.commit(idle=True)
                self.tick()
                self.relations.check_partitions()
                if tracker.failure is not None:
                    break
                # Wake as soon as Postgres sends more. With deliveries outstanding, look at Kafka's
                # reports (they drive acknowledgement and latency) again after a moment: waiting on
                # Kafka alone instead left Postgres' next messages unread meanwhile.
                select.select([self.repl_conn], [], [], self.ack.idle_wait())
        finally:
            heartbeat.stop()
        return self.shutdown()

    def shutdown(self) -> bool:
        """Stop reading, wait for deliveries, send the final acknowledgement."""
        if self.in_progress is not None:
            self.in_progress.close()  # unfinished streamed transactions: Postgres resends them
        missing = self.publisher.flush(SHUTDOWN_FLUSH_TIMEOUT_S, tick=self.tick)
        if missing:
            log.error(
                "%d messages still undelivered after %.0fs; they will be sent again on restart",
                missing,
                SHUTDOWN_FLUSH_TIMEOUT_S,
            )
        if self.commits is not None:
            self.commits.close()
        self.tick(force=True)
        self.out.report_failure_counts()
        failure = self.tracker.failure
        log.info(
            "stream stopped: %d messages published, %d skipped, acknowledged up to %s",
            self.out.published,
            self.out.skipped,
            format_lsn(self.ack.acked),
            extra={"lsn": format_lsn(self.ack.acked)},
        )
        if failure is not None:
            log.error("stopped after an error (--on-error=exit): %s", failure.reason)
            return False
        return True
