"""Reading the worker's topics back: the keys a compacted topic holds (a snapshot taken again
over topics that already hold data tombstones the keys it no longer finds), and partition offsets
that tolerate a topic created a moment ago."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

from cdc_worker.shell.kafka_publisher import ADMIN_TIMEOUT_S, KafkaPublisher, KafkaUnavailable
from cdc_worker.shell.kafka_settings import admin_settings

log = logging.getLogger(__name__)

RECONCILE_BATCH = 10_000
RECONCILE_POLL_S = 1.0
RECONCILE_LOG_S = 30.0  # how often a long read of a topic's keys says how far it is


def live_keys(publisher: KafkaPublisher, topic: str, timeout: float = ADMIN_TIMEOUT_S) -> set[bytes]:
    """The keys a compacted reading of `topic` holds now (last message per key not a tombstone).

    A snapshot taken again over topics that already hold data (after an interrupted snapshot,
    or a dropped slot) must tombstone the keys it no longer finds, or rows deleted in between
    would live on in the compacted topics; this reads what is there to compare against.

    `timeout` bounds each metadata request and each stretch without progress, not the whole
    read: a large topic takes as long as it takes, as long as messages keep arriving.
    """
    consumer = Consumer(
        {
            **admin_settings(publisher.broker, publisher.kafka_config),
            "group.id": f"{publisher.client_id}-reconcile",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            # Only what a transaction committed (--delivery exactly-once); the partition's end
            # then comes as an EOF event, the last offsets being commit markers no message has.
            "isolation.level": "read_committed",
        }
    )
    try:
        metadata = consumer.list_topics(topic, timeout=timeout).topics.get(topic)
        if metadata is None or metadata.error is not None:
            return set()
        ends = {}
        for partition in metadata.partitions:
            low, high = watermark_offsets(consumer, topic, partition, timeout, broker=publisher.broker)
            if high > low:
                ends[partition] = high
        if not ends:
            return set()
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in ends])
        return read_live_keys(consumer, topic, ends, timeout, broker=publisher.broker)
    finally:
        consumer.close()


LEADER_RETRY_S = 0.2
_LEADERLESS_CODES = frozenset(
    {
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        # The broker asked went away meanwhile (killed, restarting, its leadership moving): the
        # retry asks the partition's new leader.
        KafkaError._TRANSPORT,
        KafkaError._DESTROY_BROKER,
    }
)


def watermark_offsets(
    consumer: Any,
    topic: str,
    partition: int,
    timeout: float,
    *,
    broker: str,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[int, int]:
    """(low, high) offsets of one partition. A topic created a moment ago may not have a leader for
    every partition yet (NOT_LEADER_FOR_PARTITION, LEADER_NOT_AVAILABLE), and a leader may fail
    while asked: retried for `timeout`."""
    deadline = clock() + timeout
    while True:
        try:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=timeout)
            return int(low), int(high)
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            # By code too: librdkafka does not always flag these errors as retriable.
            retriable = isinstance(error, KafkaError) and (
                error.retriable() or error.code() in _LEADERLESS_CODES
            )
            if not retriable or clock() >= deadline:
                raise KafkaUnavailable(
                    f"cannot read the offsets of topic {topic} partition {partition} ({error}): check that "
                    f"its brokers at {broker} are up and lead it, then start the worker again"
                ) from exc
            sleep(LEADER_RETRY_S)


def read_live_keys(
    consumer: Consumer,
    topic: str,
    ends: Mapping[int, int],
    timeout: float,
    *,
    broker: str,
    clock: Callable[[], float] = time.monotonic,
) -> set[bytes]:
    """Consume `topic` (already assigned from its beginning) up to the end offsets `ends`
    (partition -> high watermark) and return the keys whose last message is not a tombstone.

    `timeout` is a no-progress limit: reading fails only when nothing at all (no message, no
    end-of-partition event) has arrived for `timeout` seconds while some partition is not read
    to its end. However long the whole read takes does not matter."""
    live: set[bytes] = set()
    remaining = set(ends)
    read = 0
    started = last_progress = last_log = clock()
    while remaining:
        messages = consumer.consume(RECONCILE_BATCH, min(RECONCILE_POLL_S, timeout))
        now = clock()
        if messages:
            last_progress = now
        elif now - last_progress > timeout:
            positions = ", ".join(f"{p} (end offset {ends[p]})" for p in sorted(remaining))
            raise KafkaUnavailable(
                f"reading topic {topic} to compare its keys made no progress for {timeout:.0f}s "
                f"after {read} messages, partitions {positions} not read to their end: check that "
                f"the brokers leading them at {broker} are up and that -C lets this client read "
                "the topic, then start the worker again"
            )
        for message in messages:
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    remaining.discard(message.partition())
                    continue
                raise KafkaUnavailable(f"reading topic {topic}: {error}")
            read += 1
            key = message.key()
            if key is not None:
                if message.value() is None:
                    live.discard(key)
                else:
                    live.add(key)
            offset, partition = message.offset(), message.partition()
            if offset is not None and partition is not None and offset + 1 >= ends[partition]:
                remaining.discard(partition)
        if remaining and now - last_log >= RECONCILE_LOG_S:
            last_log = now
            log.info(
                "reading the keys of topic %s: %d messages in %.0fs, %d partitions to go",
                topic,
                read,
                now - started,
                len(remaining),
                extra={"topic": topic},
            )
    return live
