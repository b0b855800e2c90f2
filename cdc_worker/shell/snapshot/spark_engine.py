"""`--snapshot-engine spark`: the worker's side of the initial load on Spark.

The worker has created the slot on its replication connection and keeps that connection idle in
the slot's exported snapshot while this runs (the snapshot is importable only as long as its
exporting session lives). Here the worker becomes the Spark driver (client mode, on
`--spark-master`): it registers every table's schemas once, then runs `spark_job`,
whose tasks import the exported snapshot and publish one ctid range each. When the job fails (a range
failed all its attempts, the exported snapshot is gone, a stop) this raises, and the worker drops
the slot as after any incomplete snapshot.

pyspark (and `shared_connections.spark_session`, the one way to build a session, which the lake's
jobs build theirs with too) is imported only when the engine runs, so the default worker needs
neither.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from confluent_kafka import KafkaError, Message

from cdc_worker.core.ack import FailurePolicy
from cdc_worker.core.encoding.avro_serializer import AvroEventSerializer
from cdc_worker.core.encoding.json_serializer import JsonEventSerializer
from cdc_worker.core.model import Op, TypeInfo
from cdc_worker.shell.kafka_publisher import KafkaPublisher
from cdc_worker.shell.metrics import WorkerMetrics
from cdc_worker.shell.postgres.catalog import CatalogTable
from cdc_worker.shell.snapshot.chunks import SnapshotFailed, SnapshotSpec, SnapshotStopped
from cdc_worker.shell.snapshot.gone_keys import DeliveryCallback, existing_keys, publish_tombstones
from cdc_worker.shell.snapshot.spark_job import InitialLoadFailed, LoadRequest, run_initial_load
from cdc_worker.shell.snapshot.spark_ranges import (
    TASK_FLUSH_TIMEOUT_S,
    FakeFailure,
    RangeJob,
    RecordingRegistrar,
    register_schemas,
)

log = logging.getLogger(__name__)

JVM_EXIT_WAIT_S = 30.0
# Test-only: makes the tasks of one table fail (see `spark_ranges.FakeFailure`).
FAKE_FAILURE_ENV = "BOTTLEDWATER_FAKE_TASK_FAILURE"


def run_spark_snapshot(
    *,
    spec: SnapshotSpec,
    tables: Sequence[CatalogTable],
    serializer: AvroEventSerializer | JsonEventSerializer,
    type_infos: Mapping[int, TypeInfo],
    publisher: KafkaPublisher,
    policy: FailurePolicy,
    master: str,
    client_id: str,
    stop: threading.Event,
    metrics: WorkerMetrics | None = None,
) -> int:
    """Publish the snapshot with Spark; returns the rows published and acknowledged. Raises
    `SnapshotFailed` (one line, with the cause) or `SnapshotStopped`. The tasks make their own
    producers with `publisher`'s settings; `publisher` itself reads the keys the topics already
    hold and tombstones those the snapshot did not find again, as the worker's snapshot does."""
    from shared_connections.spark_session import SparkSettings, build_session

    known = existing_keys(publisher, tables, serializer.topic_prefix)

    schema_ids: dict[tuple[str, str], int] = {}
    if isinstance(serializer, AvroEventSerializer):
        recording = RecordingRegistrar(serializer.registry)
        serializer.registry = recording
        register_schemas(serializer, tables)
        schema_ids = recording.ids
    job = RangeJob(
        spec=spec,
        broker=publisher.broker,
        kafka_config=dict(publisher.kafka_config),
        output_format="avro" if isinstance(serializer, AvroEventSerializer) else "json",
        type_infos=dict(type_infos),
        topic_prefix=serializer.topic_prefix,
        schema_ids=schema_ids,
        policy=policy,
        client_id=client_id,
        fake_failure=FakeFailure.parse(os.environ.get(FAKE_FAILURE_ENV)),
    )
    # A process that already runs a Spark session (a Dagster run in-process beside other Spark
    # work, a notebook) is joined, not ended: stopping it would take its JVM from under its owner.
    joined = _running_spark_context()
    if joined is not None:
        log.info("spark snapshot: joining this process's running Spark session on %s", joined)
    spark = build_session(SparkSettings(app_name=client_id, master=master))
    try:
        result = run_initial_load(spark, LoadRequest(job, tuple(tables), known_keys=known), stop)
    except InitialLoadFailed as exc:
        if stop.is_set():
            raise SnapshotStopped("stop requested during the Spark snapshot") from None
        raise SnapshotFailed(
            f"the Spark snapshot failed, so its slot is dropped: {exc}; fix that and start the worker again"
        ) from None
    finally:
        if joined is None:
            stop_spark(spark)
    _tombstone(
        publisher,
        spec=spec,
        tables=tables,
        gone=result.gone,
        topic_prefix=serializer.topic_prefix,
        metrics=metrics,
    )
    if metrics is not None:  # the same counters as the worker's own snapshot, per table at the end
        for table, rows in result.rows_per_table.items():
            metrics.snapshot_rows.labels(table).inc(rows)
            metrics.events.labels(table, Op.READ.value).inc(rows)
    if result.skipped:
        log.warning("spark snapshot: %d rows skipped (--on-error=log)", result.skipped)
    return result.rows


def _tombstone(
    publisher: KafkaPublisher,
    *,
    spec: SnapshotSpec,
    tables: Sequence[CatalogTable],
    gone: Mapping[int, set[bytes]],
    topic_prefix: str | None,
    metrics: WorkerMetrics | None,
) -> None:
    """The gone keys' tombstones, acknowledged before the stream starts (or the snapshot fails)."""
    if not gone:
        return
    failures: list[str] = []

    def on_delivery(table: str) -> DeliveryCallback:
        def report(error: KafkaError | None, message: Message) -> None:
            if error is not None:
                failures.append(f"a tombstone of {table} not delivered to {message.topic()}: {error.str()}")

        return report

    publish_tombstones(
        publisher,
        spec=spec,
        tables=tables,
        gone=gone,
        topic_prefix=topic_prefix,
        on_delivery=on_delivery,
        metrics=metrics,
    )
    missing = publisher.flush(TASK_FLUSH_TIMEOUT_S)
    if failures or missing:
        late = f"{missing} tombstones undelivered after {TASK_FLUSH_TIMEOUT_S:.0f}s"
        raise SnapshotFailed(
            f"the Spark snapshot failed, so its slot is dropped: {failures[0] if failures else late}; "
            "check Kafka and start the worker again"
        )


def _running_spark_context() -> str | None:
    """The master of the SparkContext this process already runs, if any."""
    from pyspark import SparkContext

    running = SparkContext._active_spark_context
    return None if running is None else str(running.master)


def stop_spark(spark: Any) -> None:
    """Stop the session and the driver's JVM with it: `SparkSession.stop` leaves the JVM that
    pyspark launched running (about 300 MB), which the worker, streaming for weeks, does not need.
    Resetting the gateway is what pyspark's own tests do between sessions."""
    from pyspark import SparkContext

    spark.stop()
    gateway = SparkContext._gateway
    if gateway is None:
        return
    process = getattr(gateway, "proc", None)  # None under spark-submit, whose JVM is not ours
    gateway.shutdown()
    SparkContext._gateway = None
    SparkContext._jvm = None
    if process is not None:
        process.terminate()
        process.wait(JVM_EXIT_WAIT_S)
