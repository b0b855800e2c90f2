"""The snapshot under `--delivery exactly-once`: every table one Kafka transaction, and the LSN it
was read at recorded with it, so that a snapshot killed midway is finished without a row twice.

Each table is read whole by one reader (never cut into ranges: a table half visible could not be
finished from another snapshot without rows twice or missing) and published in a transaction of
its reader's producer (`transactional.id` `<slot's>-snapshot-<n>`, its native producer's
`…-<n>-native`). The same transaction commits,
as consumer group `<slot's>-snapshot`, the offset of partition 0 of the table's topic: the LSN the
table was read at. A `read_committed` consumer sees a table's snapshot all at once or not at all,
and the group's offsets say which tables are in Kafka and as of when (`read_points`).

The group's offset of partition 0 of the control topic is the most readers a start of the
snapshot had (`record_readers`). A worker killed during the snapshot keeps its slot
(`cdc_worker.snapshot_run.SnapshotRun.finish`): the next start fences that many readers' ids (what
killed readers left open is aborted), reads the tables without an offset at a new exported snapshot, and
the stream then drops each table's changes committed before its own point (its rows show them
already: `core.kafka_transactions.AlreadyInKafka`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from cdc_worker.shell.kafka_publisher import KafkaPublisher
from cdc_worker.shell.kafka_settings import admin_settings, producer_settings
from cdc_worker.shell.kafka_transactions import INIT_TIMEOUT_S, KafkaTransactions, TransactionsUnavailable
from kafka_contract.topics import SourceTable, snapshot_points_group, snapshot_transactional_id, topic_name

log = logging.getLogger(__name__)

POINTS_TIMEOUT_S = 30.0
COORDINATOR_RETRY_S = 0.2
TABLE_TRANSACTION_TIMEOUT_MS = 900_000


class TableCommits:
    """One reader's transactions, on each of its producers: `table_done(table, native)` once a
    table's rows were produced (by the native producer or by confluent-kafka's)."""

    def __init__(
        self,
        confluent: KafkaTransactions,
        native: KafkaTransactions | None,
        point: int,
        topic_prefix: str | None,
    ) -> None:
        self.confluent = confluent
        self.native = native
        self.point = point
        self.topic_prefix = topic_prefix

    def table_done(self, table: SourceTable, *, native: bool) -> None:
        """Commit the table's rows with its point (`restart`: every table records the same LSN),
        in the transaction of the producer they went through (the other one's is empty)."""
        transactions = self.native if native and self.native is not None else self.confluent
        transactions.commit(self.point, restart=True, topic=topic_name(table, self.topic_prefix))

    def abandon(self) -> None:
        """The reader ends: a table it read without committing (a stop, a failure) is aborted now,
        not left open until the coordinator's timeout, blocking `read_committed` consumers."""
        for transactions in (self.confluent, self.native):
            if transactions is not None:
                transactions.abort(begin_next=False)


def open_reader_publisher(
    broker: str,
    kafka_config: Mapping[str, str],
    topic_config: Mapping[str, str],
    client_id: str,
    *,
    native_producer: bool,
    tid: str | None,
    point: int,
    reader: int,
    topic_prefix: str | None,
) -> tuple[KafkaPublisher, TableCommits | None]:
    """A snapshot reader's publisher; under exactly-once (`tid`: the slot's transactional id) its
    producers are transactional (confluent-kafka's, and the native one when asked for and it can be
    built, each with its transactional id), fencing the same reader of a killed worker (whose open
    transactions are aborted). A table's rows all go through one of them (`ChunkReader.used_native`
    says which)."""
    if tid is not None:
        # A table's transaction stays open while the table is read: as long as the brokers allow
        # by default (transaction.max.timeout.ms), not librdkafka's minute.
        kafka_config = {"transaction.timeout.ms": str(TABLE_TRANSACTION_TIMEOUT_MS), **kafka_config}
    publisher = KafkaPublisher(broker, kafka_config, topic_config, client_id=client_id)
    publisher.open(native_producer=native_producer)
    if tid is None:
        return publisher, None
    group = snapshot_points_group(tid)
    confluent = publisher.open_transactions(
        snapshot_transactional_id(tid, reader), "", group_id=group, native=False, announce=False
    )  # every commit names its table's topic
    native = None
    if publisher.native is not None:
        native = publisher.open_transactions(
            snapshot_transactional_id(tid, reader, native=True),
            "",
            group_id=group,
            native=True,
            announce=False,
        )
    publisher.use_transactions()
    return publisher, TableCommits(confluent, native, point, topic_prefix)


def fence_readers(publisher: KafkaPublisher, tid: str, readers: int) -> None:
    """Abort what the readers of a killed worker left open: those of the next snapshot fence their
    own ids, but it may start fewer (`readers`: as many as either may have started)."""
    settings = producer_settings(publisher.broker, publisher.kafka_config, publisher.client_id)
    for reader in range(readers):
        for native in (False, True):
            tid_n = snapshot_transactional_id(tid, reader, native=native)
            try:
                Producer({**settings, "transactional.id": tid_n}).init_transactions(INIT_TIMEOUT_S)
            except KafkaException as exc:
                raise TransactionsUnavailable(
                    f"cannot start transactional.id {tid_n} on {publisher.broker} ({exc}): grant the "
                    "worker's principal WRITE and DESCRIBE on it, or run with --delivery at-least-once"
                ) from None


def record_readers(publisher: KafkaPublisher, tid: str, control_topic: str, readers: int) -> None:
    """Record how many readers a snapshot of this slot may have started, as group
    `<slot's>-snapshot`'s offset of partition 0 of the control topic: a later start that finishes
    it with fewer (`--snapshot-workers` lowered) still fences them all (`readers_recorded`)."""
    consumer = _points_consumer(publisher, tid)
    try:
        consumer.commit(offsets=[TopicPartition(control_topic, 0, readers)], asynchronous=False)
    except KafkaException as exc:
        raise TransactionsUnavailable(
            f"cannot record the snapshot's readers in consumer group {snapshot_points_group(tid)} on "
            f"{publisher.broker} ({exc}): grant the worker's principal READ on that group, or run with "
            "--delivery at-least-once"
        ) from None
    finally:
        consumer.close()


def readers_recorded(publisher: KafkaPublisher, tid: str, control_topic: str) -> int:
    """The readers `record_readers` recorded for the slot's snapshot (0: none)."""
    return read_points(publisher, tid, [control_topic], 1).get(control_topic, 0)


def _points_consumer(publisher: KafkaPublisher, tid: str) -> Consumer:
    return Consumer(
        {
            **admin_settings(publisher.broker, publisher.kafka_config),
            "group.id": snapshot_points_group(tid),
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )


def read_points(publisher: KafkaPublisher, tid: str, topics: Sequence[str], since: int) -> dict[str, int]:
    """Per topic, the LSN its table's exactly-once snapshot was read at, for the snapshots of the
    slot whose point is `since` (an older slot's offsets are behind it); topics without one left
    out. Unreadable: `TransactionsUnavailable` in one line."""
    if not topics:
        return {}
    consumer = _points_consumer(publisher, tid)
    try:
        found = consumer.committed([TopicPartition(topic, 0) for topic in topics], timeout=POINTS_TIMEOUT_S)
    except KafkaException as exc:
        raise TransactionsUnavailable(
            f"cannot read the snapshot's points (consumer group {snapshot_points_group(tid)}) on "
            f"{publisher.broker} ({exc}): grant the worker's principal READ on that group, or run with "
            "--delivery at-least-once"
        ) from None
    finally:
        consumer.close()
    return {
        tp.topic: tp.offset
        for tp in found
        if tp.offset is not None and tp.offset >= since and tp.error is None
    }


def forget_points(publisher: KafkaPublisher, tid: str) -> None:
    """Before a new slot's snapshot: delete the points an earlier slot of this name left (LSNs of
    another server could pass for this one's). A coordinator still loading (a cluster's first
    consumer group makes `__consumer_offsets`) is asked again for up to POINTS_TIMEOUT_S."""
    group = snapshot_points_group(tid)
    deadline = time.monotonic() + POINTS_TIMEOUT_S
    while True:
        futures = publisher.admin.delete_consumer_groups([group], request_timeout=POINTS_TIMEOUT_S)
        try:
            futures[group].result(timeout=POINTS_TIMEOUT_S)
            log.info("deleted consumer group %s: the points of an earlier slot's snapshot", group)
            return
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            code = error.code() if isinstance(error, KafkaError) else None
            if code == KafkaError.GROUP_ID_NOT_FOUND:
                return
            if code in _COORDINATOR_MOVING and time.monotonic() < deadline:
                time.sleep(COORDINATOR_RETRY_S)
                continue
            fix = (
                "grant the worker's principal DELETE on it"
                if code == KafkaError.GROUP_AUTHORIZATION_FAILED
                else "check that the brokers' group coordinator is up"
            )
            raise TransactionsUnavailable(
                f"cannot delete consumer group {group} (the points of an earlier snapshot of this slot) "
                f"on {publisher.broker} ({exc}): {fix}, or delete it with kafka-consumer-groups --delete"
            ) from None


# The group coordinator answers these while it is elected or loads `__consumer_offsets`.
_COORDINATOR_MOVING = frozenset(
    {
        KafkaError.NOT_COORDINATOR,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    }
)
