"""The worker's lifecycle: startup checks -> publications -> slot -> snapshot (new slot, no -x) ->
stream, and a clean stop (flush, final acknowledgement) when `stop` is set.

Crash safety rests on three facts: the slot only moves when the stream acknowledges what Kafka
holds; a slot is resumed only when its snapshot is recorded as done (see `slot.py`); and a snapshot
that fails or is interrupted drops its slot, so the next start takes a fresh one. A `kill -9` at
any moment therefore leads to messages published again (at-least-once), never to messages missing.
Under `--delivery exactly-once` the slot of an interrupted snapshot is kept and the next start
finishes that snapshot (`snapshot_run`), and nothing is published twice.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from functools import partial

import psycopg2
import psycopg2.extensions
from confluent_kafka.schema_registry import SchemaRegistryClient

from cdc_worker.config import WorkerConfig
from cdc_worker.core.encoding.avro_serializer import AvroEventSerializer
from cdc_worker.core.encoding.json_serializer import JsonEventSerializer
from cdc_worker.core.errors import ConfigurationError, InfrastructureError
from cdc_worker.core.lsn import format_lsn
from cdc_worker.core.model import TypeInfo
from cdc_worker.options import OutputFormat
from cdc_worker.shell.kafka_publisher import KafkaPublisher, KafkaUnavailable
from cdc_worker.shell.kafka_transactions import KafkaTransactions, ProducerFenced
from cdc_worker.shell.metrics import WorkerMetrics
from cdc_worker.shell.postgres import catalog as postgres
from cdc_worker.shell.postgres import ddl_trigger, reconnect, slot, standby, truncate_guard, type_catalog
from cdc_worker.shell.postgres.catalog import StartupCheckFailed
from cdc_worker.shell.snapshot.reader import SnapshotStopped
from cdc_worker.shell.stream.ddl_events import DdlSelection
from cdc_worker.shell.stream.early_streams import PooledProducer
from cdc_worker.shell.stream.heartbeat import status_interval_for
from cdc_worker.shell.stream.progress import progress_publisher
from cdc_worker.shell.stream.session import StreamSession
from cdc_worker.shell.stream.spooling import spool_for
from cdc_worker.snapshot_run import SnapshotRun, abandon_slot, ask_for_new_tables
from cdc_worker.startup import (
    REGISTRY_TIMEOUT_S,
    Startup,
    check_startup,
    choose_codec,
    open_publisher,
    open_streamed_producers,
    open_transactions,
    serve_metrics,
    topic_specs,
)
from kafka_contract.topics import NamingError, transactional_id

log = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_RUNTIME_ERROR = 1
EXIT_STARTUP_ERROR = 2

Serializer = AvroEventSerializer | JsonEventSerializer


def make_serializer(config: WorkerConfig, type_infos: dict[int, TypeInfo]) -> Serializer:
    if config.output_format is OutputFormat.AVRO:
        registry = SchemaRegistryClient({"url": config.schema_registry, "timeout": REGISTRY_TIMEOUT_S})
        return AvroEventSerializer(registry, type_infos, topic_prefix=config.topic_prefix)
    return JsonEventSerializer(type_infos, topic_prefix=config.topic_prefix)


def _lost(error: BaseException) -> bool:
    """Whether `error` is the connection to Postgres going away (not a statement failing)."""
    if isinstance(error, postgres.PostgresConnectionLost):
        return True
    return isinstance(error, psycopg2.Error) and postgres.connection_lost(error)


def one_line(error: BaseException) -> str:
    """An error's text on one line (libpq and librdkafka wrap theirs with hints on new lines)."""
    return " ".join(str(error).split())


class Worker:
    """One run of the worker. `run()` returns the process exit code."""

    def __init__(self, config: WorkerConfig, stop: threading.Event | None = None) -> None:
        self.config = config
        self.stop = stop or threading.Event()
        self.metrics = WorkerMetrics()
        self.publisher = KafkaPublisher(
            config.broker, config.kafka_config, config.topic_config, client_id=f"bottledwater-{config.slot}"
        )
        self.metrics_port: int | None = None
        # Set once the stream runs, so that tests and the CLI can look at it.
        self.session: StreamSession | None = None
        self.on_streaming: Callable[[StreamSession], None] | None = None
        self.native_codec = False
        self.native_producer = False
        self.transactions: KafkaTransactions | None = None  # --delivery exactly-once
        self.streamed_producers: list[PooledProducer] = []  # and its large transactions' producers
        # Exactly-once: per table read after the slot's snapshot point, the LSN it was read at.
        self.table_points: dict[int, int] = {}

    def run(self) -> int:
        try:
            return self._run()
        except StartupCheckFailed as exc:
            for problem in exc.problems:
                log.error("startup check failed: %s", problem)
            return EXIT_STARTUP_ERROR
        except (KafkaUnavailable, NamingError) as exc:
            log.error("%s", one_line(exc))
            # Before the stream, a configuration problem; during it, an outage to restart after.
            return EXIT_STARTUP_ERROR if self.session is None else EXIT_RUNTIME_ERROR
        except ConfigurationError as exc:
            log.error("%s", one_line(exc))
            return EXIT_STARTUP_ERROR
        except InfrastructureError as exc:
            log.error("%s", one_line(exc))
            return EXIT_RUNTIME_ERROR
        except Exception as exc:
            if isinstance(exc, psycopg2.Error) and postgres.connection_lost(exc):
                # Wherever the connection broke (a query, a COPY, the stream), one line and exit 1.
                log.error("%s", postgres.PostgresConnectionLost.from_error(exc))
                return EXIT_RUNTIME_ERROR
            # Never let a crash look like a finished stream: log it whole and exit non-zero.
            log.exception(
                "the worker stopped on an error; nothing past the last delivered transaction was acknowledged"
            )
            return EXIT_RUNTIME_ERROR
        finally:
            self.metrics.close()

    def _run(self) -> int:
        config = self.config
        log.info("starting with %s", config.describe())
        self.native_codec = choose_codec(config)
        # Before anything else: a -C setting librdkafka refuses is a configuration error (exit 2),
        # and building the clients needs no broker.
        self.native_producer = open_publisher(self.publisher, config, native_codec=self.native_codec)
        if config.metrics_port is not None:
            self.metrics_port = serve_metrics(self.metrics, config.metrics_port)
        # Before the slot is looked at: a worker still streaming on it is fenced now.
        self.transactions = open_transactions(self.publisher, config)
        self.streamed_producers = open_streamed_producers(self.publisher, config) if self.native_codec else []
        conn = postgres.connect(config.postgres)
        try:
            startup = check_startup(conn, config, self.publisher)
            if self.transactions is not None and startup.resume:
                self.transactions.load_position()
            type_infos = type_catalog.load_type_infos(
                conn, type_catalog.table_type_oids(t.schema for t in startup.tables)
            )
            self.publisher.ensure_topics(topic_specs(config, startup.tables))
            if startup.resume:
                # Asked before the publication changes, so that a crash in between asks again on
                # the next start (the table is still new then); the chunks are read after it.
                ask_for_new_tables(conn, self.config, startup)
            if not startup.on_standby:  # there the checks found them as planned, made on the primary
                slot.sync_publications(conn, startup.plan)
                # A resumed slot takes no snapshot: a partition attached while no worker streamed
                # has its rows asked for (`announce`), as one attached while streaming does.
                announce = startup.resume and startup.facts.decodes_logical_messages
                for warning in truncate_guard.install(conn, startup.tables, announce=announce):
                    log.warning("%s", warning)
            if config.capture_ddl and ddl_trigger.install(conn):
                log.info("installed the DDL event trigger (--capture-ddl) in %s", startup.facts.database)
            finishing = startup.existing is not None and not startup.resume and self.transactions is not None
            if startup.existing is not None and not startup.resume and not finishing:
                log.warning(
                    "slot %s exists but its snapshot never completed (the worker stopped during it): "
                    "dropping it and starting over with a new snapshot",
                    config.slot,
                )
                slot.drop_slot(conn, config.slot)
            repl = postgres.connect(config.postgres, replication=True)
            try:
                if startup.resume and startup.existing is not None:
                    start_lsn = startup.existing.confirmed_flush_lsn or 0
                    log.info("resuming slot %s at %s (no snapshot)", config.slot, format_lsn(start_lsn))
                    if self.transactions is not None and not startup.on_standby:
                        run = self._snapshot_run(type_infos, on_standby=False)
                        self.table_points = run.points(startup.tables, start_lsn)
                elif finishing and startup.existing is not None:
                    finished_at = self._finish_snapshot(
                        conn, startup, type_infos, startup.existing.confirmed_flush_lsn or 0
                    )
                    if finished_at is None:
                        return EXIT_OK
                    start_lsn = finished_at
                else:
                    created_at = self._create_and_snapshot(conn, repl, startup, type_infos)
                    if created_at is None:
                        return EXIT_OK
                    start_lsn = created_at
                if self.transactions is not None:
                    self.publisher.use_transactions()  # the snapshot's rows went through its readers' own
                return self._stream_reconnecting(conn, repl, startup, type_infos, start_lsn)
            finally:
                repl.close()
        finally:
            conn.close()

    def _snapshot_run(self, type_infos: dict[int, TypeInfo], *, on_standby: bool) -> SnapshotRun:
        config = self.config
        # Each table one Kafka transaction under exactly-once; not on a standby, where a killed
        # snapshot leaves no slot to finish it from (its slot is temporary until complete).
        tid = transactional_id(config.slot, config.topic_prefix)
        return SnapshotRun(
            config,
            self.publisher,
            serializer_factory=partial(make_serializer, config, type_infos),
            metrics=self.metrics,
            stop=self.stop,
            native_codec=self.native_codec,
            native_producer=self.native_producer,
            tid=tid if self.transactions is not None and not on_standby else None,
        )

    def _create_and_snapshot(
        self,
        conn: psycopg2.extensions.connection,
        repl: psycopg2.extensions.connection,
        startup: Startup,
        type_infos: dict[int, TypeInfo],
    ) -> int | None:
        """Create the slot and publish the snapshot; the stream's start LSN, or None if stopped."""
        config = self.config
        run = self._snapshot_run(type_infos, on_standby=startup.on_standby)
        if startup.on_standby:  # a temporary slot, named once the snapshot completes (standby.py)
            created = standby.create_snapshot_slot(repl, config.slot)
        else:
            run.reset_points()
            slot.record_snapshot_state(conn, config.publication_name, config.slot, slot.SNAPSHOT_PENDING)
            created = slot.create_slot(repl, config.slot, failover=startup.features.failover_slot)
        lsn_text = format_lsn(created.consistent_lsn)
        named = f" (as {created.name}, temporary until the snapshot completes)" if startup.on_standby else ""
        log.info("created slot %s%s at %s", config.slot, named, lsn_text, extra={"lsn": lsn_text})
        if config.skip_snapshot:
            log.info("--skip-snapshot: existing rows are not published")
        else:
            try:
                run.read(run.spec(created), startup.tables, type_infos)
            except BaseException as exc:
                if run.tid is not None:  # kept: the next start finishes it (snapshot_run)
                    repl.close()
                    log.warning(
                        "%s during the snapshot: slot %s kept with the tables Kafka holds; the next start "
                        "reads the others", "stopped" if isinstance(exc, SnapshotStopped) else "failed",
                        config.slot,
                    )  # fmt: skip
                else:
                    abandon_slot(conn, repl, self.config, on_standby=startup.on_standby)
                if isinstance(exc, SnapshotStopped):
                    if run.tid is None:
                        log.warning(
                            "stopped during the snapshot: slot %s dropped; the next start snapshots again",
                            config.slot,
                        )
                    return None
                raise
        return self._snapshot_done(conn, repl, startup, created.consistent_lsn, created.name)

    def _finish_snapshot(
        self,
        conn: psycopg2.extensions.connection,
        startup: Startup,
        type_infos: dict[int, TypeInfo],
        since: int,
    ) -> int | None:
        """Exactly-once: the snapshot of the slot at `since` a killed worker left, finished."""
        run = self._snapshot_run(type_infos, on_standby=False)
        try:
            if not self.config.skip_snapshot:
                self.table_points = run.finish(startup.tables, since, type_infos)
        except SnapshotStopped:
            log.warning("stopped during the snapshot: slot %s kept; the next start goes on", self.config.slot)
            return None
        return self._snapshot_done(conn, None, startup, since, self.config.slot)

    def _snapshot_done(
        self,
        conn: psycopg2.extensions.connection,
        repl: psycopg2.extensions.connection | None,
        startup: Startup,
        point: int,
        name: str,
    ) -> int:
        """Record the snapshot at `point` complete; the stream's start LSN."""
        config = self.config
        if self.transactions is not None:
            # Before the slot counts as snapshotted: a position Kafka kept from an earlier slot of
            # this name (another database, LSNs of another server) must not be resumed from.
            self.transactions.commit(point, restart=True)
        if startup.on_standby and repl is not None:
            standby.make_permanent(conn, repl, name, config.slot)
        else:
            slot.record_snapshot_state(
                conn, config.publication_name, config.slot, slot.SNAPSHOT_DONE, format_lsn(point)
            )
        return point

    def _stream_reconnecting(
        self,
        conn: psycopg2.extensions.connection,
        repl: psycopg2.extensions.connection,
        startup: Startup,
        type_infos: dict[int, TypeInfo],
        start_lsn: int,
    ) -> int:
        """Stream; when the connection is lost, reconnect (`--reconnect-timeout`, shell/postgres/
        reconnect.py: a restart, or a promotion that a multi-host DSN follows) and stream on from
        the slot where the server reached has it. `conn` and `repl` are the caller's to close; the
        connections opened here are closed here."""
        config = self.config
        self.metrics.watch_slot(config.postgres, config.slot)
        identity = reconnect.identify(repl)
        published = 0  # the last commit LSN published, over every session of this run
        opened: list[psycopg2.extensions.connection] = []
        try:
            while True:
                try:
                    return self._stream(conn, repl, startup, type_infos, start_lsn)
                except Exception as exc:
                    if config.reconnect_timeout <= 0 or self.stop.is_set() or not _lost(exc):
                        raise
                    log.error(
                        "%s; reconnecting for up to %.0f s (--reconnect-timeout)",
                        one_line(exc if isinstance(exc, postgres.PostgresConnectionLost)
                                 else postgres.PostgresConnectionLost.from_error(exc)),
                        config.reconnect_timeout,
                    )  # fmt: skip
                    if self.session is not None:
                        published = max(published, self.session.position.commit_lsn)
                    again = reconnect.reconnect(
                        config.postgres,
                        config.slot,
                        timeout_s=config.reconnect_timeout,
                        before=identity,
                        published_commit_lsn=published,
                        stop=self.stop,
                    )
                    if again is None:  # stopped while reconnecting: nothing more to acknowledge
                        return EXIT_OK
                    opened += [again.conn, again.repl]
                    conn, repl, identity, start_lsn = again.conn, again.repl, again.identity, again.start_lsn
                    log.info(
                        "streaming on from slot %s at %s (no snapshot)", config.slot, format_lsn(start_lsn)
                    )
        finally:
            for connection in opened:
                connection.close()

    def _stream(
        self,
        conn: psycopg2.extensions.connection,
        repl: psycopg2.extensions.connection,
        startup: Startup,
        type_infos: dict[int, TypeInfo],
        start_lsn: int,
    ) -> int:
        config = self.config
        transactions = self.transactions
        already_in_kafka = (
            None if transactions is None else transactions.already_in_kafka(start_lsn, self.table_points)
        )
        serializer = make_serializer(config, type_infos)
        session = StreamSession(
            repl_conn=repl,
            catalog=conn,
            slot=config.slot,
            publications=startup.plan.names,
            start_lsn=start_lsn,
            publisher=self.publisher,
            serializer=serializer,
            type_infos=type_infos,
            policy=config.on_error,
            allow_unkeyed=config.allow_unkeyed,
            topic_prefix=config.topic_prefix,
            status_interval=status_interval_for(config.status_interval, startup.facts.wal_sender_timeout_ms),
            metrics=self.metrics,
            stop=self.stop,
            resnapshot_chunk_rows=config.resnapshot_chunk_rows,
            native_codec=self.native_codec,
            logical_messages=startup.facts.decodes_logical_messages,
            watch_partitions=not startup.on_standby and any(t.partitioned for t in startup.tables),
            ddl=DdlSelection.of(config.tables, config.exclude_tables, [t.schema for t in startup.tables])
            if config.capture_ddl
            else None,
            spool=spool_for(
                stream_in_progress=not config.no_stream_in_progress,
                memory_mb=config.spool_memory_mb,
                directory=config.spool_dir,
                server_version_num=startup.facts.server_version_num,
            ),
            transactions=self.transactions,
            already_in_kafka=already_in_kafka,
            streamed_producers=self.streamed_producers,
        )
        self.session = session
        session.start()
        if self.on_streaming is not None:
            self.on_streaming(session)
        # Progress events on the control topic, for the lake's watermark (docs/lakehouse.md).
        session.progress = progress_publisher(
            self.publisher,
            serializer.progress,
            session.produce_untracked,
            config.topic_prefix,
            caught_up=session.ack.caught_up,
            idle_interval=config.idle_progress_interval,
        )
        session.progress.start()
        try:
            clean = session.run()
            if not clean and transactions is not None and session.tracker.failure is not None:
                transactions.raise_if_fenced(session.tracker.failure.reason)
        except ProducerFenced:
            raise  # the session shut down already; it stopped on the fenced producer's deliveries
        except BaseException as error:
            fenced = transactions.fatal(error) if transactions is not None else None
            if fenced is not None:
                raise fenced from None
            # Still deliver and acknowledge what can be, so a restart repeats as little as possible.
            try:
                session.shutdown()
            except Exception as exc:
                # A lost connection cannot take the final acknowledgement: the error itself says it all.
                if not isinstance(error, postgres.PostgresConnectionLost):
                    log.warning("could not flush and acknowledge after the error: %s", one_line(exc))
            raise
        finally:
            session.progress.stop()
        return EXIT_OK if clean else EXIT_RUNTIME_ERROR
