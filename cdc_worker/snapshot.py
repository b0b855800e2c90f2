"""The consistent snapshot: every selected table, read with COPY under the slot's exported snapshot,
published as op `r` events at the slot's consistent LSN.

Parallelism: `workers` threads, each with its own connection whose transaction imports the exported
snapshot (`SET TRANSACTION SNAPSHOT`), so all of them see the database exactly as of the slot's
consistent point. Large tables are split into ranges of heap pages read by ctid (Postgres 14+ scans
a ctid range without reading the rest of the table); the last range of a table is open-ended, so a
row on a page past the size measured at planning time is still read once.

Rows are parsed by `copy_text` and built into the same `ChangeEvent`s the stream produces, so the
serializers and converters are shared. Each thread has its own serializer (they cache per thread,
without locks); the Kafka producer is shared (librdkafka is thread-safe). Every message must be
delivered before the snapshot counts as done: `SnapshotReader.run` returns only then.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from types import SimpleNamespace
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message
from psycopg2 import sql

from cdc_worker.ack import FailurePolicy
from cdc_worker.copy_text import parse_copy_text_line
from cdc_worker.encoding import (
    HEADER_COMMIT_TS,
    HEADER_LSN,
    HEADER_OP,
    HEADER_SEQ,
    HEADER_XID,
    EncodedMessage,
    iso_utc,
)
from cdc_worker.kafka_publisher import KafkaPublisher, MessageTooLarge
from cdc_worker.lsn import format_lsn
from cdc_worker.metrics import WorkerMetrics
from cdc_worker.model import ChangeEvent, Op, TableSchema
from cdc_worker.naming import topic_name
from cdc_worker.postgres import CatalogTable, connect
from cdc_worker.snapshot_progress import SnapshotProgress

log = logging.getLogger(__name__)

# 8192 pages of 8 kB: 64 MB of heap per range, small enough to balance the workers, large enough
# that the per-COPY overhead does not matter.
DEFAULT_PAGES_PER_CHUNK = 8192
POLL_EVERY_ROWS = 1000  # serve delivery reports this often, so the producer queue keeps draining
PROGRESS_EVERY_ROWS = 2000
PLAIN_PROGRESS_INTERVAL_S = 10.0
FLUSH_TIMEOUT_S = 600.0
SNAPSHOT_XID = 0
SNAPSHOT_SEQ = 0

Serializer = Callable[[ChangeEvent], EncodedMessage | None]


class SnapshotFailed(RuntimeError):
    """The snapshot could not complete; the slot it belongs to must be dropped."""


class SnapshotStopped(RuntimeError):
    """A stop was requested (SIGTERM/SIGINT) before the snapshot completed."""


@dataclass(frozen=True)
class Chunk:
    table: CatalogTable
    first_page: int | None = None  # None: from the start
    end_page: int | None = None  # exclusive; None: to the end

    def copy_statement(self) -> sql.Composed:
        schema = self.table.schema
        columns = sql.SQL(", ").join(sql.Identifier(c.name) for c in schema.columns)
        relation = sql.Identifier(schema.namespace, schema.name)
        if self.first_page is None and self.end_page is None:
            return sql.SQL("COPY {} ({}) TO STDOUT").format(relation, columns)
        conditions = []
        if self.first_page is not None:
            conditions.append(sql.SQL("ctid >= {}::tid").format(sql.Literal(f"({self.first_page},0)")))
        if self.end_page is not None:
            conditions.append(sql.SQL("ctid < {}::tid").format(sql.Literal(f"({self.end_page},0)")))
        return sql.SQL("COPY (SELECT {} FROM {} WHERE {}) TO STDOUT").format(
            columns, relation, sql.SQL(" AND ").join(conditions)
        )


def plan_chunks(
    tables: Sequence[CatalogTable], pages_per_chunk: int = DEFAULT_PAGES_PER_CHUNK
) -> list[Chunk]:
    """Ranges of every table, the largest tables first so that the workers finish together."""
    chunks: list[Chunk] = []
    for table in sorted(tables, key=lambda t: t.pages, reverse=True):
        if table.pages <= pages_per_chunk:
            chunks.append(Chunk(table))
            continue
        starts = list(range(0, table.pages, pages_per_chunk))
        for index, start in enumerate(starts):
            last = index == len(starts) - 1
            chunks.append(Chunk(table, start if start else None, None if last else start + pages_per_chunk))
    return chunks


class SnapshotReader:
    """Reads and publishes the snapshot. `run()` blocks until every row is delivered to Kafka, or
    raises `SnapshotFailed` / `SnapshotStopped`."""

    def __init__(
        self,
        *,
        dsn: str,
        snapshot_name: str,
        consistent_lsn: int,
        snapshot_time: datetime,
        tables: Sequence[CatalogTable],
        workers: int,
        publisher: KafkaPublisher,
        serializer_factory: Callable[[], Serializer],
        policy: FailurePolicy,
        metrics: WorkerMetrics | None = None,
        stop: threading.Event | None = None,
        pages_per_chunk: int = DEFAULT_PAGES_PER_CHUNK,
        use_rich: bool | None = None,
        topic_prefix: str | None = None,
    ) -> None:
        self.dsn = dsn
        self.snapshot_name = snapshot_name
        self.lsn = consistent_lsn
        self.snapshot_time = snapshot_time
        self.chunks = plan_chunks(tables, pages_per_chunk)
        self.workers = max(1, min(workers, len(self.chunks)))
        self.publisher = publisher
        self.serializer_factory = serializer_factory
        self.policy = policy
        self.metrics = metrics
        self.stop = stop or threading.Event()
        self.progress = SnapshotProgress.for_chunks(self.chunks, use_rich=use_rich)
        self.topic_prefix = topic_prefix
        self.tables = list(tables)
        # Per keyed table whose topic already holds rows: the keys not (yet) seen again.
        self._phantoms: dict[int, set[bytes]] = {}
        self._queue: queue.SimpleQueue[Chunk] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._failure: str | None = None
        self.published = 0  # rows read and handed to the producer
        self.skipped = 0  # data and delivery errors under --on-error=log

    # -- errors ------------------------------------------------------------------------------

    def _fail(self, reason: str, kind: str) -> None:
        """A data or delivery error: fatal under EXIT, logged and skipped under LOG."""
        if self.metrics is not None:
            self.metrics.errors.labels(kind).inc()
        if self.policy is FailurePolicy.EXIT:
            with self._lock:
                if self._failure is None:
                    self._failure = reason
            log.error("%s", reason)
        else:
            with self._lock:
                self.skipped += 1
            log.warning("skipped (--on-error=log): %s", reason)

    def _on_delivery(self, table: str, error: KafkaError | None, message: Message) -> None:
        # Called for every message, so it does nothing unless something failed; the final flush
        # (every report served) is what says that all the others were delivered.
        if error is not None:
            self._fail(
                f"snapshot row of {table} not delivered to topic {message.topic()}: {error.str()} "
                f"(snapshot LSN {format_lsn(self.lsn)}); check Kafka and retry",
                "delivery",
            )

    # -- reading -----------------------------------------------------------------------------

    def _read_chunk(self, cursor: Any, chunk: Chunk, serializer: Serializer) -> None:
        """COPY one range and publish its rows. This is the snapshot's hot loop: everything it
        needs per row is bound to a local name first, and the rare paths (a full producer queue,
        an encoding error, a stop) are left to exceptions and periodic checks."""
        schema: TableSchema = chunk.table.schema
        name = schema.qualified_name
        key_indexes = schema.key_indexes
        lsn, ts = self.lsn, self.snapshot_time
        publisher, progress, oid = self.publisher, self.progress, schema.oid
        produce = publisher.producer.produce
        on_delivery = partial(self._on_delivery, name)
        events = self.metrics.events.labels(name, Op.READ.value) if self.metrics else None
        phantoms = self._phantoms.get(oid)
        parse, new_event, read_op = parse_copy_text_line, ChangeEvent, Op.READ
        newline = b"\n"
        counted = 0
        pending_line = b""

        def publish(line: bytes) -> None:
            row = parse(line)
            key = tuple(row[i] for i in key_indexes) if key_indexes else None
            event = new_event(read_op, schema, key, row, (), lsn, SNAPSHOT_SEQ, SNAPSHOT_XID, ts)
            try:
                message = serializer(event)
            except Exception as exc:  # a data error (or the registry) under the policy, never silently
                self._fail(f"snapshot row of {name} cannot be encoded: {exc}", "encoding")
                return
            if message is None:
                return
            if phantoms is not None and message.key is not None:
                phantoms.discard(message.key)
            try:
                produce(
                    message.topic,
                    message.value,
                    message.key,
                    on_delivery=on_delivery,
                    headers=message.headers,  # type: ignore[arg-type]
                )
            except (BufferError, KafkaException):
                # A full queue (wait for room) or a refused message (classify it): the slow path.
                try:
                    publisher.produce(message, on_delivery)
                except MessageTooLarge as exc:
                    reason = (
                        f"snapshot row of {name}, key {key!r}: {exc}; raise the limit or exclude the table"
                    )
                    self._fail(reason, "message_too_large")

        def write(data: bytes) -> int:
            nonlocal counted, pending_line
            # psycopg2 writes one COPY row per call; anything else goes through the general split.
            if pending_line or data.find(newline) != len(data) - 1:
                lines = (pending_line + data).split(newline)
                pending_line = lines.pop()
            else:
                lines = [data]
            for line in lines:
                publish(line)
                counted += 1
                if counted % POLL_EVERY_ROWS == 0:
                    if self.stop.is_set() or self._failure is not None:
                        raise SnapshotStopped("stop requested")
                    publisher.poll(0)
                    if counted % PROGRESS_EVERY_ROWS == 0:
                        progress.advance(oid, PROGRESS_EVERY_ROWS)
                        if events is not None:
                            events.inc(PROGRESS_EVERY_ROWS)
            return len(data)

        cursor.copy_expert(chunk.copy_statement(), SimpleNamespace(write=write))
        if pending_line:
            raise SnapshotFailed(f"COPY of {name} ended in the middle of a row: {pending_line[:80]!r}")
        rest = counted % PROGRESS_EVERY_ROWS
        progress.advance(oid, rest)
        if events is not None:
            events.inc(rest)
        progress.chunk_done(oid)
        with self._lock:
            self.published += counted

    def _worker(self, index: int, errors: list[BaseException]) -> None:
        conn = None
        try:
            conn = connect(self.dsn, application_name=f"bottledwater-snapshot-{index}")
            serializer = self.serializer_factory()
            with conn.cursor() as cur:
                cur.execute("BEGIN TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
                cur.execute("SET TRANSACTION SNAPSHOT %s", (self.snapshot_name,))
                while not self.stop.is_set() and self._failure is None:
                    try:
                        chunk = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    self._read_chunk(cur, chunk, serializer)
                cur.execute("COMMIT")
        except SnapshotStopped:
            pass
        except BaseException as exc:
            errors.append(exc)
            with self._lock:
                if self._failure is None:
                    self._failure = f"snapshot worker {index}: {exc}"
        finally:
            if conn is not None:
                conn.close()

    def run(self) -> int:
        """Read and publish everything; returns the number of rows delivered."""
        for chunk in self.chunks:
            self._queue.put(chunk)
        log.info(
            "snapshot of %d table(s) in %d range(s) with %d worker(s) at LSN %s",
            len(self.progress.tables),
            len(self.chunks),
            self.workers,
            format_lsn(self.lsn),
        )
        self._find_existing_keys()
        errors: list[BaseException] = []
        threads = [
            threading.Thread(target=self._worker, args=(i, errors), name=f"bw-snapshot-{i}", daemon=True)
            for i in range(self.workers)
        ]
        self.progress.start()
        try:
            for thread in threads:
                thread.start()
            next_report = time.monotonic() + PLAIN_PROGRESS_INTERVAL_S
            while any(t.is_alive() for t in threads):
                for thread in threads:
                    thread.join(timeout=0.2)
                self.publisher.poll(0)
                if not self.progress.use_rich and time.monotonic() >= next_report:
                    for line in self.progress.log_lines():
                        log.info("%s", line)
                    next_report = time.monotonic() + PLAIN_PROGRESS_INTERVAL_S
            self._check(errors)
            self._tombstone_phantoms()
            missing = self.publisher.flush(FLUSH_TIMEOUT_S, tick=lambda: self._check(errors))
            if missing:
                raise SnapshotFailed(
                    f"{missing} snapshot messages still undelivered after {FLUSH_TIMEOUT_S:.0f}s: check Kafka"
                )
            self._check(errors)
        finally:
            self.progress.stop()
        log.info(
            "snapshot complete: %d rows published and acknowledged, %d skipped, at LSN %s",
            self.published - self.skipped,
            self.skipped,
            format_lsn(self.lsn),
        )
        return self.published - self.skipped

    # -- topics that already hold rows -------------------------------------------------------

    def _find_existing_keys(self) -> None:
        """Read the keys the keyed tables' topics already hold (none on a first snapshot)."""
        for table in self.tables:
            if not table.schema.is_keyed:
                continue  # an append-only topic: nothing can be retracted from it
            name = topic_name(table.schema, self.topic_prefix)
            keys = self.publisher.live_keys(name)
            if keys:
                self._phantoms[table.schema.oid] = keys
                log.info(
                    "topic %s already holds %d keys: those the snapshot does not find again get tombstones",
                    name,
                    len(keys),
                    extra={"topic": name},
                )

    def _tombstone_phantoms(self) -> None:
        """Tombstones, at the snapshot's LSN, for keys the topics hold but the snapshot did not
        find: rows deleted while no snapshot or stream was running (e.g. after a kill -9 during
        an earlier snapshot). Without them the compacted topics would keep those rows forever."""
        headers = [
            (HEADER_OP, Op.DELETE.value.encode()),
            (HEADER_LSN, str(self.lsn).encode()),
            (HEADER_SEQ, str(SNAPSHOT_SEQ).encode()),
            (HEADER_XID, str(SNAPSHOT_XID).encode()),
            (HEADER_COMMIT_TS, iso_utc(self.snapshot_time).encode()),
        ]
        for table in self.tables:
            keys = self._phantoms.get(table.schema.oid)
            if not keys:
                continue
            name = topic_name(table.schema, self.topic_prefix)
            log.info(
                "%d keys of %s are gone since its topic was written: publishing tombstones", len(keys), name
            )
            on_delivery = partial(self._on_delivery, table.qualified_name)
            for key in keys:
                self.publisher.produce(EncodedMessage(name, key, None, list(headers)), on_delivery)
            if self.metrics is not None:
                self.metrics.events.labels(table.qualified_name, Op.DELETE.value).inc(len(keys))

    def _check(self, errors: list[BaseException]) -> None:
        if self._failure is not None:
            raise SnapshotFailed(self._failure) from (errors[0] if errors else None)
        if self.stop.is_set():
            raise SnapshotStopped("stop requested during the snapshot")
