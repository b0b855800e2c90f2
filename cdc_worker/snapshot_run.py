"""The worker's snapshot phase: every table read once and published (`SnapshotRun.read`, by the
COPY readers or Spark), and under `--delivery exactly-once` a snapshot a killed worker left half
done finished from where Kafka says it stopped (`SnapshotRun.finish`).

Under exactly-once each table of the snapshot is a Kafka transaction that records the LSN the
table was read at (`shell.snapshot.table_commits`). A killed worker leaves its slot, still at the
snapshot's point S. The next start reads which tables Kafka holds, and as of which point; it reads
the others at a new exported snapshot (a temporary slot's, at point P > S) and publishes them the
same way. The stream then starts from S: a table read at S gets every change from there, and a
table read at P only those committed from P on (`AlreadyInKafka`'s table points drop the others,
which its rows show already). Killed again, the next start does the same with the tables still
missing. No row is visible twice to a `read_committed` consumer, and none is missing.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from datetime import UTC, datetime

import psycopg2
import psycopg2.extensions

from cdc_worker.config import WorkerConfig
from cdc_worker.core.encoding.avro_serializer import AvroEventSerializer
from cdc_worker.core.encoding.json_serializer import JsonEventSerializer
from cdc_worker.core.lsn import format_lsn
from cdc_worker.core.model import TypeInfo
from cdc_worker.shell.kafka_publisher import KafkaPublisher
from cdc_worker.shell.metrics import WorkerMetrics
from cdc_worker.shell.postgres import catalog as postgres
from cdc_worker.shell.postgres import slot, standby
from cdc_worker.shell.postgres.catalog import CatalogTable
from cdc_worker.shell.postgres.slot import CreatedSlot
from cdc_worker.shell.snapshot.reader import SnapshotReader, SnapshotSpec
from cdc_worker.shell.snapshot.spark_engine import run_spark_snapshot
from cdc_worker.shell.snapshot.table_commits import (
    fence_readers,
    forget_points,
    read_points,
    readers_recorded,
    record_readers,
)
from cdc_worker.shell.stream import resnapshot_reader as incremental_reader
from cdc_worker.startup import Startup
from kafka_contract.topics import control_topic_name, topic_name

log = logging.getLogger(__name__)

Serializer = AvroEventSerializer | JsonEventSerializer


class SnapshotRun:
    """The snapshot phase of one worker run. `tid`: the slot's transactional id under exactly-once
    (each table then one Kafka transaction), else None."""

    def __init__(
        self,
        config: WorkerConfig,
        publisher: KafkaPublisher,
        *,
        serializer_factory: Callable[[], Serializer],
        metrics: WorkerMetrics,
        stop: threading.Event,
        native_codec: bool,
        native_producer: bool,
        tid: str | None,
    ) -> None:
        self.config = config
        self.publisher = publisher
        self.serializer_factory = serializer_factory
        self.metrics = metrics
        self.stop = stop
        self.native_codec = native_codec
        self.native_producer = native_producer
        self.tid = tid

    def spec(self, created: CreatedSlot) -> SnapshotSpec:
        return SnapshotSpec(
            self.config.postgres,
            created.snapshot_name,
            created.consistent_lsn,
            datetime.now(UTC),
            native_codec=self.native_codec,
            native_producer=self.native_producer,
            transactional_id=self.tid,
        )

    def reset_points(self) -> None:
        """Before a new slot's snapshot under exactly-once: an earlier slot's points are not its;
        and how many readers this one may start, which a start finishing it fences."""
        if self.tid is not None:
            forget_points(self.publisher, self.tid)
            record_readers(self.publisher, self.tid, self._control_topic, self.config.snapshot_workers)

    @property
    def _control_topic(self) -> str:
        return control_topic_name(self.config.topic_prefix)

    def read(
        self, spec: SnapshotSpec, tables: Sequence[CatalogTable], type_infos: dict[int, TypeInfo]
    ) -> None:
        """Read and publish `tables` as of `spec`'s exported snapshot; raises `SnapshotStopped`."""
        config = self.config
        if config.snapshot_engine == "spark":
            # The replication connection stays idle in its exported snapshot meanwhile.
            run_spark_snapshot(
                spec=spec,
                tables=tables,
                serializer=self.serializer_factory(),
                type_infos=type_infos,
                publisher=self.publisher,
                policy=config.on_error,
                master=config.spark_master,
                client_id=f"bottledwater-{config.slot}-snapshot",
                stop=self.stop,
                metrics=self.metrics,
            )
            return
        SnapshotReader(
            spec=spec,
            tables=tables,
            workers=config.snapshot_workers,
            publisher=self.publisher,
            # A picklable factory (a partial of a module-level function): processes receive it.
            serializer_factory=self.serializer_factory,
            policy=config.on_error,
            metrics=self.metrics,
            stop=self.stop,
            topic_prefix=config.topic_prefix,
            log_settings=(config.log_format, config.log_level),
        ).run()

    def points(self, tables: Sequence[CatalogTable], since: int) -> dict[int, int]:
        """Per table (oid) read after `since` (the slot's snapshot point), the LSN it was read at;
        the stream drops that table's changes committed before it. Empty at-least-once."""
        if self.tid is None:
            return {}
        topics, found = self._held(tables, since)
        return _after(topics, found, since)

    def _held(
        self, tables: Sequence[CatalogTable], since: int
    ) -> tuple[dict[str, CatalogTable], dict[str, int]]:
        """The tables by topic, and the points Kafka holds for the slot at `since` by topic."""
        assert self.tid is not None
        topics = {topic_name(t.schema, self.config.topic_prefix): t for t in tables}
        return topics, read_points(self.publisher, self.tid, list(topics), since)

    def _fence_readers(self) -> None:
        """Fence the ids of every reader a killed start may have had: as many as recorded, or as
        this start may start, recording the larger for a start that finishes after this one."""
        assert self.tid is not None
        recorded = readers_recorded(self.publisher, self.tid, self._control_topic)
        workers = self.config.snapshot_workers
        if workers > recorded:
            record_readers(self.publisher, self.tid, self._control_topic, workers)
        elif recorded > workers:
            log.info(
                "the stopped snapshot may have run %d readers (--snapshot-workers is %d now): fencing "
                "all %d readers' transactional ids",
                recorded,
                workers,
                recorded,
            )
        fence_readers(self.publisher, self.tid, max(recorded, workers))

    def finish(
        self, tables: Sequence[CatalogTable], since: int, type_infos: dict[int, TypeInfo]
    ) -> dict[int, int]:
        """The snapshot of the slot whose point is `since`, stopped before it completed: the tables
        Kafka does not hold read at a new exported snapshot, each in its transaction. Returns the
        points of the tables read after `since` (`points`)."""
        assert self.tid is not None
        config = self.config
        topics, held = self._held(tables, since)
        missing_topics = [name for name in topics if name not in held]
        missing = [topics[name] for name in missing_topics]
        log.info(
            "slot %s: its snapshot (at %s) stopped with %d of %d tables in Kafka; %s",
            config.slot,
            format_lsn(since),
            len(held),
            len(topics),
            f"reading the other {len(missing)} at a new snapshot" if missing else "none is missing",
        )
        if missing:
            self._fence_readers()
            repl = postgres.connect(config.postgres, replication=True)
            try:
                # A temporary slot only for its exported snapshot: it goes with the connection.
                created = standby.create_snapshot_slot(repl, config.slot, on_standby=False)
                log.info(
                    "reading %s as of %s (their changes before that are not published again)",
                    ", ".join(t.qualified_name for t in missing),
                    format_lsn(created.consistent_lsn),
                )
                self.read(self.spec(created), missing, type_infos)
            finally:
                repl.close()
            held.update(dict.fromkeys(missing_topics, created.consistent_lsn))
        return _after(topics, held, since)


def _after(topics: dict[str, CatalogTable], points: dict[str, int], since: int) -> dict[int, int]:
    """`points` by table oid, those after `since` only (the stream needs no others)."""
    return {topics[name].schema.oid: point for name, point in points.items() if point > since}


def ask_for_new_tables(conn: psycopg2.extensions.connection, config: WorkerConfig, startup: Startup) -> None:
    """A resumed slot takes no snapshot, so a table selected for the first time now would only
    be captured from now on: ask for its rows with a re-snapshot while streaming (it runs once
    the stream reaches the request, after the publication change that adds the table)."""
    published = startup.plan.main.table_oids | startup.plan.inserts.table_oids
    joining = [t for t in startup.tables if t.schema.oid not in published]
    possible = startup.facts.decodes_logical_messages
    keyed = [t for t in joining if t.schema.is_keyed and possible]
    for table in joining:
        if table not in keyed:
            why = "a re-snapshot while streaming needs a key" if possible else postgres.RESNAPSHOT_NEEDS
            log.warning(
                "table %s joins the publication of a resumed slot: only its changes from now on are "
                "published (%s); drop the slot (bottledwater slot drop) and start again for a full "
                "snapshot",
                table.qualified_name,
                why,
                extra={"table": table.qualified_name},
            )
    if keyed:
        request_id, _ = incremental_reader.request_resnapshot(
            conn, config.slot, [(t.schema.namespace, t.schema.name) for t in keyed]
        )
        log.info(
            "tables %s join the publication of a resumed slot: their rows are published by a "
            "re-snapshot while streaming (request %s)",
            ", ".join(t.qualified_name for t in keyed),
            request_id,
        )


def abandon_slot(
    conn: psycopg2.extensions.connection,
    repl: psycopg2.extensions.connection,
    config: WorkerConfig,
    *,
    on_standby: bool,
) -> None:
    """A snapshot that did not complete cannot be resumed (at-least-once): drop its slot and state.
    (On a standby its slot was temporary: closing the connection dropped it.)"""
    repl.close()
    if on_standby:
        return
    try:
        if slot.wait_for_slot_release(conn, config.slot) is not None:
            slot.drop_slot(conn, config.slot)
        slot.record_snapshot_state(conn, config.publication_name, config.slot, None)
        log.info("dropped slot %s after the incomplete snapshot", config.slot)
    except (psycopg2.Error, slot.SlotError) as exc:
        log.error(
            "could not drop slot %s after the incomplete snapshot (%s): drop it with "
            "bottledwater slot drop -s %s, or the next start will",
            config.slot,
            exc,
            config.slot,
        )
