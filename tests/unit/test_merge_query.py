"""The one merge query's pure parts: its subscription, which topics are tables to merge, the union
of a parked table's ranges, and the per-topic summaries of a batch of many topics."""

from __future__ import annotations

import re

from spark_jobs.connections.kafka_source import consumer_options, subscription
from spark_jobs.merge import table_selector
from spark_jobs.merging import batch_schema
from spark_jobs.merging.parked import ParkedSlice, decode_ranges, encode_ranges, union

CONTROL = "bw.bottledwater.control"


def test_the_subscription_reads_named_and_matching_topics_and_the_control_topic_only() -> None:
    # Spark compiles it as a Java regex; this one uses nothing Python reads differently.
    pattern = re.compile(subscription(["bw.public.a.b"], r"bw\..*", CONTROL))
    assert pattern.fullmatch("bw.public.orders")
    assert pattern.fullmatch(CONTROL)
    assert pattern.fullmatch("bw.public.a.b")
    assert not pattern.fullmatch("other.orders")
    named_only = re.compile(subscription(["bw.orders"], None, CONTROL))
    assert named_only.fullmatch("bw.orders") and named_only.fullmatch(CONTROL)
    assert not named_only.fullmatch("bw.ordersX") and not named_only.fullmatch("bwXorders")


def test_the_consumers_never_hold_a_fetch_open_unless_the_user_says_so() -> None:
    # A fetch held open by the broker delayed each partition's read by 500 ms (Kafka's default).
    assert consumer_options({})["kafka.fetch.max.wait.ms"] == "10"
    chosen = consumer_options({"kafka.fetch.max.wait.ms": "250", "kafka.security.protocol": "SSL"})
    assert chosen == {
        "kafka.fetch.max.wait.ms": "250",
        "kafka.security.protocol": "SSL",
        "kafka.isolation.level": "read_committed",
    }


def test_the_consumers_read_only_what_kafka_transactions_committed() -> None:
    # Under the worker's --delivery exactly-once an aborted transaction's messages are no changes.
    assert consumer_options({})["kafka.isolation.level"] == "read_committed"


def test_kafkas_own_topics_never_match_a_pattern() -> None:
    everything = re.compile(subscription([], ".*", CONTROL))
    assert not everything.fullmatch("__consumer_offsets")
    assert not everything.fullmatch("_schemas")
    assert everything.fullmatch("orders")


def test_a_table_topic_is_selected_the_control_topic_and_misnamed_topics_are_not() -> None:
    selected = table_selector([], r"bw\..*", "bw")
    assert selected("bw.orders") and selected("bw.inventory.products")
    assert not selected(CONTROL)
    assert not selected("bw.a.b.c")  # not [prefix.][schema.]table
    assert not selected("other.orders")


def test_a_parked_tables_ranges_are_one_range_per_partition() -> None:
    first = ParkedSlice("t", 3, {("t", 0): (10, 19), ("c", 0): (4, 4)}, "boom")
    second = ParkedSlice("t", 4, {("t", 0): (20, 29), ("t", 1): (0, 5)}, "behind")
    assert union([first, second]) == {("t", 0): (10, 29), ("t", 1): (0, 5), ("c", 0): (4, 4)}
    assert decode_ranges(encode_ranges(first.ranges)) == first.ranges


def _group(
    topic: str, partition: int, low: int, high: int, records: int, **extra: object
) -> dict[str, object]:
    return {
        "topic": topic, "partition": partition, "tombstone": False, "unchanged": None,
        "control_key": None, "control_value": None, "key_id": None, "value_id": None,
        "min_offset": low, "max_offset": high, "records": records, **extra,
    }  # fmt: skip


def test_each_topics_summary_holds_its_records_and_the_control_topics() -> None:
    groups = [
        _group("a", 0, 5, 9, 5, key_id=b"\x00\x00\x00\x01"),
        _group("b", 0, 0, 2, 3),
        _group(CONTROL, 0, 7, 7, 1, control_key=b"k", control_value=b"v"),
    ]
    summary = batch_schema.fold(groups[:1] + groups[2:], CONTROL, "avro")
    assert summary.offsets == {("a", 0): 9, (CONTROL, 0): 7}
    assert summary.starts == {("a", 0): 5, (CONTROL, 0): 7}
    assert summary.table_messages == 5 and summary.key_schema_ids == {1}
    assert summary.control_records == [(b"k", b"v")]
