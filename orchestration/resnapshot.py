"""snapshot_export for a slot that already streams: ask the running worker for a re-snapshot of
chosen tables (`cdc_worker.core.incremental`), then follow its reports on the control topic until every
table is done, logging rows, rows/s and an ETA."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import TopicPartition

from cdc_worker.shell.postgres import catalog as pg
from cdc_worker.shell.stream.resnapshot_reader import request_resnapshot
from kafka_contract.control import (
    SNAPSHOT_DONE,
    SNAPSHOT_FAILED,
    SNAPSHOT_OPS,
    SNAPSHOT_PROGRESS,
    ControlDecoder,
)
from kafka_contract.topics import control_topic_name
from orchestration.resources import KafkaResource, PostgresResource, SchemaRegistryResource

POLL_S = 1.0
LOG_EVERY_S = 10.0
METADATA_TIMEOUT_S = 10.0


class ResnapshotFailed(RuntimeError):
    """The re-snapshot cannot be asked for, or did not finish; the message says what to do."""


def choose_tables(postgres: PostgresResource, patterns: Sequence[str]) -> list[pg.CatalogTable]:
    """The captured tables matching `patterns` (all captured tables when empty), each with a key."""
    with postgres.connect() as conn:
        if not pg.server_facts(conn).decodes_logical_messages:
            raise ResnapshotFailed(f"cannot re-snapshot: {pg.RESNAPSHOT_NEEDS}")
        captured = pg.load_tables(conn, postgres.tables)
        chosen_oids = {t.schema.oid for t in pg.load_tables(conn, patterns)} if patterns else None
    chosen = [t for t in captured if chosen_oids is None or t.schema.oid in chosen_oids]
    if not chosen:
        raise ResnapshotFailed(
            f"no captured table matches {', '.join(patterns)}: give schema.table globs among the "
            "tables of the worker's selection"
        )
    unkeyed = [t.qualified_name for t in chosen if not t.schema.is_keyed]
    if unkeyed:
        raise ResnapshotFailed(
            f"cannot re-snapshot {', '.join(unkeyed)} while streaming: no primary key or replica identity "
            "index (add one, or run drop_slot and materialize replication_slot for a full snapshot)"
        )
    return chosen


@dataclass
class TableProgress:
    name: str
    estimated_rows: int
    rows: int = 0
    state: str = "waiting"  # waiting, reading, done, failed
    reason: str | None = None
    started: float | None = None

    def line(self, now: float) -> str:
        if self.state in ("done", "failed"):
            return f"{self.name}: {self.state}, {self.rows} rows" + (
                f" ({self.reason})" if self.reason else ""
            )
        if self.started is None:
            return f"{self.name}: waiting"
        rate = self.rows / max(now - self.started, 1e-6)
        eta = ""
        if self.estimated_rows > self.rows and rate > 0:
            eta = f", ETA {(self.estimated_rows - self.rows) / rate:.0f}s"
        return (
            f"{self.name}: {self.rows} of ~{max(self.estimated_rows, self.rows)} rows, {rate:.0f} rows/s{eta}"
        )


@dataclass
class ResnapshotOutcome:
    request_id: str
    request_lsn: int
    tables: dict[str, TableProgress] = field(default_factory=dict)

    @property
    def failed(self) -> list[TableProgress]:
        return [t for t in self.tables.values() if t.state == "failed"]


class ControlReports:
    """Reads the control topic from its end as of construction (before the request is written)."""

    def __init__(self, kafka: KafkaResource, registry: SchemaRegistryResource) -> None:
        self.topic = control_topic_name(kafka.topic_prefix)
        self.consumer = kafka.consumer("bottledwater-dagster-resnapshot")
        described = self.consumer.list_topics(self.topic, timeout=METADATA_TIMEOUT_S).topics.get(self.topic)
        if described is None or described.error is not None:
            self.consumer.close()
            raise ResnapshotFailed(
                f"control topic {self.topic} does not exist: has a worker ever run with this topic prefix?"
            )
        # Concrete offsets, looked up now: OFFSET_END would be resolved later, after the request is
        # written, and a small table's reports could already be behind it.
        starts = []
        for partition in described.partitions:
            _, end = self.consumer.get_watermark_offsets(
                TopicPartition(self.topic, partition), timeout=METADATA_TIMEOUT_S, cached=False
            )
            starts.append(TopicPartition(self.topic, partition, end))
        self.consumer.assign(starts)
        # Decoded with the writer schema by id: confluent-kafka's AvroDeserializer also asks the
        # registry for "associations", an API Apicurio lacks (and once hung on).
        client = None if kafka.message_format == "json" else registry.client()
        self._decode = ControlDecoder(
            kafka.message_format,
            None if client is None else lambda schema_id: client.get_schema(schema_id).schema_str,
        )

    def poll(self, timeout: float) -> list[dict[str, Any]]:
        reports = []
        for message in self.consumer.consume(num_messages=500, timeout=timeout):
            value = message.value()
            if message.error() is not None or value is None:
                continue
            try:
                record = self._decode(value)
            except Exception as exc:  # the registry unreachable, or a message not ours
                raise ResnapshotFailed(
                    f"cannot decode a message of {self.topic} at offset {message.offset()} ({exc}): check "
                    "the schema registry and the message format (BOTTLEDWATER_OUTPUT_FORMAT)"
                ) from exc
            if record.get("op") in SNAPSHOT_OPS:
                reports.append(record)
        return reports

    def close(self) -> None:
        self.consumer.close()


def run_resnapshot(
    postgres: PostgresResource,
    kafka: KafkaResource,
    registry: SchemaRegistryResource,
    tables: Sequence[pg.CatalogTable],
    *,
    progress_timeout_s: float,
    log: Callable[[str], object],
) -> ResnapshotOutcome:
    """Ask for the re-snapshot and wait until every table is done or failed; ResnapshotFailed when
    the worker reports nothing for `progress_timeout_s`."""
    reports = ControlReports(kafka, registry)
    try:
        with postgres.connect() as conn:
            request_id, lsn = request_resnapshot(
                conn, postgres.slot, [(t.schema.namespace, t.schema.name) for t in tables]
            )
        outcome = ResnapshotOutcome(request_id, lsn)
        for table in tables:
            outcome.tables[table.qualified_name] = TableProgress(
                table.qualified_name, max(table.estimated_rows, 0)
            )
        _follow(outcome, reports, progress_timeout_s, log)
        return outcome
    finally:
        reports.close()


def _follow(
    outcome: ResnapshotOutcome, reports: ControlReports, timeout: float, log: Callable[[str], object]
) -> None:
    last_news = last_log = time.monotonic()
    pending = set(outcome.tables)
    busy_with: set[str] = set()  # other requests the worker reported on meanwhile
    while pending:
        news = False
        for report in reports.poll(POLL_S):
            news = True  # any report shows the worker at work, perhaps on requests queued before
            if report.get("snapshot_id") != outcome.request_id:
                busy_with.add(f"{report.get('schema')}.{report.get('table')}")
                continue
            name = f"{report['schema']}.{report['table']}"
            table = outcome.tables.get(name)
            if table is None:
                continue
            table.started = table.started or time.monotonic()
            table.rows = int(report.get("rows") or 0)
            if report["op"] == SNAPSHOT_PROGRESS:
                table.state = "reading"
            elif report["op"] in (SNAPSHOT_DONE, SNAPSHOT_FAILED):
                table.state = "done" if report["op"] == SNAPSHOT_DONE else "failed"
                table.reason = report.get("reason")
                pending.discard(name)
                log(table.line(time.monotonic()))
        now = time.monotonic()
        if news:
            last_news = now
        if now - last_log >= LOG_EVERY_S and pending:
            last_log = now
            queued = (
                f" (the worker is re-snapshotting {', '.join(sorted(busy_with))} first)" if busy_with else ""
            )
            log("; ".join(outcome.tables[n].line(now) for n in sorted(pending)) + queued)
            busy_with.clear()
        if now - last_news > timeout:
            raise ResnapshotFailed(
                f"no report from the worker for {timeout:.0f}s (still to do: {', '.join(sorted(pending))}): "
                "is a worker streaming the slot (the cdc_worker job, started by the cdc_worker_supervisor "
                f"sensor)? Request {outcome.request_id} stays in the slot's WAL and runs when a worker "
                "streams; its progress is on the control topic"
            )
