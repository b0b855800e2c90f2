"""The worker's progress events on the control topic: how far Kafka holds every transaction.

After Kafka acknowledged every message of every transaction committed at or before LSN L (the
session acknowledged L to Postgres: `note_acked`), this publishes `progress` (kafka_contract.control)
with L and, for every partition of the worker's topics, an offset bound taken AFTER that: Kafka's high
watermark, which acks=all only lets pass a message once it acknowledged it, and which only grows. So
every message of those transactions lies below the bound, the ones a previous worker wrote included
(they were in the log before). A partition not listed held nothing (the listing is taken after L too).
The merge proves a table's watermark from these (spark_jobs/rules/watermark.py, docs/lakehouse.md).

The Kafka round trips (metadata, list offsets) run on a thread of their own, never on the streaming
thread; the event is encoded and produced on the streaming thread (`publish_ready`, from the session's
tick), where the serializer and the producer's batches live. Each second while L moves, and every
`idle_interval` seconds while it does not, so that a merge that restarted (it keeps unproven events
in memory only) finds a recent one, and so that the lake can tell an idle source from a stalled one:
an event that repeats L later says that Postgres still had nothing newer then, and the lake's lag
stays about `idle_interval` on a quiet database (docs/lakehouse.md). So a repeat goes out only when
the session is `caught_up` (no transaction open, buffered or spooled, and the server's WAL end from
its last keepalive acknowledged): while a large transaction is still arriving, L repeated would
claim a freshness the lake does not have.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime

from confluent_kafka import IsolationLevel, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._listoffsets import OffsetSpec  # not re-exported with its types

from cdc_worker.core.encoding.serializers import EncodedMessage
from cdc_worker.core.errors import RegistryUnavailable
from cdc_worker.shell.kafka_publisher import KafkaPublisher
from kafka_contract.topics import control_topic_name

log = logging.getLogger(__name__)

INTERVAL_S = 1.0
IDLE_INTERVAL_S = 30.0
ADMIN_TIMEOUT_S = 10.0
# Kafka's and the registry's own topics, never the worker's.
_INTERNAL_TOPIC = re.compile(r"^(__|_schemas$|_confluent)")

Offsets = Mapping[tuple[str, int], int]
Encode = Callable[[int, datetime, Offsets], EncodedMessage]


def worker_topics(names: Iterable[str], prefix: str | None, control_topic: str) -> list[str]:
    """The topics a progress event bounds: with a topic prefix, those under it (the control topic is
    one); without, every topic but Kafka's internal ones (a shared cluster: use a prefix, or the
    events list every topic of the cluster)."""
    chosen = {control_topic}
    for name in names:
        if prefix:
            if name.startswith(prefix + "."):
                chosen.add(name)
        elif not _INTERNAL_TOPIC.match(name):
            chosen.add(name)
    return sorted(chosen)


def due(
    acked: int, published: int | None, since_published: float, interval: float, idle_interval: float
) -> bool:
    """Publish when the acknowledged LSN moved (at most every `interval`), or after `idle_interval`."""
    if published is None:
        return acked > 0
    if acked > published:
        return since_published >= interval
    return since_published >= idle_interval


def high_watermarks(
    admin: AdminClient, prefix: str | None, control_topic: str, known: Iterable[str] = ()
) -> dict[tuple[str, int], int]:
    """The high watermark of every partition of the worker's topics (`worker_topics`, plus `known`:
    the topics it created, listed even if the broker asked has not seen their metadata yet).
    read_uncommitted: the high watermark bounds every message acknowledged. Under exactly-once it may
    lie past messages of the open Kafka transaction; a read_committed reader reaches it once that
    transaction commits, which it does before the progress event made from it can be read."""
    metadata = admin.list_topics(timeout=ADMIN_TIMEOUT_S)
    partitions: list[TopicPartition] = []
    for topic in dict.fromkeys([*worker_topics(metadata.topics, prefix, control_topic), *known]):
        described = metadata.topics.get(topic)
        if described is None or described.error is not None:
            continue  # not there yet: it holds nothing acknowledged
        partitions += [TopicPartition(topic, p) for p in described.partitions]
    if not partitions:
        return {}
    futures = admin.list_offsets(
        {tp: OffsetSpec.latest() for tp in partitions},  # type: ignore[no-untyped-call]
        isolation_level=IsolationLevel.READ_UNCOMMITTED,
        request_timeout=ADMIN_TIMEOUT_S,
    )
    return {(tp.topic, tp.partition): int(f.result().offset) for tp, f in futures.items()}


class ProgressPublisher:
    """Progress events for one stream session. The session calls `note_acked` after each status
    update and `publish_ready` from its tick; `start` and `stop` run the listing thread."""

    def __init__(
        self,
        admin: AdminClient,
        encode: Encode,
        produce: Callable[[EncodedMessage], None],
        *,
        topic_prefix: str | None,
        control_topic: str,
        known_topics: Callable[[], Iterable[str]] = tuple,
        interval: float = INTERVAL_S,
        idle_interval: float = IDLE_INTERVAL_S,
        caught_up: Callable[[], bool] = lambda: True,
    ) -> None:
        self._admin = admin
        self._encode = encode
        self._produce = produce
        self._prefix = topic_prefix
        self._control_topic = control_topic
        self._known_topics = known_topics
        self.interval = interval
        self.idle_interval = idle_interval
        self._caught_up = caught_up
        self._published_lsn: int | None = None
        self._acked = 0
        self._ready: tuple[int, datetime, dict[tuple[str, int], int]] | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.published = 0

    def note_acked(self, lsn: int) -> None:
        """The session acknowledged `lsn` to Postgres: Kafka holds every transaction before it."""
        self._acked = max(self._acked, lsn)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="bw-progress", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(ADMIN_TIMEOUT_S + 1)

    def prepare(self) -> None:
        """Take the offsets for the acknowledged position as of now (the listing thread's step)."""
        # The position first, then the offsets: whatever was acknowledged lies below them.
        flush_lsn = self._acked
        if flush_lsn <= 0:
            return
        offsets = high_watermarks(self._admin, self._prefix, self._control_topic, self._known_topics())
        # The flush LSN is the end of the last acknowledged transaction's commit record: every
        # transaction committed before it (at or before flush_lsn - 1) is in Kafka.
        with self._lock:
            self._ready = (flush_lsn - 1, datetime.now(UTC), offsets)

    def publish_ready(self) -> None:
        """Produce the prepared event, if any (the streaming thread's step); one that repeats the
        position last published only while the session is caught up (see the module's docstring)."""
        with self._lock:
            ready, self._ready = self._ready, None
        if ready is None:
            return
        if ready[0] == self._published_lsn and not self._caught_up():
            return  # the next idle round tries again
        try:
            message = self._encode(*ready)
        except RegistryUnavailable as exc:
            # Not data: the merge's watermark only waits for the next event. (The registry down
            # at the first event, for the control topic's schemas, stopped the worker.)
            log.warning("progress event not published: %s; the next one tries again", exc)
            return
        self._produce(message)
        self._published_lsn = ready[0]
        self.published += 1

    def _run(self) -> None:
        published: int | None = None
        published_at = 0.0
        while not self._stop.wait(min(self.interval, self.idle_interval)):
            acked = self._acked
            if not due(acked, published, time.monotonic() - published_at, self.interval, self.idle_interval):
                continue
            try:
                self.prepare()
            except KafkaException as exc:  # the next round tries again; the merge only waits longer
                log.warning("progress event not published: %s", exc.args[0] if exc.args else exc)
                continue
            published, published_at = acked, time.monotonic()


def progress_publisher(
    publisher: KafkaPublisher,
    encode: Encode,
    produce_untracked: Callable[[EncodedMessage, str], None],
    topic_prefix: str | None,
    *,
    caught_up: Callable[[], bool],
    idle_interval: float,
) -> ProgressPublisher:
    """The progress events of a stream session: through its producer, untracked (an event lost is
    replaced by the next one), bounding the worker's topics and the ones it created."""
    return ProgressPublisher(
        publisher.admin,
        encode,
        lambda message: produce_untracked(message, "progress event"),
        topic_prefix=topic_prefix,
        control_topic=control_topic_name(topic_prefix),
        known_topics=lambda: publisher.known_topics,
        idle_interval=idle_interval,
        caught_up=caught_up,
    )
