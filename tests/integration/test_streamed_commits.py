"""The merge's side of changes produced before their commit (`spark_jobs.merging.streamed_commits`)
against the real Spark and Kafka: their headers rewritten as `kafka_contract.headers.resolved_headers`
writes them, the rest untouched; a commit event found on the control topic past a batch's end,
kept in the warehouse for later batches; one that cannot be found is one line naming the xids."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from cdc_worker.core.encoding.json_serializer import JsonEventSerializer
from kafka_contract.control import ControlDecoder
from kafka_contract.headers import iso_utc, resolved_headers
from kafka_contract.topics import control_topic_name
from spark_jobs.merging.streamed_commits import StreamedCommits, read_control_past, resolve
from tests.integration.worker_harness import delete_topics_with_prefix

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.integration]

COMMIT_TS = datetime(2026, 12, 7, 12, 0, 0, 123456, tzinfo=UTC)
SCHEMA = (
    "topic string, partition int, offset long, key binary, value binary, "
    "headers array<struct<key:string,value:binary>>"
)


def test_changes_produced_before_their_commit_get_their_commits_headers(spark: SparkSession) -> None:
    early = [("bw.op", b"u"), ("bw.seq", b"7"), ("bw.xid", b"41"), ("bw.unchanged", b"doc")]
    bare = [("bw.op", b"c"), ("bw.seq", b"0"), ("bw.xid", b"42")]
    ordinary = [
        ("bw.op", b"c"),
        ("bw.lsn", b"100"),
        ("bw.seq", b"0"),
        ("bw.xid", b"9"),
        ("bw.commit_ts", b"x"),
    ]
    rows = [
        ("db.t", 0, 0, b"k1", b"v1", early),
        ("db.t", 0, 1, b"k2", b"v2", bare),
        ("db.t", 0, 2, b"k3", None, ordinary),
    ]
    stamp = iso_utc(COMMIT_TS)
    frame = resolve(spark.createDataFrame(rows, SCHEMA), {41: (5000, stamp), 42: (5100, stamp)})
    got = [
        [(h["key"], bytes(h["value"])) for h in row["headers"]] for row in frame.orderBy("offset").collect()
    ]
    assert got == [resolved_headers(early, 5000, stamp), resolved_headers(bare, 5100, stamp), ordinary]


def test_a_commit_past_the_batch_is_read_from_the_control_topic_and_kept(
    spark: SparkSession, kafka_bootstrap: str, tmp_path: Path
) -> None:
    prefix = f"bw_commits_{uuid.uuid4().hex[:10]}"
    control = control_topic_name(prefix)
    event = JsonEventSerializer({}, topic_prefix=prefix).streamed_commit(77, 9000, COMMIT_TS)
    assert event.topic == control
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.create_topics([NewTopic(control, num_partitions=1, replication_factor=1)])[control].result(30)
    producer, delivered = Producer({"bootstrap.servers": kafka_bootstrap}), []
    producer.produce(
        event.topic,
        event.value,
        event.key,
        headers=event.headers,
        on_delivery=lambda e, _m: delivered.append(e),
    )
    assert producer.flush(30) == 0 and delivered == [None]
    settings = {"bootstrap.servers": kafka_bootstrap}
    try:

        def read_past(_spark: SparkSession, xids: set[int], _batch: int) -> dict[int, tuple[int, str]]:
            return read_control_past(settings, control, {0: 0}, decode=ControlDecoder("json"), xids=xids)

        warehouse = str(tmp_path / "warehouse")
        found = StreamedCommits(warehouse, read_past).find(spark, {77}, {}, batch_id=3)
        assert found == {77: (9000, iso_utc(COMMIT_TS))}
        # A later batch (or a parked slice read again) finds it in the warehouse.
        assert StreamedCommits(warehouse).find(spark, {77}, {}, None) == found
        with pytest.raises(RuntimeError, match=r"streamed transactions \[78\] are not on the control topic"):
            StreamedCommits(warehouse).find(spark, {77, 78}, {}, None)
    finally:
        delete_topics_with_prefix(kafka_bootstrap, prefix)
