"""Reading one range of one table with COPY under the exported snapshot, and handing its rows to
Kafka: the part of the snapshot that runs in each worker thread or process.

A range is a set of heap pages read by ctid (Postgres 14+ scans a ctid range without reading the
rest of the table; the last range is open-ended), a key range, or a whole table (exactly-once).
Rows are parsed by `copy_text` into the `ChangeEvent`s the stream produces (op `r`, the slot's
consistent LSN): serializers and converters are shared. Failures, progress and stop requests go
through `ChunkEvents` (locks in the thread mode, a queue to the parent in the process mode).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from types import SimpleNamespace
from typing import Any, Protocol

import psycopg2.extensions
from confluent_kafka import KafkaError, Message
from psycopg2 import sql

from cdc_worker.core.encoding.avro_serializer import AvroEventSerializer
from cdc_worker.core.encoding.json_serializer import JsonEventSerializer
from cdc_worker.core.encoding.native import NativePlan, NativeProducer, native_plan_for
from cdc_worker.core.encoding.serializers import SEQ_HEADERS, EncodedMessage
from cdc_worker.core.errors import InfrastructureError
from cdc_worker.core.lsn import format_lsn
from cdc_worker.core.model import ChangeEvent, Op, TableSchema
from cdc_worker.core.pgtypes.copy_text import parse_copy_text_line
from cdc_worker.shell.kafka_publisher import KafkaPublisher, MessageTooLarge
from cdc_worker.shell.postgres.catalog import CatalogTable, connect
from cdc_worker.shell.postgres.partitions import Leaf
from cdc_worker.shell.snapshot.key_ranges import KeySplit, cut
from kafka_contract.headers import HEADER_OP

# 8192 pages of 8 kB: 64 MB of heap per range, small enough to balance the workers, large enough
# that the per-COPY overhead does not matter.
DEFAULT_PAGES_PER_CHUNK = 8192
MIN_PAGES_PER_CHUNK = 128  # 1 MB: below that a COPY's own cost starts to show
RANGES_PER_WORKER = 4
POLL_EVERY_ROWS = 1000  # serve delivery reports (and look for a stop) this often
PROGRESS_EVERY_ROWS = 2000
SNAPSHOT_XID = 0
SNAPSHOT_SEQ = 0
NEWLINE = b"\n"
# COPY rows per call into the native codec: enough to make the call's cost vanish, few enough that
# progress, stop requests and delivery reports are served often.
NATIVE_BATCH_ROWS = 1000
READ_OP_HEADER = (HEADER_OP, Op.READ.value.encode())

Serializer = Callable[[ChangeEvent], EncodedMessage | None]


class SnapshotFailed(InfrastructureError, RuntimeError):
    """The snapshot could not complete; the slot it belongs to must be dropped."""


class SnapshotStopped(RuntimeError):
    """A stop was requested (SIGTERM/SIGINT) before the snapshot completed."""


@dataclass(frozen=True)
class SnapshotSpec:
    """What every reader of one snapshot shares (picklable, for worker processes)."""

    dsn: str
    snapshot_name: str
    lsn: int  # the slot's consistent point: every snapshot row carries it
    snapshot_time: datetime
    # Encode with the native codec where a table has a native plan (`core.encoding.native`).
    native_codec: bool = False
    # Produce those tables' rows with the native codec's own producer (`KafkaPublisher.native`).
    native_producer: bool = False
    # --delivery exactly-once: the slot's transactional id; each table one Kafka transaction.
    transactional_id: str | None = None


@dataclass(frozen=True)
class Chunk:
    table: CatalogTable
    first_page: int | None = None  # None: from the start
    end_page: int | None = None  # exclusive; None: to the end
    # A key range instead (`key_ranges`): `key_column >= low_key AND key_column < high_key`, each
    # bound a literal of the column's type, None: open-ended.
    key_column: str | None = None
    low_key: str | None = None
    high_key: str | None = None
    # The leaf partition this range belongs to, when `table` is a partitioned table captured as one:
    # read from the leaf (by the root's column names, in the root's order), published as the root's.
    leaf: Leaf | None = None

    @property
    def whole_root(self) -> bool:
        """A partitioned table read through its root (every leaf at once), which COPY cannot name."""
        return self.table.partitioned and self.leaf is None

    def copy_statement(self) -> sql.Composed:
        schema = self.table.schema
        columns = sql.SQL(", ").join(sql.Identifier(c.name) for c in schema.columns)
        read_from = self.leaf or schema
        relation = sql.Identifier(read_from.namespace, read_from.name)
        conditions = []
        if self.key_column is not None:
            key = sql.Identifier(self.key_column)
            # An untyped literal takes the column's type, as the histogram bound it came from had.
            if self.low_key is not None:
                conditions.append(sql.SQL("{} >= {}").format(key, sql.Literal(self.low_key)))
            if self.high_key is not None:
                conditions.append(sql.SQL("{} < {}").format(key, sql.Literal(self.high_key)))
        if self.table.row_filter is not None:  # checked, and accepted by Postgres (`subsets`)
            conditions.append(sql.SQL("({})").format(sql.SQL(self.table.row_filter)))
        if self.first_page is not None:
            conditions.append(sql.SQL("ctid >= {}::tid").format(sql.Literal(f"({self.first_page},0)")))
        if self.end_page is not None:
            conditions.append(sql.SQL("ctid < {}::tid").format(sql.Literal(f"({self.end_page},0)")))
        if not conditions and schema.columns and not self.table.generated_columns and not self.whole_root:
            return sql.SQL("COPY {} ({}) TO STDOUT").format(relation, columns)
        if not conditions:
            # `COPY t () TO STDOUT` is a syntax error; a zero-column table (`CREATE TABLE t ()`)
            # is read as a query with an empty select list: one empty line per row. COPY refuses
            # generated columns in its column list, and reads them through a query too.
            return sql.SQL("COPY (SELECT {} FROM {}) TO STDOUT").format(columns, relation)
        return sql.SQL("COPY (SELECT {} FROM {} WHERE {}) TO STDOUT").format(
            columns, relation, sql.SQL(" AND ").join(conditions)
        )


def _pages(table: CatalogTable) -> int:
    return sum(leaf.pages for leaf in table.leaves) if table.partitioned else table.pages


def _no_columns(_line: bytes) -> tuple[str | None, ...]:
    return ()


def plan_chunks(
    tables: Sequence[CatalogTable],
    pages_per_chunk: int = DEFAULT_PAGES_PER_CHUNK,
    workers: int = 1,
    *,
    key_splits: Mapping[int, tuple[KeySplit, int]] | None = None,
    ctid_ranges: bool = True,
    whole_tables: bool = False,
) -> list[Chunk]:
    """Ranges of every table, the largest tables first so that the workers finish together. With
    little data for many workers, ranges shrink (down to MIN_PAGES_PER_CHUNK) to give each worker
    about RANGES_PER_WORKER of them. `key_splits`: per table (oid), read by key ranges instead, and
    the pages to size them by (`key_ranges.plan_splits`); `ctid_ranges` False (Postgres before 14):
    any other table is read whole. `whole_tables`: one range per table, a partitioned one read through
    its root (`table_commits`: a table's rows in one Kafka transaction)."""
    if whole_tables:
        return [Chunk(table) for table in sorted(tables, key=_pages, reverse=True)]
    splits = key_splits or {}
    # What is read: each table, or each leaf of a partitioned table, with the pages to size it by.
    heaps: list[tuple[CatalogTable, Leaf | None, int]] = []
    for table in tables:
        split = splits.get(table.schema.oid) if not table.partitioned else None
        if table.partitioned:
            heaps.extend((table, leaf, leaf.pages) for leaf in table.leaves)
        else:
            heaps.append((table, None, split[1] if split is not None else table.pages))
    total = sum(pages for _table, _leaf, pages in heaps)
    balanced = -(-total // (workers * RANGES_PER_WORKER))  # ceiling division
    pages_per_chunk = max(MIN_PAGES_PER_CHUNK, min(pages_per_chunk, balanced))
    chunks: list[Chunk] = []
    for table, leaf, pages in sorted(heaps, key=lambda heap: heap[2], reverse=True):
        split = splits.get(table.schema.oid) if leaf is None else None
        if split is not None:
            edges = [None, *cut(split[0].bounds, -(-pages // pages_per_chunk)), None]
            column = split[0].column
            chunks.extend(Chunk(table, key_column=column, low_key=low, high_key=high)
                          for low, high in zip(edges, edges[1:], strict=False))  # fmt: skip
            continue
        if pages <= pages_per_chunk or not ctid_ranges:
            chunks.append(Chunk(table, leaf=leaf))
            continue
        starts = list(range(0, pages, pages_per_chunk))
        for index, start in enumerate(starts):
            last = index == len(starts) - 1
            end = None if last else start + pages_per_chunk
            chunks.append(Chunk(table, start if start else None, end, leaf=leaf))
    return chunks


def snapshot_connection(
    spec: SnapshotSpec, index: int
) -> tuple[psycopg2.extensions.connection, psycopg2.extensions.cursor]:
    """A connection whose transaction sees the database exactly as the slot's snapshot does."""
    conn = connect(spec.dsn, application_name=f"bottledwater-snapshot-{index}")
    cursor = conn.cursor()
    cursor.execute("BEGIN TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
    cursor.execute("SET TRANSACTION SNAPSHOT %s", (spec.snapshot_name,))
    return conn, cursor


class KeyTally(Protocol):
    """What a range reader does with the keys a table's topic held before the snapshot (see
    `gone_keys`): `discard` each key it publishes again, `clear` when it skipped a row (whose key
    it cannot know, so nothing of the table may be tombstoned). A `set[bytes]` is one."""

    def discard(self, key: bytes, /) -> None: ...
    def clear(self) -> None: ...


class ChunkEvents(Protocol):
    """`fail`: a data or delivery error (`kind`), fatal under EXIT, skipped under LOG; `advance`:
    `rows` more rows of table `oid` handed to the producer; `stopping`: whether to stop reading (a
    stop request, or a failure under EXIT)."""

    def fail(self, reason: str, kind: str) -> None: ...
    def advance(self, oid: int, rows: int) -> None: ...
    def chunk_done(self, oid: int) -> None: ...
    def stopping(self) -> bool: ...


class ChunkReader:
    """Reads ranges and produces their rows; one per worker thread or process (the serializer
    caches without locks). `phantoms`: per table, keys to strike off as they are published again."""

    def __init__(
        self,
        spec: SnapshotSpec,
        publisher: KafkaPublisher,
        serializer: Serializer,
        events: ChunkEvents,
        phantoms: Mapping[int, KeyTally] | None = None,
    ) -> None:
        self.spec = spec
        self.publisher = publisher
        self.serializer = serializer
        self.events = events
        self.phantoms = phantoms or {}
        self.published = 0
        self.used_native = False  # the last table read went through the native producer
        # Per relation version: its native plan, or None for the Python path.
        self._native_plans: dict[int, tuple[TableSchema, NativePlan | None]] = {}

    def on_delivery(self, table: str, error: KafkaError | None, message: Message) -> None:
        # Called for every message, so it does nothing unless something failed; the final flush
        # (every report served) is what says that all the others were delivered.
        if error is not None:
            self.events.fail(
                f"snapshot row of {table} not delivered to topic {message.topic()}: {error.str()} "
                f"(snapshot LSN {format_lsn(self.spec.lsn)}); check Kafka and retry",
                "delivery",
            )

    def on_native_failures(self, table: str, topic: str, reason: str, count: int) -> None:
        # The native producer's reports, counted per reason: each failed row is reported as the
        # confluent-kafka callback above reports it.
        for _ in range(count):
            self.events.fail(
                f"snapshot row of {table} not delivered to topic {topic}: {reason} "
                f"(snapshot LSN {format_lsn(self.spec.lsn)}); check Kafka and retry",
                "delivery",
            )

    def native_plan(self, schema: TableSchema) -> NativePlan | None:
        """The table's native plan when the snapshot uses the native codec and the table has one."""
        cached = self._native_plans.get(schema.oid)
        if cached is not None and cached[0] is schema:
            return cached[1]
        serializer = self.serializer
        plan = None
        if self.spec.native_codec and isinstance(serializer, AvroEventSerializer | JsonEventSerializer):
            try:
                plan = native_plan_for(serializer, schema)
            except Exception:  # registering the schemas failed: the Python loop meets it row by row,
                plan = None  # under --on-error, as it always did
        self._native_plans[schema.oid] = (schema, plan)
        return plan

    def read(self, cursor: Any, chunk: Chunk) -> int:
        """COPY one range and publish its rows; returns how many. `used_native`: whether they all
        went through the native producer (else through confluent-kafka's)."""
        plan = self.native_plan(chunk.table.schema)
        self.used_native = plan is not None and self._native_producer(chunk.table.schema.oid) is not None
        if plan is not None:
            return self._read_native(cursor, chunk, plan)
        return self._read_python(cursor, chunk)

    def _native_producer(self, oid: int) -> NativeProducer | None:  # unless the phantoms' keys must be seen
        return self.publisher.native if oid not in self.phantoms and self.spec.native_producer else None

    def _read_native(self, cursor: Any, chunk: Chunk, plan: NativePlan) -> int:
        """The native codec's loop: COPY lines gathered into batches of `NATIVE_BATCH_ROWS`, each
        encoded in one call; per row only the produce call is left in Python. A row the codec
        declines is encoded (or refused, with its exact error) by the Python reference."""
        schema: TableSchema = chunk.table.schema
        name, oid = schema.qualified_name, schema.oid
        serializer, events, publisher = self.serializer, self.events, self.publisher
        assert isinstance(serializer, AvroEventSerializer | JsonEventSerializer)
        topic = serializer.topic_for(schema)
        lsn_header, xid_header, ts_header = serializer.transaction_headers(
            self.spec.lsn, SNAPSHOT_XID, self.spec.snapshot_time
        )
        # Every row of a snapshot carries the same headers; librdkafka copies them per message.
        headers = [READ_OP_HEADER, lsn_header, SEQ_HEADERS[SNAPSHOT_SEQ], xid_header, ts_header]
        produce = publisher.produce_parts
        on_delivery = partial(self.on_delivery, name)
        phantoms = self.phantoms.get(oid)
        lines: list[bytes] = []
        counted = 0
        native = self._native_producer(oid)
        batch = publisher.native_batch(partial(self.on_native_failures, name)) if native is not None else 0

        def produce_natively(data: bytes) -> int:
            assert native is not None
            rows, problems = plan.produce_copy(native, data, topic, headers, batch)
            for problem in problems:
                if isinstance(problem, Exception):
                    events.fail(f"snapshot row of {name} cannot be encoded: {problem}", "encoding")
                elif problem[3]:
                    exc = publisher.too_large(problem[1], topic)
                    events.fail(f"snapshot row of {name}: {exc}; raise the limit or exclude the table",
                                "message_too_large")  # fmt: skip
                else:
                    self.on_native_failures(name, topic, problem[2], 1)
            return rows

        def flush(final: bool) -> None:
            nonlocal counted
            data = b"".join(lines)
            lines.clear()
            # Whole lines only: a row split across two writes waits for its end.
            end = len(data) if final else data.rfind(NEWLINE) + 1
            if end < len(data):
                lines.append(data[end:])
            if native is not None:
                before = counted
                counted += produce_natively(data[:end]) if end else 0
                progress(before)
                return
            encoded = plan.encode_copy(data[:end], errors="return") if end else []
            for item in encoded:
                if isinstance(item, Exception):
                    events.fail(f"snapshot row of {name} cannot be encoded: {item}", "encoding")
                    if phantoms is not None:
                        phantoms.clear()  # as in `_read_python`: tombstone nothing rather than a live row
                    continue
                key, value = item
                if phantoms is not None and key is not None:
                    phantoms.discard(key)
                try:
                    produce(topic, key, value, headers, on_delivery)
                except MessageTooLarge as exc:
                    events.fail(f"snapshot row of {name}: {exc}; raise the limit or exclude the table",
                                "message_too_large")  # fmt: skip
            before = counted
            counted += len(encoded)
            progress(before)

        def progress(before: int) -> None:
            if events.stopping():
                raise SnapshotStopped("stop requested")
            publisher.poll(0)
            # Progress in whole PROGRESS_EVERY_ROWS steps, as the Python loop reports it.
            steps = counted // PROGRESS_EVERY_ROWS - before // PROGRESS_EVERY_ROWS
            if steps:
                events.advance(oid, steps * PROGRESS_EVERY_ROWS)

        def write(data: bytes) -> int:
            # psycopg2 hands over one COPY row per call, so a batch is NATIVE_BATCH_ROWS calls.
            lines.append(data)
            if len(lines) >= NATIVE_BATCH_ROWS:
                flush(final=False)
            return len(data)

        cursor.copy_expert(chunk.copy_statement(), SimpleNamespace(write=write))
        if lines and not lines[-1].endswith(NEWLINE):
            raise SnapshotFailed(f"COPY of {name} ended in the middle of a row: {lines[-1][-80:]!r}")
        if lines:
            flush(final=True)
        events.advance(oid, counted % PROGRESS_EVERY_ROWS)
        events.chunk_done(oid)
        self.published += counted
        return counted

    def _read_python(self, cursor: Any, chunk: Chunk) -> int:
        """The Python codec's loop, the snapshot's hot loop: what it needs per row bound to a local
        name first, the rare paths (a full queue, an encoding error, a stop) left to exceptions."""
        schema: TableSchema = chunk.table.schema
        name, oid, key_indexes = schema.qualified_name, schema.oid, schema.key_indexes
        lsn, ts, serializer, events = self.spec.lsn, self.spec.snapshot_time, self.serializer, self.events
        publisher = self.publisher
        produce = publisher.produce
        on_delivery = partial(self.on_delivery, name)
        phantoms = self.phantoms.get(oid)
        new_event, read_op = ChangeEvent, Op.READ
        # Each row of a zero-column table is an empty line, which the COPY parser would read as one
        # empty field; the row has none (published as `{}`, as the stream does).
        parse: Callable[[bytes], tuple[str | None, ...]] = (
            parse_copy_text_line if schema.columns else _no_columns
        )
        counted = 0
        pending_line = b""

        def publish(line: bytes) -> None:
            row = parse(line)
            key = tuple(row[i] for i in key_indexes) if key_indexes else None
            event = new_event(read_op, schema, key, row, (), lsn, SNAPSHOT_SEQ, SNAPSHOT_XID, ts)
            try:
                message = serializer(event)
            except Exception as exc:  # a data error (or the registry) under the policy, never silently
                events.fail(f"snapshot row of {name} cannot be encoded: {exc}", "encoding")
                if phantoms is not None:
                    # The skipped row's key would look gone and be tombstoned although the row
                    # exists: tombstone nothing for this table rather than delete a live row.
                    phantoms.clear()
                return
            if message is None:
                return
            if phantoms is not None and message.key is not None:
                phantoms.discard(message.key)
            try:
                produce(message, on_delivery)
            except MessageTooLarge as exc:
                events.fail(
                    f"snapshot row of {name}, key {key!r}: {exc}; raise the limit or exclude the table",
                    "message_too_large",
                )

        def write(data: bytes) -> int:
            nonlocal counted, pending_line
            # psycopg2 writes one COPY row per call; anything else goes through the general split.
            if pending_line or data.find(NEWLINE) != len(data) - 1:
                lines = (pending_line + data).split(NEWLINE)
                pending_line = lines.pop()
            else:
                lines = [data]
            for line in lines:
                publish(line)
                counted += 1
                if counted % POLL_EVERY_ROWS == 0:
                    if events.stopping():
                        raise SnapshotStopped("stop requested")
                    publisher.poll(0)
                    if counted % PROGRESS_EVERY_ROWS == 0:
                        events.advance(oid, PROGRESS_EVERY_ROWS)
            return len(data)

        cursor.copy_expert(chunk.copy_statement(), SimpleNamespace(write=write))
        if pending_line:
            raise SnapshotFailed(f"COPY of {name} ended in the middle of a row: {pending_line[:80]!r}")
        events.advance(oid, counted % PROGRESS_EVERY_ROWS)
        events.chunk_done(oid)
        self.published += counted
        return counted
