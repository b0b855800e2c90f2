"""Re-snapshots while streaming, as the stream session drives them (the state machine is
`core.incremental`; the chunk reads are `resnapshot_reader`).

Signals (requests, watermarks) arrive as logical messages inside the stream; a chunk is read after
a commit when the state machine wants one; its rows are released at the high watermark's position
as part of that transaction, so the watermark is acknowledged only once they are in Kafka.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Protocol

from cdc_worker.core.encoding.serializers import EncodedMessage
from cdc_worker.core.incremental import (
    ANY_SLOT,
    REQUEST,
    SIGNAL_PREFIX,
    ChunkRelease,
    IncrementalSnapshot,
    SignalError,
    TableFailure,
    parse_signal,
    request_content,
)
from cdc_worker.core.lsn import format_lsn
from cdc_worker.core.model import ChangeEvent, Op, SnapshotControl, TableSchema, TransactionCommitted
from cdc_worker.core.pgoutput.decoder import Begin, LogicalMessage
from cdc_worker.shell.kafka_publisher import KafkaPublisher, TopicSpec
from cdc_worker.shell.stream.position import StreamPosition
from cdc_worker.shell.stream.resnapshot_reader import ChunkSource, ChunkUnreadable
from kafka_contract.control import SNAPSHOT_DONE, SNAPSHOT_FAILED, SNAPSHOT_PROGRESS
from kafka_contract.topics import NamingError, topic_name

log = logging.getLogger(__name__)

RESNAPSHOT_LOG_EVERY_S = 10.0


class ControlSerializer(Protocol):
    def snapshot_control(self, event: SnapshotControl) -> EncodedMessage: ...


class StreamPublishing(Protocol):
    """What the driver needs of the stream session: publishing inside the open transaction."""

    def publish_change(self, event: ChangeEvent) -> None: ...

    def produce_tracked(self, message: EncodedMessage, table: str, op: str) -> None: ...

    def produce_untracked(self, message: EncodedMessage, what: str) -> None: ...

    def count_error(self, kind: str) -> None: ...


class ResnapshotDriver:
    """Runs `IncrementalSnapshot` against the stream: signals in, chunks read, rows released."""

    def __init__(
        self,
        *,
        state: IncrementalSnapshot,
        chunks: ChunkSource,
        stream: StreamPublishing,
        publisher: KafkaPublisher,
        serializer: ControlSerializer,
        topic_prefix: str | None,
        remember_table: Callable[[int, str], None],
        position: StreamPosition,
    ) -> None:
        self.state = state
        self.chunks = chunks
        self.stream = stream
        self.publisher = publisher
        self.serializer = serializer
        self.topic_prefix = topic_prefix
        self.remember_table = remember_table
        self.position = position
        # table -> (monotonic start, rows already published then), for rows/s
        self._started: dict[str, tuple[float, int]] = {}
        self._logged = 0.0

    def signal(self, message: LogicalMessage) -> None:
        """A logical message of the stream: a request or a watermark when it is ours, inside the
        transaction being published."""
        begin = self.position.begin
        if message.prefix != SIGNAL_PREFIX or not message.transactional or begin is None:
            return
        try:
            content = self._narrowed(message.content)
            if content is None:
                return
            release = self.state.signal(content, self.position.commit_lsn)
        except SignalError as exc:
            log.warning("ignored a bottledwater message at %s: %s", format_lsn(message.lsn), exc)
            return
        if release is not None:
            self._publish_release(release, begin)

    def _narrowed(self, content: bytes) -> bytes | None:
        """A request for every slot (`ANY_SLOT`: a partition attached with rows) as this worker's
        own, for the partitions it publishes under their root; None when it publishes none of them
        (another worker's root, or `--partitions leaf`, whose topics had those rows already)."""
        signal = parse_signal(content)
        if signal.kind != REQUEST or signal.slot != ANY_SLOT:
            return content
        mine = [
            (t.schema, t.table) for t in signal.tables if self.chunks.published_as_root(t.schema, t.table)
        ]
        return request_content(self.state.slot, signal.ident, mine) if mine else None

    def committed(self, event: TransactionCommitted) -> None:
        """The stream decoded a commit (in commit order): a chunk read later knows it."""
        self.chunks.decoded(event.xid)

    def read_chunks(self, current_lsn: int) -> None:
        """Write the next chunk's watermarks and read its rows; a table that cannot be read is
        reported and skipped, and the next one tried."""
        while self.state.wants_chunk:
            plan = self.state.next_chunk()
            name = plan.table.qualified_name
            if name not in self._started:
                self._started[name] = (time.monotonic(), plan.progress.rows)
                log.info(
                    "re-snapshot of %s %s (request %s)",
                    name,
                    "starts" if plan.after is None else f"goes on after {plan.progress.rows} rows",
                    ", ".join(plan.table.request_ids),
                    extra={"table": name},
                )
            try:
                read = self.chunks.read(plan)
            except ChunkUnreadable as exc:
                self._report_failure(self.state.table_failed(plan, str(exc)), current_lsn)
                continue
            self.remember_table(read.table.oid, read.table.qualified_name)
            self.state.chunk_read(plan, read.table.oid, dict(read.rows), read.snapshot)
            return

    def _report_failure(self, failure: TableFailure, current_lsn: int) -> None:
        self.stream.count_error("resnapshot")
        log.error("re-snapshot of %s skipped: %s", failure.table.qualified_name, failure.reason)
        try:
            topic = topic_name(
                TableSchema(0, failure.table.schema, failure.table.table, ()), self.topic_prefix
            )
        except NamingError:
            topic = ""
        self._started.pop(failure.table.qualified_name, None)
        for request_id in failure.table.request_ids:
            event = SnapshotControl(
                SNAPSHOT_FAILED, failure.table.schema, failure.table.table, topic, request_id,
                0, failure.reason, current_lsn, 0, 0, datetime.now(UTC),
            )  # fmt: skip
            # Outside any transaction, so not tracked: a restart reads the same watermark, tries the
            # table again and reports again, so losing this report loses nothing.
            self.stream.produce_untracked(self.serializer.snapshot_control(event), "a re-snapshot report")

    def _publish_release(self, release: ChunkRelease, begin: Begin) -> None:
        """The chunk's rows at the high watermark's position, as part of its transaction (so the
        watermark is acknowledged only once they are in Kafka), then how far the table is."""
        schema = self.chunks.schema(release.table_oid)
        topic = topic_name(schema, self.topic_prefix)
        if release.rows:
            self.publisher.ensure_topics([TopicSpec(topic, True)])
        key_indexes, lsn, xid, ts = schema.key_indexes, begin.final_lsn, begin.xid, begin.commit_ts
        seq = 0
        for seq, row in enumerate(release.rows):
            key = tuple(row[i] for i in key_indexes)
            self.stream.publish_change(ChangeEvent(Op.READ, schema, key, row, (), lsn, seq, xid, ts))
        name = release.table.qualified_name
        self._log_progress(name, release)
        op = SNAPSHOT_DONE if release.table_done else SNAPSHOT_PROGRESS
        for offset, request_id in enumerate(release.table.request_ids, start=seq + 1):
            event = SnapshotControl(
                op, schema.namespace, schema.name, topic, request_id, release.rows_so_far, None, lsn,
                offset, xid, ts,
            )  # fmt: skip
            self.stream.produce_tracked(self.serializer.snapshot_control(event), name, op)

    def _log_progress(self, name: str, release: ChunkRelease) -> None:
        now = time.monotonic()
        if release.table_done or now - self._logged >= RESNAPSHOT_LOG_EVERY_S:
            self._logged = now
            started, rows_then = self._started.get(name, (now, release.rows_so_far))
            rate = (release.rows_so_far - rows_then) / max(now - started, 1e-3)
            log.info(
                "re-snapshot of %s: %d rows%s (%.0f rows/s)",
                name,
                release.rows_so_far,
                ", done" if release.table_done else "",
                rate,
                extra={"table": name},
            )
        if release.table_done:
            self._started.pop(name, None)
