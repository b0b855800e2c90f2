"""The snapshot's ranges as Spark tasks (`--snapshot-engine spark`): what one task runs on an
executor, and what the driver prepares for all of them. No pyspark here; `spark_job`
is the job that ships `RangeJob` and the ranges to the executors.

One task = one ctid range (`chunks.Chunk`): its own Postgres connection whose transaction imports the
slot's exported snapshot (`chunks.snapshot_connection`), its own Kafka producer (the worker's
settings: idempotent, `acks=all`, `murmur2_random`), and the worker's own range reader
(`chunks.ChunkReader`, with the native codec where the worker uses it), so every key, value and
header (`bw.op=r`, the consistent LSN, seq 0, xid 0, the snapshot time) is byte for byte what the
worker's snapshot publishes. The task returns only once Kafka acknowledged every row of its range.

Schema ids: the driver registers each table's key and value schemas once (`register_schemas`,
through a `RecordingRegistrar`) and ships the ids; an executor's serializer asks `KnownSchemaIds`,
so executors make no registry round trips and need no route to the registry.

A task Spark retries (a lost executor, a failed attempt) publishes its range again from the start:
the same keys and the same bytes, so a compacted topic and the merge (which orders by `(lsn, seq)`)
end the same; a consumer of the raw topic may see those rows twice (at-least-once, as always).
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

from confluent_kafka.schema_registry import Schema

from cdc_worker.core.ack import FailurePolicy
from cdc_worker.core.encoding import avro_schema
from cdc_worker.core.encoding.avro_serializer import AvroEventSerializer
from cdc_worker.core.encoding.json_serializer import JsonEventSerializer
from cdc_worker.core.encoding.serializers import SchemaRegistrar
from cdc_worker.core.errors import RegistryUnavailable
from cdc_worker.core.model import TypeInfo
from cdc_worker.core.pgtypes.mapping import table_column_types
from cdc_worker.shell.kafka_publisher import KafkaPublisher
from cdc_worker.shell.postgres.catalog import CatalogTable
from cdc_worker.shell.snapshot.chunks import (
    Chunk,
    ChunkReader,
    SnapshotFailed,
    SnapshotSpec,
    snapshot_connection,
)
from cdc_worker.shell.snapshot.gone_keys import SeenKeys

log = logging.getLogger(__name__)

# A task waits this long for Kafka to acknowledge its range before it fails (and is retried).
TASK_FLUSH_TIMEOUT_S = 600.0


class KnownSchemaIds:
    """A `SchemaRegistrar` that answers from the ids the driver registered, never asking a registry."""

    def __init__(self, ids: Mapping[tuple[str, str], int]) -> None:
        self.ids = ids

    def register_schema(self, subject_name: str, schema: Schema, normalize_schemas: bool = False) -> int:
        found = self.ids.get((subject_name, schema.schema_str or ""))
        if found is None:
            raise RegistryUnavailable(
                f"subject {subject_name}: a schema the Spark driver did not register (the table changed "
                "since the job was planned?): run the worker again"
            )
        return found


class RecordingRegistrar:
    """The driver's registrar: registers through `registry` and remembers every id it got."""

    def __init__(self, registry: SchemaRegistrar) -> None:
        self.registry = registry
        self.ids: dict[tuple[str, str], int] = {}

    def register_schema(self, subject_name: str, schema: Schema, normalize_schemas: bool = False) -> int:
        schema_id = self.registry.register_schema(subject_name, schema, normalize_schemas)
        self.ids[(subject_name, schema.schema_str or "")] = schema_id
        return schema_id


def register_schemas(serializer: AvroEventSerializer, tables: Sequence[CatalogTable]) -> None:
    """Register every table's key and value schema, as the serializer's first event of it would."""
    for table in tables:
        schema = table.schema
        column_types = table_column_types(schema, serializer.type_infos, serializer.options)
        topic = serializer.topic_for(schema)
        serializer.schema_id(f"{topic}-value", avro_schema.value_schema(schema, column_types))
        key = avro_schema.key_schema(schema, column_types)
        if key is not None:
            serializer.schema_id(f"{topic}-key", key)


class FakeExecutorLoss(RuntimeError):
    """Test-only: a task that dies in the middle of its range, after Kafka took part of it."""


FAKE_HANG_LINE = "test-only fake hang in the middle of a range"


@dataclass(frozen=True)
class FakeFailure:
    """Test-only failure injection (`BOTTLEDWATER_FAKE_TASK_FAILURE=schema.table[:always|:hang]`):
    the tasks of `table` die after their first batch of rows on their first attempt (or on every
    one), or hang there until Spark kills them (`hang`, for a stop during the job)."""

    table: str
    when: str = "once"  # "once", "always" or "hang"

    @classmethod
    def parse(cls, text: str | None) -> FakeFailure | None:
        if not text:
            return None
        table, _, when = text.partition(":")
        return cls(table, when or "once")

    def strikes(self, chunk: Chunk, attempt: int) -> bool:
        return chunk.table.qualified_name == self.table and (self.when != "once" or attempt == 0)


@dataclass(frozen=True)
class RangeJob:
    """What every task of one snapshot shares (picklable: shipped to the executors)."""

    spec: SnapshotSpec
    broker: str
    kafka_config: Mapping[str, str]
    output_format: str  # "avro" or "json"
    type_infos: Mapping[int, TypeInfo]
    topic_prefix: str | None
    schema_ids: Mapping[tuple[str, str], int] = field(default_factory=dict)
    policy: FailurePolicy = FailurePolicy.EXIT
    client_id: str = "bottledwater-spark-snapshot"
    fake_failure: FakeFailure | None = None

    def serializer(self) -> AvroEventSerializer | JsonEventSerializer:
        if self.output_format == "avro":
            return AvroEventSerializer(
                KnownSchemaIds(self.schema_ids), self.type_infos, topic_prefix=self.topic_prefix
            )
        return JsonEventSerializer(self.type_infos, topic_prefix=self.topic_prefix)


@dataclass(frozen=True)
class RangeResult:
    table: str
    oid: int
    rows: int  # rows published and acknowledged
    skipped: int  # rows skipped under --on-error=log
    # Of the keys the table's topic held before the snapshot, those this range published again
    # (None: the topic held none); the driver tombstones the keys no range published.
    seen_keys: SeenKeys | None = None


class _TaskEvents:
    """`ChunkEvents` of one task: the first failure under EXIT fails the task (Spark retries it,
    then fails the job); under LOG the row is counted and skipped, as in the worker."""

    def __init__(self, policy: FailurePolicy, publisher: KafkaPublisher, fake: FakeFailure | None) -> None:
        self.policy = policy
        self.publisher = publisher
        self.fake = fake
        self.failure: str | None = None
        self.skipped = 0
        self.advanced = 0

    def fail(self, reason: str, kind: str) -> None:
        if self.policy is FailurePolicy.EXIT:
            self.failure = self.failure or reason
        else:
            self.skipped += 1
            log.warning("skipped (--on-error=log): %s", reason)

    def advance(self, oid: int, rows: int) -> None:
        self.advanced += rows

    def chunk_done(self, oid: int) -> None:
        pass

    def stopping(self) -> bool:
        if self.fake is not None:
            # What a lost executor leaves: part of the range already in Kafka, the rest not.
            self.publisher.flush(TASK_FLUSH_TIMEOUT_S)
            if self.fake.when == "hang":
                print(FAKE_HANG_LINE, file=sys.stderr, flush=True)
                while True:  # until Spark kills this Python worker (a cancelled job)
                    time.sleep(1.0)
            raise FakeExecutorLoss("test-only fake executor loss in the middle of a range")
        return self.failure is not None


def publish_range(
    job: RangeJob, chunk: Chunk, index: int, attempt: int = 0, known_keys: AbstractSet[bytes] | None = None
) -> RangeResult:
    """Read range `index` under the exported snapshot and publish it; returns once Kafka holds it
    all. Raises `SnapshotFailed` (the task fails, Spark retries it) on any failure. `known_keys`:
    the keys the table's topic held before the snapshot, to tell which of them this range holds."""
    seen = SeenKeys(known_keys) if known_keys else None
    publisher = KafkaPublisher(job.broker, job.kafka_config, client_id=f"{job.client_id}-{index}")
    # The native codec's own producer where the worker uses it (and the executor can build it).
    publisher.open(native_producer=job.spec.native_producer)
    try:
        fake = job.fake_failure if job.fake_failure and job.fake_failure.strikes(chunk, attempt) else None
        events = _TaskEvents(job.policy, publisher, fake)
        tallies = {chunk.table.schema.oid: seen} if seen is not None else None
        reader = ChunkReader(job.spec, publisher, job.serializer(), events, tallies)
        conn, cursor = snapshot_connection(job.spec, index)
        try:
            reader.read(cursor, chunk)
            cursor.execute("COMMIT")
        finally:
            conn.close()
        missing = publisher.flush(TASK_FLUSH_TIMEOUT_S)
        if events.failure is None and missing:
            events.failure = f"{missing} rows of {chunk.table.qualified_name} undelivered after " \
                             f"{TASK_FLUSH_TIMEOUT_S:.0f}s: check Kafka"  # fmt: skip
        if events.failure is not None:
            raise SnapshotFailed(events.failure)
        published = reader.published - events.skipped
        return RangeResult(
            chunk.table.qualified_name, chunk.table.schema.oid, published, events.skipped, seen
        )
    finally:
        publisher.close()
