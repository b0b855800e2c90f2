"""The merge query's ledger of the topics it reads: Kafka's id of each (`rules.topic_identity`).

Kept in the query's checkpoint (`topic_ids.json`), where the offsets it names are, so that deleting
the checkpoint forgets both; checked when the query starts, against the ledger and the changelog's
newest commit (a checkpoint deleted beside a changelog that holds the old topics' records), and again
in every batch before anything of it is written, so that a topic recreated under a running query
fails the query instead of reaching the lake as its predecessor's records.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from spark_jobs.connections.kafka_source import KafkaSource, admin_client, topic_ids
from spark_jobs.lake import watermark_io
from spark_jobs.rules import topic_identity

if TYPE_CHECKING:
    from confluent_kafka.admin import AdminClient
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)
LEDGER_FILE = "topic_ids.json"


class TopicLedger:
    """The ids of the topics the query of `checkpoint` (its directory) has read."""

    def __init__(self, kafka: KafkaSource, checkpoint: str) -> None:
        self.kafka = kafka
        self.checkpoint = checkpoint.rstrip("/")
        self.ids: dict[str, str] = {}
        # One client for the query's life: a batch's check is then one request, not a new connection.
        self._admin: AdminClient | None = None

    def open(self, spark: SparkSession, topics: Iterable[str], changelog_ids: Mapping[str, str]) -> None:
        """Load the ledger and check `topics` (those the query will read) against it and against
        `changelog_ids` (the changelog's newest commit's); raises `TopicRecreated`."""
        text = watermark_io.read_text(spark, f"{self.checkpoint}/{LEDGER_FILE}")
        recorded = {**changelog_ids, **({} if text is None else topic_identity.parse_ledger(text))}
        self.ids = recorded
        self.check(spark, topics)

    def check(self, spark: SparkSession, topics: Iterable[str]) -> dict[str, str]:
        """Check `topics` against the ledger, record the new ones, and return every id recorded;
        raises `TopicRecreated`."""
        if self._admin is None:
            self._admin = admin_client(self.kafka)
        current = topic_ids(self._admin, sorted(set(topics)))
        ids = topic_identity.check(self.ids, current)
        if ids != self.ids:
            added = sorted(set(ids) - set(self.ids))
            watermark_io.write_text(spark, self.checkpoint, LEDGER_FILE, topic_identity.ledger_text(ids))
            log.info("merge: topic ids recorded for %s", ", ".join(added))
            self.ids = ids
        return dict(self.ids)

    def close(self) -> None:
        """Let the admin client go: left to the garbage collector, it would go on connecting (and
        logging) to a cluster the query no longer reads."""
        self._admin = None
