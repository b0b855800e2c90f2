"""Everything the worker asks Kafka: topic creation (admin API) and producing with delivery reports.

The producer is idempotent with `acks=all`, so a delivery report without error means the message is
durable on every in-sync replica and will not be duplicated by the producer's own retries; only then
may the LSN it belongs to be acknowledged to Postgres. `murmur2_random` is the Java client's
partitioner, so every event of one key lands in the same partition as a Java producer would put it.

Messages larger than the producer's `message.max.bytes` are refused by `produce()` itself, and a
broker that allows less refuses them in the delivery report; both are data errors (`MessageTooLarge`
here, `MSG_SIZE_TOO_LARGE` there) that the caller handles under `--on-error`. The clients'
settings are `kafka_settings`'s.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, cast

from confluent_kafka import KafkaError, KafkaException, Message, Producer
from confluent_kafka.admin import AdminClient

from cdc_worker.core.encoding.native import NativeProducer, NativeProducerUnavailable, build_native_producer
from cdc_worker.core.encoding.serializers import EncodedMessage, Headers
from cdc_worker.core.errors import ConfigurationError, DataError, InfrastructureError
from cdc_worker.shell.kafka_settings import admin_settings, producer_settings

# TopicSpec and new_topic stay importable from here, where the worker's modules look for them.
from cdc_worker.shell.kafka_topic_specs import AUTHORIZATION_CODES, principal
from cdc_worker.shell.kafka_topic_specs import TopicSpec as TopicSpec  # noqa: PLC0414
from cdc_worker.shell.kafka_topic_specs import new_topic as new_topic  # noqa: PLC0414
from cdc_worker.shell.kafka_transactions import KafkaTransactions, start_transactions
from kafka_contract.redaction import redact_settings, redact_values

log = logging.getLogger(__name__)

ADMIN_TIMEOUT_S = 30.0
BACKPRESSURE_POLL_S = 0.05

DeliveryCallback = Callable[[KafkaError | None, Message], None]
# The native producer's failed deliveries of one batch, served at poll and flush points as
# confluent-kafka's callbacks are: (topic, librdkafka's reason, how many messages).
BatchFailures = Callable[[str, str, int], None]
# Its delivered messages of one batch, served at the same points (the stream's acknowledgement).
BatchDeliveries = Callable[[int], None]


class KafkaUnavailable(InfrastructureError, RuntimeError):
    """The brokers could not be reached or refused an admin request."""


class KafkaConnectionRefused(KafkaUnavailable):
    """The brokers answer but refuse the client: SASL authentication or the TLS handshake failed
    (a wrong password, an untrusted certificate, a host name the certificate does not name)."""


class KafkaNotAuthorized(ConfigurationError):
    """The brokers' ACLs refuse what the worker must do (create or write its topics)."""


class KafkaSettingsInvalid(ConfigurationError, ValueError):
    """librdkafka refused a -C setting (unknown name, bad value) when the clients were built."""


class MessageTooLarge(DataError, ValueError):
    """A message over `message.max.bytes`: a data error under `--on-error`."""


class KafkaPublisher:
    """One producer and one admin client; `open()` connects, `close()` flushes and lets go."""

    def __init__(
        self,
        broker: str,
        kafka_config: Mapping[str, str] | None = None,
        topic_config: Mapping[str, str] | None = None,
        *,
        client_id: str = "bottledwater",
    ) -> None:
        self.broker = broker
        self.kafka_config = dict(kafka_config or {})
        self.topic_config = dict(topic_config or {})
        self.client_id = client_id
        self._producer: Producer | None = None
        self._admin: AdminClient | None = None
        self._known_topics: set[str] = set()
        self.max_message_bytes = int(self.kafka_config.get("message.max.bytes", 1_000_000))
        self._native: NativeProducer | None = None
        self._batches: dict[int, BatchFailures] = {}
        self._batch_deliveries: dict[int, BatchDeliveries] = {}
        self._batch_ids = itertools.count(1)
        self._batch_lock = threading.Lock()
        self.producer_line = "producer: confluent-kafka"
        # The stream's transactional producers (confluent-kafka's, native), under exactly-once.
        self._transactional: tuple[Producer | None, NativeProducer | None] = (None, None)
        self.brokers: int | None = None  # in the cluster's metadata, at the last look
        # The admin client's last error of the kinds a wrong setting causes (SASL authentication, TLS
        # handshake), which a failed metadata request reports only as "transport failure".
        self._admin_refusal: str | None = None

    def open(self, *, native_producer: bool = False) -> None:
        """Build the clients (librdkafka connects in the background, so this does not wait for the
        brokers); raises `KafkaSettingsInvalid` when librdkafka refuses a setting.

        `native_producer`: also build the native codec's own librdkafka producer, with the same
        settings; when it cannot be built (no extension, a setting such as GSSAPI its librdkafka lacks),
        the confluent-kafka producer does all the work. `producer_line` says which, for the log."""
        log.debug("kafka settings %s", redact_settings(self.kafka_config))
        settings = producer_settings(self.broker, self.kafka_config, self.client_id)
        try:
            admin: dict[str, Any] = {
                **admin_settings(self.broker, self.kafka_config),
                "error_cb": self._admin_error,
            }
            self._admin = AdminClient(cast(dict[str, str | int | float | bool], admin))
            self._producer = Producer(settings)
        except KafkaException as exc:
            error = exc.args[0] if exc.args else exc
            reason = redact_values(
                error.str() if isinstance(error, KafkaError) else str(error), self.kafka_config
            )
            raise KafkaSettingsInvalid(
                f"-C/--kafka-config: librdkafka refuses the settings ({reason}): fix or remove that "
                "setting (bottledwater --config-help lists them)"
            ) from None
        if not native_producer:
            return
        try:
            self._native = build_native_producer(settings)
            self.producer_line = "producer: native (the codec's own librdkafka, batches produced from Rust)"
        except NativeProducerUnavailable as exc:
            self.producer_line = f"producer: confluent-kafka, the native producer cannot be used ({exc})"

    def open_transactions(
        self,
        tid: str,
        position_topic: str,
        group_id: str | None = None,
        *,
        native: bool | None = None,
        announce: bool = True,
    ) -> KafkaTransactions:
        """Exactly-once: a transactional producer (`start_transactions`; the native one if `native`,
        by default if there is one; positions as group `group_id`'s offsets, by default `tid`'s),
        initialised now (fencing `tid`'s earlier producers), used from `use_transactions` on."""
        transactions, (producer, native_producer) = start_transactions(
            {**producer_settings(self.broker, self.kafka_config, self.client_id), "transactional.id": tid},
            {**admin_settings(self.broker, self.kafka_config), "group.id": group_id or tid},
            native=self._native is not None if native is None else native,
            broker=self.broker,
            flush=self.flush,
            position_topic=position_topic,
            announce=announce,
        )
        self._transactional = (producer or self._transactional[0], native_producer or self._transactional[1])
        return transactions

    def use_transactions(self) -> None:
        """From now on the stream's messages go through the producer `open_transactions` made (the
        idempotent one it replaces has delivered everything: the snapshot flushed it)."""
        producer, native = self._transactional
        if producer is not None:
            self._producer = producer
        if native is not None:
            self._native = native

    @property
    def native(self) -> NativeProducer | None:
        """The native codec's producer, when `open(native_producer=True)` could build it."""
        return self._native

    def native_batch(self, on_failures: BatchFailures, on_delivered: BatchDeliveries | None = None) -> int:
        """A batch id for the native producer whose failed deliveries go to `on_failures` and, if
        given, whose delivered ones are counted to `on_delivered`; `release_batch` once no report
        can come any more."""
        with self._batch_lock:
            batch = next(self._batch_ids)
            self._batches[batch] = on_failures
            if on_delivered is not None:
                self._batch_deliveries[batch] = on_delivered
        return batch

    def release_batch(self, batch: int) -> None:
        with self._batch_lock:
            self._batches.pop(batch, None)
            self._batch_deliveries.pop(batch, None)

    def _serve_native(self) -> None:
        if self._native is None:
            return
        delivered, failed = self._native.take_reports()
        if delivered and self._batch_deliveries:
            for batch, count in delivered:
                on_delivered = self._batch_deliveries.get(batch)
                if on_delivered is not None:
                    on_delivered(count)
        for batch, topic, reason, count in failed:
            self._batches[batch](topic, reason, count)

    def too_large(self, size: int, topic: str) -> MessageTooLarge:
        return MessageTooLarge(
            f"a message of {size} bytes for topic {topic} is over the producer's "
            f"message.max.bytes ({self.max_message_bytes})"
        )

    @property
    def producer(self) -> Producer:
        if self._producer is None:
            raise RuntimeError("KafkaPublisher.open() was not called")
        return self._producer

    @property
    def admin(self) -> AdminClient:
        if self._admin is None:
            raise RuntimeError("KafkaPublisher.open() was not called")
        return self._admin

    def _admin_error(self, error: KafkaError) -> None:
        if error.code() in (KafkaError._AUTHENTICATION, KafkaError._SSL):
            self._admin_refusal = redact_values(error.str(), self.kafka_config)

    @property
    def known_topics(self) -> frozenset[str]:
        """The topics `ensure_topics` made sure of (read from other threads: a copy)."""
        return frozenset(self._known_topics)

    def existing_topics(self, timeout: float = ADMIN_TIMEOUT_S) -> set[str]:
        """Topic names in the cluster; raises `KafkaUnavailable` with the fix when it cannot ask."""
        try:
            metadata = self.admin.list_topics(timeout=timeout)
        except KafkaException as exc:
            self.admin.poll(0)  # serve the error callback: the refusal names the cause
            if self._admin_refusal is not None:
                raise KafkaConnectionRefused(
                    f"Kafka at {self.broker} refused the connection: {self._admin_refusal}: fix the -C "
                    "security settings (sasl.username / sasl.password, ssl.ca.location, the broker's "
                    "host name as its certificate names it)"
                ) from None
            raise KafkaUnavailable(
                f"cannot reach Kafka at {self.broker} within {timeout:.0f}s ({exc.args[0]}): "
                "check -b/--broker and the -C security settings"
            ) from exc
        self.brokers = len(metadata.brokers) or None
        return set(metadata.topics)

    def ensure_topics(self, specs: Iterable[TopicSpec]) -> list[str]:
        """Create the topics that do not exist yet; returns the names created. Existing topics are
        left as they are (their partitions and policy are the operator's)."""
        wanted = {s.name: s for s in specs if s.name not in self._known_topics}
        if not wanted:
            return []
        existing = self.existing_topics()
        missing = [spec for name, spec in wanted.items() if name not in existing]
        created: list[str] = []
        if missing:
            futures = self.admin.create_topics(
                [new_topic(spec, self.topic_config, self.brokers) for spec in missing],
                request_timeout=ADMIN_TIMEOUT_S,
            )
            for name, future in futures.items():
                try:
                    future.result(timeout=ADMIN_TIMEOUT_S)
                    created.append(name)
                    log.info("created topic %s", name, extra={"topic": name})
                except KafkaException as exc:
                    error = exc.args[0]
                    if isinstance(error, KafkaError) and error.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                        continue  # created concurrently (another worker, a retry): fine
                    if isinstance(error, KafkaError) and error.code() in AUTHORIZATION_CODES:
                        raise KafkaNotAuthorized(
                            f"Kafka's ACLs do not let {principal(self.kafka_config)} create topic {name}: "
                            "grant it CREATE, DESCRIBE and WRITE on the topics of its prefix (-p), or "
                            "create the topic yourself"
                        ) from None
                    raise KafkaUnavailable(
                        f"cannot create topic {name} on {self.broker}: {error}; create it yourself or "
                        "fix -T (partitions, replication.factor, topic configs)"
                    ) from exc
        self._known_topics.update(wanted)
        return created

    def produce(
        self,
        message: EncodedMessage,
        on_delivery: DeliveryCallback,
        *,
        while_waiting: Callable[[], object] | None = None,
    ) -> None:
        """Hand one message to the producer: one librdkafka call in the common case, the hot path
        of the snapshot and the stream. While the producer's queue is full (Kafka slower than
        Postgres) it waits, serving delivery reports and calling `while_waiting` (the stream keeps
        its status updates to Postgres going there: a silent client is dropped after
        wal_sender_timeout). Raises `MessageTooLarge` for a message the producer refuses by size.

        Guarantee: once this returns, `on_delivery` will be called exactly once for the message."""
        try:
            self.producer.produce(
                message.topic,
                message.value,
                message.key,
                on_delivery=on_delivery,
                headers=message.headers,  # type: ignore[arg-type]
            )
        except (BufferError, KafkaException):
            self._produce_waiting(message, on_delivery, while_waiting)

    def produce_parts(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: Headers,
        on_delivery: DeliveryCallback,
    ) -> None:
        """`produce` for a message in parts (the native codec's rows), with the same guarantees."""
        try:
            self.producer.produce(topic, value, key, on_delivery=on_delivery, headers=headers)  # type: ignore[arg-type]
        except (BufferError, KafkaException):
            self._produce_waiting(EncodedMessage(topic, key, value, headers), on_delivery, None)

    def _produce_waiting(
        self,
        message: EncodedMessage,
        on_delivery: DeliveryCallback,
        while_waiting: Callable[[], object] | None,
    ) -> None:
        producer = self.producer
        while True:
            try:
                producer.produce(
                    message.topic,
                    value=message.value,
                    key=message.key,
                    headers=cast(list[tuple[str, str | bytes | None]], message.headers),
                    on_delivery=on_delivery,
                )
                return
            except BufferError:
                producer.poll(BACKPRESSURE_POLL_S)
                if while_waiting is not None:
                    while_waiting()
            except KafkaException as exc:
                error = exc.args[0]
                if isinstance(error, KafkaError) and error.code() == KafkaError.MSG_SIZE_TOO_LARGE:
                    size = len(message.value or b"") + len(message.key or b"")
                    raise self.too_large(size, message.topic) from exc
                raise

    def poll(self, timeout: float = 0.0) -> int:
        served = int(self.producer.poll(timeout))
        self._serve_native()
        return served

    def in_flight(self) -> int:
        native = self._native.in_flight() if self._native is not None else 0
        return (len(self.producer) if self._producer is not None else 0) + native

    def flush(self, timeout: float, *, tick: Callable[[], Any] | None = None) -> int:
        """Wait up to `timeout` seconds for every delivery report (of both producers); returns how
        many are missing."""
        deadline = time.monotonic() + timeout
        producer, native = self.producer, self._native
        while self.in_flight() and time.monotonic() < deadline:
            if len(producer):
                producer.flush(min(1.0, max(0.0, deadline - time.monotonic())))
            if native is not None and native.in_flight():
                native.flush(min(1.0, max(0.0, deadline - time.monotonic())))
            self._serve_native()
            if tick is not None:
                tick()
        self._serve_native()
        return self.in_flight()

    def close(self) -> None:
        self._producer = None
        self._native = None
        self._admin = None


def is_size_error(error: KafkaError | None) -> bool:
    return error is not None and error.code() in (KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.INVALID_MSG_SIZE)
