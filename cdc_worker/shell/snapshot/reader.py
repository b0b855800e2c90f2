"""The consistent snapshot: every selected table, read with COPY under the slot's exported snapshot,
published as op `r` events at the slot's consistent LSN, every message acknowledged before
`SnapshotReader.run` returns.

Parallelism: `workers` readers, each with its own connection whose transaction imports the exported
snapshot (`SET TRANSACTION SNAPSHOT`), so all of them see the database exactly as of the slot's
consistent point, share the ranges of every table (`snapshot_copy`). With more than one worker
they are processes (`snapshot_process`), because Python threads share one core; one worker reads
in a thread of the worker's own process.

A snapshot over topics that already hold rows (after an interrupted snapshot, or a dropped slot)
also retracts what is gone: it reads the keys the topics hold first, and publishes tombstones for
those it did not find again. That bookkeeping lives in this process, so such a snapshot uses threads.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from cdc_worker.core.ack import FailurePolicy
from cdc_worker.core.failure_tally import FailureTally
from cdc_worker.core.lsn import format_lsn
from cdc_worker.core.model import Op
from cdc_worker.shell.kafka_publisher import KafkaPublisher
from cdc_worker.shell.logs import LogFormat
from cdc_worker.shell.metrics import WorkerMetrics
from cdc_worker.shell.postgres.catalog import CatalogTable
from cdc_worker.shell.snapshot.chunks import (
    DEFAULT_PAGES_PER_CHUNK,
    Chunk,
    ChunkReader,
    Serializer,
    SnapshotFailed,
    SnapshotSpec,
    SnapshotStopped,
    plan_chunks,
    snapshot_connection,
)
from cdc_worker.shell.snapshot.gone_keys import existing_keys, publish_tombstones
from cdc_worker.shell.snapshot.process import (
    ADVANCE,
    CHUNK_DONE,
    DONE,
    ERROR,
    FAIL,
    FLUSH_TIMEOUT_S,
    STOPPED,
    ProcessSettings,
    process_context,
    process_main,
)
from cdc_worker.shell.snapshot.progress import SnapshotProgress
from cdc_worker.shell.snapshot.table_commits import TableCommits, open_reader_publisher

__all__ = ["SnapshotFailed", "SnapshotReader", "SnapshotSpec", "SnapshotStopped", "plan_chunks"]

log = logging.getLogger(__name__)

PLAIN_PROGRESS_INTERVAL_S = 10.0
EVENT_WAIT_S = 0.2
PROCESS_EXIT_WAIT_S = 10.0


class SnapshotReader:
    """Reads and publishes the snapshot. `run()` blocks until every row is delivered to Kafka, or
    raises `SnapshotFailed` / `SnapshotStopped`. `serializer_factory` must be picklable (a
    module-level function or a `functools.partial` of one) when `workers > 1`."""

    def __init__(
        self,
        *,
        spec: SnapshotSpec,
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
        log_settings: tuple[LogFormat, str] = (LogFormat.TEXT, "info"),
    ) -> None:
        self.spec = spec
        self.tables = list(tables)
        self.chunks = plan_chunks(
            tables, pages_per_chunk, workers, whole_tables=spec.transactional_id is not None
        )
        self.workers = max(1, min(workers, len(self.chunks)))
        self.publisher = publisher
        self.serializer_factory = serializer_factory
        self.policy = policy
        self.metrics = metrics
        self.stop = stop or threading.Event()
        self.topic_prefix = topic_prefix
        self.log_settings = log_settings
        self.progress = SnapshotProgress.for_chunks(self.chunks, use_rich=use_rich)
        self._lock = threading.Lock()
        self._failure: str | None = None
        self.failures = FailureTally()
        self.published = 0  # rows handed to the producer
        self.skipped = 0  # data and delivery errors under --on-error=log
        # Per keyed table whose topic already holds rows: the keys not (yet) seen again.
        self._phantoms: dict[int, set[bytes]] = {}

    # -- ChunkEvents, for the readers in this process and the messages of worker processes ------

    def fail(self, reason: str, kind: str) -> None:
        if self.metrics is not None:
            self.metrics.errors.labels(kind).inc()
        with self._lock:
            if self.policy is FailurePolicy.EXIT:
                self._failure = self._failure or reason
            else:
                self.skipped += 1
            # The same reason again (every row in flight when a broker goes away): counted, and
            # told once more in the summary when the snapshot ends.
            first = self.failures.record((kind, reason), reason)
        if not first:
            return
        if self.policy is FailurePolicy.EXIT:
            log.error("%s", reason)
        else:
            log.warning("skipped (--on-error=log): %s", reason)

    def advance(self, oid: int, rows: int) -> None:
        self.progress.advance(oid, rows)
        if self.metrics is not None:
            self.metrics.snapshot_rows.labels(self.progress.tables[oid].name).inc(rows)
            self.metrics.events.labels(self.progress.tables[oid].name, Op.READ.value).inc(rows)

    def chunk_done(self, oid: int) -> None:
        self.progress.chunk_done(oid)

    def stopping(self) -> bool:
        return self.stop.is_set() or self._failure is not None

    # -- running -------------------------------------------------------------------------------

    def run(self) -> int:
        """Read and publish everything; returns the number of rows published and acknowledged."""
        self._find_existing_keys()
        use_processes = self.workers > 1 and not self._phantoms
        tid = self.spec.transactional_id
        log.info(
            "snapshot of %d table(s) in %d range(s) with %d worker %s at LSN %s%s",
            len(self.progress.tables),
            len(self.chunks),
            self.workers,
            "processes" if use_processes else "thread(s)",
            format_lsn(self.spec.lsn),
            ""
            if tid is None
            else f", each table one Kafka transaction (transactional ids {tid}-snapshot-<n>)",
        )
        self.progress.start()
        try:
            if use_processes:
                self._run_processes()
            else:
                self._run_threads()
            self._check()
            if self.spec.transactional_id is None:  # else each table's, in its transaction
                self._tombstone_phantoms(self.publisher, self.tables)
            missing = self.publisher.flush(FLUSH_TIMEOUT_S, tick=self._check)
            if missing:
                raise SnapshotFailed(f"{missing} snapshot messages undelivered after {FLUSH_TIMEOUT_S:.0f}s")
            self._check()
        finally:
            self.progress.stop()
            self.log_failure_summary()
        delivered = self.published - self.skipped
        log.info(
            "snapshot complete: %d rows published and acknowledged, %d skipped, at LSN %s",
            delivered,
            self.skipped,
            format_lsn(self.spec.lsn),
        )
        return delivered

    def log_failure_summary(self) -> None:
        """One line per failure repeated under the same reason, with its count."""
        for line in self.failures.summary():
            if self.policy is FailurePolicy.EXIT:
                log.error("%s", line)
            else:
                log.warning("skipped (--on-error=log): %s", line)

    def _check(self) -> None:
        if self._failure is not None:
            raise SnapshotFailed(self._failure)
        if self.stop.is_set():
            raise SnapshotStopped("stop requested during the snapshot")

    def _report_progress(self, next_report: float) -> float:
        if self.progress.use_rich or time.monotonic() < next_report:
            return next_report
        for line in self.progress.log_lines():
            log.info("%s", line)
        return time.monotonic() + PLAIN_PROGRESS_INTERVAL_S

    def _run_threads(self) -> None:
        work: queue.SimpleQueue[Chunk] = queue.SimpleQueue()
        for chunk in self.chunks:
            work.put(chunk)

        def read_all(index: int) -> None:
            try:
                publisher, commits = self.publisher, None
                if self.spec.transactional_id is not None:
                    publisher, commits = self._reader_publisher(index)
                reader = ChunkReader(self.spec, publisher, self.serializer_factory(), self, self._phantoms)
                conn, cursor = snapshot_connection(self.spec, index)
                try:
                    while not self.stopping():
                        try:
                            chunk = work.get_nowait()
                        except queue.Empty:
                            break
                        reader.read(cursor, chunk)
                        if commits is not None and not self.stopping():
                            # The gone keys' tombstones in the table's own transaction.
                            self._tombstone_phantoms(publisher, [chunk.table])
                            commits.table_done(chunk.table.schema, native=reader.used_native)
                    cursor.execute("COMMIT")
                finally:
                    conn.close()
                    if commits is not None:
                        commits.abandon()  # what a stop or a failure left uncommitted
                with self._lock:
                    self.published += reader.published
            except SnapshotStopped:
                pass
            except Exception as exc:
                with self._lock:
                    self._failure = self._failure or f"snapshot worker {index}: {type(exc).__name__}: {exc}"

        threads = [threading.Thread(target=read_all, args=(i,), daemon=True) for i in range(self.workers)]
        for thread in threads:
            thread.start()
        next_report = time.monotonic() + PLAIN_PROGRESS_INTERVAL_S
        while any(t.is_alive() for t in threads):
            for thread in threads:
                thread.join(timeout=EVENT_WAIT_S)
            self.publisher.poll(0)
            next_report = self._report_progress(next_report)

    def _run_processes(self) -> None:
        context = process_context(self.preload())
        chunks: Any = context.Queue()
        events: Any = context.Queue()
        stop = context.Event()
        for chunk in self.chunks:
            chunks.put(chunk)
        for _ in range(self.workers):
            chunks.put(None)  # one end marker per process
        log_format, log_level = self.log_settings
        settings = ProcessSettings(
            self.spec,
            self.publisher.broker,
            self.publisher.kafka_config,
            self.publisher.topic_config,
            self.publisher.client_id,
            self.serializer_factory,
            log_format,
            log_level,
            self.topic_prefix,
        )
        processes = [
            context.Process(
                target=process_main,
                args=(i, settings, chunks, events, stop),
                name=f"bw-snapshot-{i}",
                daemon=True,
            )
            for i in range(self.workers)
        ]
        for process in processes:
            process.start()
        finished: set[int] = set()
        next_report = time.monotonic() + PLAIN_PROGRESS_INTERVAL_S
        try:
            while len(finished) < len(processes):
                if self.stopping():
                    stop.set()
                try:
                    message = events.get(timeout=EVENT_WAIT_S)
                except queue.Empty:
                    for index, process in enumerate(processes):
                        if index not in finished and not process.is_alive():
                            finished.add(index)
                            self.fail(
                                f"snapshot process {index} died (exit code {process.exitcode})", "process"
                            )
                    next_report = self._report_progress(next_report)
                    continue
                self._dispatch(message, finished)
        finally:
            stop.set()
            for process in processes:
                process.join(PROCESS_EXIT_WAIT_S)
                if process.is_alive():
                    process.terminate()

    def preload(self) -> list[str]:
        """The modules a reader process needs beyond its own: the serializer factory's (a
        `functools.partial` names its function's), imported once in the fork server."""
        factory = getattr(self.serializer_factory, "func", self.serializer_factory)
        module = getattr(factory, "__module__", None)
        return [module] if isinstance(module, str) and module != "__main__" else []

    def _dispatch(self, message: tuple[Any, ...], finished: set[int]) -> None:
        kind, index, *payload = message
        if kind == ADVANCE:
            self.advance(*payload)
        elif kind == CHUNK_DONE:
            self.chunk_done(*payload)
        elif kind == FAIL:
            self.fail(*payload)
        elif kind == DONE:
            finished.add(index)
            with self._lock:
                self.published += payload[0]
        elif kind == STOPPED:
            finished.add(index)
        elif kind == ERROR:
            finished.add(index)
            with self._lock:
                self._failure = self._failure or f"snapshot process {index}: {payload[0]}"

    # -- topics that already hold rows -------------------------------------------------------

    def _find_existing_keys(self) -> None:
        """Read the keys the keyed tables' topics already hold (none on a first snapshot)."""
        self._phantoms = existing_keys(self.publisher, self.tables, self.topic_prefix)

    def _reader_publisher(self, index: int) -> tuple[KafkaPublisher, TableCommits | None]:
        """Under exactly-once, a reader thread's own transactional publisher (`table_commits`)."""
        return open_reader_publisher(
            self.publisher.broker,
            self.publisher.kafka_config,
            self.publisher.topic_config,
            self.publisher.client_id,
            native_producer=self.spec.native_producer,
            tid=self.spec.transactional_id,
            point=self.spec.lsn,
            reader=index,
            topic_prefix=self.topic_prefix,
        )

    def _tombstone_phantoms(self, publisher: KafkaPublisher, tables: Sequence[CatalogTable]) -> None:
        """Tombstones for the keys the topics of `tables` hold but the snapshot did not find
        (`gone_keys`)."""
        reader = ChunkReader(self.spec, publisher, self.serializer_factory(), self)
        publish_tombstones(
            publisher,
            spec=self.spec,
            tables=tables,
            gone=self._phantoms,
            topic_prefix=self.topic_prefix,
            on_delivery=lambda table: partial(reader.on_delivery, table),
            metrics=self.metrics,
        )
