"""The Kafka cluster the worker publishes to and the merge job reads from."""

from __future__ import annotations

import os
import re

import dagster as dg
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient
from pydantic import Field

from spark_jobs.connections.kafka_client import jvm_options

METADATA_TIMEOUT_S = 10.0
# The worker's variable for extra client settings, ';'- or newline-separated k=v pairs.
WORKER_KAFKA_CONFIG_ENV = "BOTTLEDWATER_KAFKA_CONFIG"
# The merge's, when it has a principal of its own (a read-only one, as on the stack's secured cluster).
MERGE_KAFKA_CONFIG_ENV = "BOTTLEDWATER_MERGE_KAFKA_CONFIG"
_SETTING_SEPARATOR = re.compile(r"[;\n]")


class KafkaResource(dg.ConfigurableResource):
    """Bootstrap servers plus any client settings (SASL, TLS) as librdkafka key/values.

    Put credentials in `client_config` through `EnvVar`s, never literally.
    """

    bootstrap_servers: str = Field(description="Comma-separated host:port list.")
    topic_prefix: str | None = Field(default=None, description="Prefix of every topic the worker writes.")
    message_format: str = Field(default="avro", description="avro (with the registry) or json.")
    client_config: dict[str, str] = Field(
        default_factory=dict, description="Extra librdkafka settings (security.protocol, sasl.*, ...)."
    )

    client_config_env: str | None = Field(
        default=WORKER_KAFKA_CONFIG_ENV,
        description="Environment variable with more k=v settings, read when a client is made, so that "
        "SASL credentials shared with the worker never show in the UI.",
    )

    merge_client_config_env: str | None = Field(
        default=MERGE_KAFKA_CONFIG_ENV,
        description="Environment variable with the merge's own k=v settings (its own principal, which "
        "may only read), used instead of client_config_env's for the merge and Dagster's reads when set.",
    )

    def _config(self, env_var: str | None = None) -> dict[str, str | int | float | bool]:
        from_env: dict[str, str] = {}
        name = env_var or self.client_config_env
        raw = os.environ.get(name, "") if name else ""
        for part in _SETTING_SEPARATOR.split(raw):
            key, sep, value = part.partition("=")
            if sep and key.strip():
                from_env[key.strip()] = value.strip()
        return {"bootstrap.servers": self.bootstrap_servers, **from_env, **self.client_config}

    def _reader_config(self) -> dict[str, str | int | float | bool]:
        merge_env = self.merge_client_config_env
        return self._config(merge_env if merge_env and os.environ.get(merge_env) else None)

    def spark_options(self) -> dict[str, str]:
        """The merge's client settings as Spark Kafka source options (the JVM client's names:
        SASL credentials as a JAAS line, the CA as a PEM truststore)."""
        return jvm_options(self._reader_config())

    def admin(self) -> AdminClient:
        return AdminClient(self._config())

    def consumer(self, group_id: str) -> Consumer:
        """A consumer that commits nothing (callers assign partitions themselves)."""
        return Consumer({**self._reader_config(), "group.id": group_id, "enable.auto.commit": "false"})

    def end_offsets(self, topics: list[str]) -> dict[str, int | None]:
        """Per topic, the sum of its partitions' high watermarks (messages ever written, for a
        topic that was never compacted); None for a topic that does not exist yet."""
        metadata = self.admin().list_topics(timeout=METADATA_TIMEOUT_S)
        consumer = self.consumer("bottledwater-dagster-observer")
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
