"""Snapshot workers as processes: with Python's global interpreter lock, threads share one core,
so parallel reading only pays with processes, each with its own Postgres connection, serializer and
Kafka producer.

A process reads ranges from a queue until it meets the end marker, flushes its producer (every
message acknowledged), and says "done"; failures, progress and the end go back to the parent on
another queue. It ignores SIGINT (Ctrl-C reaches the whole process group; the parent decides) and
stops on its own when the parent disappears (kill -9), so a dead worker leaves no orphans behind.

Processes are started with `forkserver` (`process_context`): forking the worker itself is unsafe, as
it already runs librdkafka's threads, but the fork server is a fresh single-threaded interpreter
(started by fork + exec, like `spawn`) that imports this module and the serializer's once
(`set_forkserver_preload`), before any producer exists, and forks a reader from that state in a
few milliseconds. With `spawn` every reader started its own interpreter and imported the whole
worker again (~0.4 s of CPU each), inside the snapshot. The readers are the fork server's
children, not the worker's: each watches the worker through multiprocessing's parent sentinel
(`parent_process()`), which the fork server hands over too.

When the machine has jemalloc and `LD_PRELOAD` is not set, the fork server and so every reader run
with it preloaded (`shell.allocator`, which says why: 2.09-2.28 us of worker CPU per row instead of
2.61-2.75 at 1M rows, docs/benchmarks.md). The worker itself re-executes on jemalloc at its start
under the same rule, and then the fork server inherits its `LD_PRELOAD`.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing import forkserver
from multiprocessing.context import ForkServerContext
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event
from typing import Any

from cdc_worker.shell.allocator import jemalloc_library, preload_for
from cdc_worker.shell.logs import LogFormat, configure_logging
from cdc_worker.shell.snapshot.chunks import (
    Chunk,
    ChunkReader,
    Serializer,
    SnapshotSpec,
    SnapshotStopped,
    snapshot_connection,
)
from cdc_worker.shell.snapshot.table_commits import TableCommits, open_reader_publisher

log = logging.getLogger(__name__)

FLUSH_TIMEOUT_S = 600.0
# Messages on the event queue, child -> parent: (kind, index, *payload).
FAIL, ADVANCE, CHUNK_DONE, DONE, STOPPED, ERROR = "fail", "advance", "chunk_done", "done", "stopped", "error"


@dataclass(frozen=True)
class ProcessSettings:
    """Everything a worker process needs, picklable."""

    spec: SnapshotSpec
    broker: str
    kafka_config: dict[str, str]
    topic_config: dict[str, str]
    client_id: str
    serializer_factory: Callable[[], Serializer]
    log_format: LogFormat
    log_level: str
    topic_prefix: str | None = None


class _QueueEvents:
    """`ChunkEvents` that report to the parent; a stop comes from the parent's event or its death."""

    def __init__(self, index: int, events: Queue[tuple[Any, ...]], stop: Event) -> None:
        self.index = index
        self.events = events
        self.stop = stop
        # None only when not run as a multiprocessing child (then there is no parent to lose).
        self.parent = multiprocessing.parent_process()

    def fail(self, reason: str, kind: str) -> None:
        self.events.put((FAIL, self.index, reason, kind))

    def advance(self, oid: int, rows: int) -> None:
        if rows:
            self.events.put((ADVANCE, self.index, oid, rows))

    def chunk_done(self, oid: int) -> None:
        self.events.put((CHUNK_DONE, self.index, oid))

    def stopping(self) -> bool:
        return self.stop.is_set() or (self.parent is not None and not self.parent.is_alive())


# The fork server inherits the environment at its start, so LD_PRELOAD is set only around it.
_environ_lock = threading.Lock()


def process_context(preload: Sequence[str]) -> ForkServerContext:
    """The `forkserver` context the readers start from, its server started now if it is not yet
    running, with this module and `preload` (the serializer factory's module) imported in it, and
    jemalloc preloaded when there is one (see the module's docstring).

    The server lives as long as this process and serves every later snapshot; the preload list of
    the first call is the one it keeps."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([__name__, *preload])
    with _environ_lock:
        # Started here, not by the first reader, so that LD_PRELOAD is set only for its start.
        library = preload_for(os.environ.get("LD_PRELOAD"), jemalloc_library())
        if library is not None:
            os.environ["LD_PRELOAD"] = library
        try:
            forkserver.ensure_running()
        finally:
            if library is not None:
                del os.environ["LD_PRELOAD"]
    log.debug("snapshot readers' fork server ready (LD_PRELOAD: %s)", library or "unchanged")
    return context


def process_main(
    index: int,
    settings: ProcessSettings,
    chunks: Queue[Chunk | None],
    events: Queue[tuple[Any, ...]],
    stop: Event,
) -> None:
    """The body of worker process `index`."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    configure_logging(settings.log_format, settings.log_level)
    sink = _QueueEvents(index, events, stop)
    commits: TableCommits | None = None
    try:
        spec = settings.spec
        publisher, commits = open_reader_publisher(
            settings.broker,
            settings.kafka_config,
            settings.topic_config,
            settings.client_id,
            native_producer=spec.native_producer,
            tid=spec.transactional_id,
            point=spec.lsn,
            reader=index,
            topic_prefix=settings.topic_prefix,
        )
        reader = ChunkReader(spec, publisher, settings.serializer_factory(), sink)
        conn, cursor = snapshot_connection(spec, index)
        try:
            while not sink.stopping():
                chunk = chunks.get()
                if chunk is None:
                    break
                reader.read(cursor, chunk)
                if commits is not None and not sink.stopping():
                    commits.table_done(chunk.table.schema, native=reader.used_native)
            cursor.execute("COMMIT")
        finally:
            conn.close()
        missing = publisher.flush(FLUSH_TIMEOUT_S, tick=lambda: None if not sink.stopping() else _stop())
        if missing:
            sink.fail(
                f"{missing} snapshot messages undelivered after {FLUSH_TIMEOUT_S:.0f}s: check Kafka",
                "delivery",
            )
        _abandon(commits)  # a table read after a failure elsewhere stopped the snapshot
        events.put((DONE, index, reader.published))
    except SnapshotStopped:
        _abandon(commits)
        events.put((STOPPED, index))
    except BaseException as exc:  # reported to the parent, which fails the snapshot with it
        _abandon(commits)
        events.put((ERROR, index, f"{type(exc).__name__}: {exc}"))


def _abandon(commits: TableCommits | None) -> None:
    if commits is not None:
        try:
            commits.abandon()
        except Exception as exc:  # the transaction coordinator's timeout aborts it anyway
            log.warning("could not abort the snapshot's open Kafka transactions: %s", exc)


def _stop() -> None:
    raise SnapshotStopped("stop requested while flushing")
