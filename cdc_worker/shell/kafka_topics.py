"""Deleting the pipeline's topics with Kafka's admin API: the rebuild after a lost slot starts the
topics afresh, so that rows deleted while the slot was lost leave no stale copy downstream.

Kafka deletes a topic asynchronously: the request returns before the brokers are done, and a topic
recreated meanwhile fails with "marked for deletion". `delete_topics` therefore waits until the
cluster's metadata no longer lists them.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

from cdc_worker.core.errors import InfrastructureError
from cdc_worker.shell.kafka_settings import admin_settings

REQUEST_TIMEOUT_S = 30.0
GONE_TIMEOUT_S = 120.0
POLL_S = 0.5


class TopicDeletionFailed(InfrastructureError):
    """Kafka refused or did not finish deleting; the message names the topics and the cause."""


@dataclass(frozen=True)
class TopicDeletion:
    deleted: tuple[str, ...]
    missing: tuple[str, ...]  # did not exist: nothing to delete


def delete_topics(
    broker: str,
    kafka_config: Mapping[str, str],
    topics: Sequence[str],
    gone_timeout_s: float = GONE_TIMEOUT_S,
) -> TopicDeletion:
    admin = AdminClient(admin_settings(broker, kafka_config))
    if not topics:
        return TopicDeletion((), ())
    deleted: list[str] = []
    missing: list[str] = []
    failures: list[str] = []
    for topic, future in admin.delete_topics(list(topics), operation_timeout=REQUEST_TIMEOUT_S).items():
        try:
            future.result(timeout=REQUEST_TIMEOUT_S)
            deleted.append(topic)
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            if isinstance(error, KafkaError) and error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                missing.append(topic)
            else:
                failures.append(f"{topic}: {exc}")
    if failures:
        raise TopicDeletionFailed(
            "Kafka did not delete " + "; ".join(failures) + " (check the broker's delete.topic.enable and "
            "the client's ACLs: the principal needs DELETE on these topics), then run the command again"
        )
    deadline = time.monotonic() + gone_timeout_s
    while True:
        listed = set(admin.list_topics(timeout=REQUEST_TIMEOUT_S).topics)
        left = sorted(set(deleted) & listed)
        if not left:
            return TopicDeletion(tuple(sorted(deleted)), tuple(sorted(missing)))
        if time.monotonic() > deadline:
            raise TopicDeletionFailed(
                f"Kafka accepted the deletion of {', '.join(left)} but still lists them after "
                f"{gone_timeout_s:.0f} s: check the controller's log, then run the command again"
            )
        time.sleep(POLL_S)
