"""The topics the worker creates, as Kafka's admin API is asked for them: compact for keyed tables,
delete for unkeyed ones, replicated so that one broker can fail, plus -T; and who the worker is to
the brokers' ACLs. Pure: no client here."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from confluent_kafka import KafkaError
from confluent_kafka.cimpl import NewTopic

TOPIC_CREATION_KEYS = {"partitions", "replication.factor"}
BROKER_DEFAULT = -1  # NewTopic: use the broker's num.partitions / default.replication.factor
COMPACT = "compact"
DELETE = "delete"


@dataclass(frozen=True)
class TopicSpec:
    name: str
    keyed: bool  # compacted (keyed) or append-only (unkeyed: a compacted topic rejects null keys)


@dataclass(frozen=True)
class Replication:
    """How a new topic is replicated: `factor` copies, of which `min_insync` must hold a message
    before it counts as written (with acks=all); None leaves it to the broker's defaults."""

    factor: int | None
    min_insync: int | None

    def describe(self) -> str:
        if self.factor is None:
            return "replication factor: the broker's default.replication.factor (brokers unknown)"
        isr = "the broker's default" if self.min_insync is None else str(self.min_insync)
        return f"replication factor {self.factor}, min.insync.replicas {isr}"


def replication_for(brokers: int | None, topic_config: Mapping[str, str]) -> Replication:
    """min(3, brokers) copies with min.insync.replicas one fewer (at least 1), so that one broker
    can fail or restart without stopping the worker and an acknowledged message is on two brokers
    whenever there are two; -T replication.factor and -T min.insync.replicas win."""
    if "replication.factor" in topic_config:
        factor: int | None = int(topic_config["replication.factor"])
    else:
        factor = min(3, brokers) if brokers else None
    if "min.insync.replicas" in topic_config:
        return Replication(factor, int(topic_config["min.insync.replicas"]))
    return Replication(factor, max(1, factor - 1) if factor is not None and factor > 0 else None)


def new_topic(spec: TopicSpec, topic_config: Mapping[str, str], brokers: int | None = None) -> NewTopic:
    """A topic as docs/worker.md says ("Topics"): compact for keyed tables, delete for unkeyed ones,
    replicated as `replication_for` says for a cluster of `brokers`, plus -T."""
    partitions = int(topic_config.get("partitions", BROKER_DEFAULT))
    replication = replication_for(brokers, topic_config)
    config = {k: v for k, v in topic_config.items() if k not in TOPIC_CREATION_KEYS}
    if replication.min_insync is not None:
        config["min.insync.replicas"] = str(replication.min_insync)
    # -T cleanup.policy may refine a keyed topic's policy (e.g. compact,delete); an unkeyed topic
    # must not be compacted, whatever -T says, or the broker would refuse its null-keyed messages.
    if not spec.keyed or "cleanup.policy" not in config:
        config["cleanup.policy"] = COMPACT if spec.keyed else DELETE
    factor = BROKER_DEFAULT if replication.factor is None else replication.factor
    return NewTopic(spec.name, num_partitions=partitions, replication_factor=factor, config=config)


# The codes librdkafka reports when the broker's authorizer refuses a request.
AUTHORIZATION_CODES = frozenset(
    {
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.CLUSTER_AUTHORIZATION_FAILED,
        KafkaError.GROUP_AUTHORIZATION_FAILED,
        KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    }
)


def principal(kafka_config: Mapping[str, str]) -> str:
    """Who the worker is to the brokers, for an error line (never the password)."""
    user = kafka_config.get("sasl.username")
    return f"User:{user}" if user else "the worker's principal"
