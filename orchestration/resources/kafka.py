"""The Kafka cluster the worker publishes to and the merge job reads from."""

from __future__ import annotations

import dagster as dg
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient
from pydantic import Field

METADATA_TIMEOUT_S = 10.0


class KafkaResource(dg.ConfigurableResource):
    """Bootstrap servers plus any client settings (SASL, TLS) as librdkafka key/values.

    Put credentials in `client_config` through `EnvVar`s, never literally.
    """

    bootstrap_servers: str = Field(description="Comma-separated host:port list.")
    topic_prefix: str | None = Field(default=None, description="Prefix of every topic the worker writes.")
    client_config: dict[str, str] = Field(
        default_factory=dict, description="Extra librdkafka settings (security.protocol, sasl.*, ...)."
    )

    def _config(self) -> dict[str, str]:
        return {"bootstrap.servers": self.bootstrap_servers, **self.client_config}

    def admin(self) -> AdminClient:
        return AdminClient(self._config())

    def end_offsets(self, topics: list[str]) -> dict[str, int | None]:
        """Per topic, the sum of its partitions' high watermarks (messages ever written, for a
        topic that was never compacted); None for a topic that does not exist yet."""
        metadata = self.admin().list_topics(timeout=METADATA_TIMEOUT_S)
        consumer = Consumer(
            {**self._config(), "group.id": "bottledwater-dagster-observer", "enable.auto.commit": "false"}
        )
        try:
            totals: dict[str, int | None] = {}
            for topic in topics:
                described = metadata.topics.get(topic)
                if described is None or described.error is not None:
                    totals[topic] = None
                    continue
                total = 0
                for partition in described.partitions:
                    _, high = consumer.get_watermark_offsets(
                        TopicPartition(topic, partition), timeout=METADATA_TIMEOUT_S, cached=False
                    )
                    total += max(0, high)
                totals[topic] = total
            return totals
        finally:
            consumer.close()
