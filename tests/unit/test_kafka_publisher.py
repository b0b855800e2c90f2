"""`read_live_keys`: the re-snapshot's read of a topic's keys, with a fake consumer and clock."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from confluent_kafka import KafkaError, KafkaException

from cdc_worker.shell.kafka_publisher import KafkaUnavailable
from cdc_worker.shell.kafka_reader import read_live_keys, watermark_offsets


@dataclass
class FakeMessage:
    partition_: int
    offset_: int | None = None
    key_: bytes | None = None
    value_: bytes | None = None
    error_: KafkaError | None = None

    def error(self) -> KafkaError | None:
        return self.error_

    def partition(self) -> int:
        return self.partition_

    def offset(self) -> int | None:
        return self.offset_

    def key(self) -> bytes | None:
        return self.key_

    def value(self) -> bytes | None:
        return self.value_


def eof(partition: int) -> FakeMessage:
    return FakeMessage(partition, error_=KafkaError(KafkaError._PARTITION_EOF))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeConsumer:
    """Hands out one scripted batch per `consume` call; each call takes `step` seconds of the
    clock (an empty batch takes the whole poll timeout, as librdkafka's would)."""

    def __init__(self, clock: Clock, batches: list[list[FakeMessage]], step: float = 1.0) -> None:
        self.clock = clock
        self.batches: Iterator[list[FakeMessage]] = iter(batches)
        self.step = step
        self.calls = 0

    def consume(self, num_messages: int, timeout: float) -> list[FakeMessage]:
        self.calls += 1
        batch = next(self.batches, [])
        self.clock.now += self.step if batch else timeout
        return batch


def record(partition: int, offset: int, key: bytes, value: bytes | None) -> FakeMessage:
    return FakeMessage(partition, offset, key, value)


def test_last_message_per_key_decides_and_tombstones_remove() -> None:
    clock = Clock()
    consumer = FakeConsumer(
        clock,
        [
            [record(0, 0, b"a", b"1"), record(1, 0, b"b", b"1")],
            [record(0, 1, b"a", None), record(1, 1, b"c", b"1"), record(0, 2, b"d", b"1")],
        ],
    )
    keys = read_live_keys(consumer, "t", {0: 3, 1: 2}, 5.0, broker="k:9092", clock=clock)
    assert keys == {b"b", b"c", b"d"}


def test_end_of_partition_events_finish_the_read() -> None:
    clock = Clock()
    # Offsets short of the high watermark (e.g. a transaction marker last): EOF ends the partition.
    consumer = FakeConsumer(clock, [[record(0, 0, b"a", b"1")], [eof(0)]])
    assert read_live_keys(consumer, "t", {0: 2}, 5.0, broker="k:9092", clock=clock) == {b"a"}


def test_a_read_longer_than_the_timeout_succeeds_while_it_progresses() -> None:
    clock = Clock()
    n = 200  # 200 batches of 1 s each: 40 times the timeout in all, never 5 s without a message
    batches = [[record(0, i, f"k{i}".encode(), b"v")] for i in range(n)]
    # Quiet stretches shorter than the timeout are fine too.
    batches[50:50] = [[], [], [], []]
    consumer = FakeConsumer(clock, batches, step=1.0)
    keys = read_live_keys(consumer, "t", {0: n}, 5.0, broker="k:9092", clock=clock)
    assert len(keys) == n
    assert clock.now - 1000.0 > 5.0 * 40


def test_no_progress_for_the_timeout_fails_with_the_fix() -> None:
    clock = Clock()
    consumer = FakeConsumer(clock, [[record(0, 0, b"a", b"1")], [record(1, 0, b"b", b"1")]])
    with pytest.raises(KafkaUnavailable) as info:
        read_live_keys(consumer, "t", {0: 10, 1: 1}, 5.0, broker="k:9092", clock=clock)
    message = str(info.value)
    assert "\n" not in message
    assert "no progress for 5s" in message
    assert "partitions 0 (end offset 10)" in message
    assert "k:9092" in message and "start the worker again" in message
    # It gave up after about `timeout` seconds of silence, not sooner and not much later.
    assert 5.0 < clock.now - 1000.0 - 2.0 <= 7.0


def test_a_broker_error_fails_at_once() -> None:
    clock = Clock()
    broken = FakeMessage(0, error_=KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED))
    consumer = FakeConsumer(clock, [[broken]])
    with pytest.raises(KafkaUnavailable, match="reading topic t"):
        read_live_keys(consumer, "t", {0: 1}, 5.0, broker="k:9092", clock=clock)
    assert consumer.calls == 1


class LeaderlessConsumer:
    """A topic created a moment ago: its partition has no leader for the first `failures` asks."""

    def __init__(self, clock: Clock, failures: int, code: int = KafkaError.NOT_LEADER_FOR_PARTITION) -> None:
        self.clock, self.failures, self.code, self.asked = clock, failures, code, 0

    def get_watermark_offsets(self, partition: object, timeout: float) -> tuple[int, int]:
        self.asked += 1
        if self.asked <= self.failures:
            # As librdkafka raises it from get_watermark_offsets: not flagged retriable.
            raise KafkaException(KafkaError(self.code, "Broker: Not leader for partition"))
        return 0, 7


def test_offsets_of_a_partition_without_a_leader_yet_are_asked_again() -> None:
    clock = Clock()

    def sleep(seconds: float) -> None:
        clock.now += seconds

    consumer = LeaderlessConsumer(clock, failures=3)
    assert watermark_offsets(consumer, "t", 0, 10.0, broker="b:9092", clock=clock, sleep=sleep) == (0, 7)
    assert consumer.asked == 4


@pytest.mark.parametrize("code", [KafkaError._DESTROY_BROKER, KafkaError._TRANSPORT])
def test_offsets_asked_of_a_leader_that_went_away_are_asked_again(code: int) -> None:
    """A leader killed while asked (the broker-fault tests): the retry reaches the new leader."""
    clock = Clock()

    def sleep(seconds: float) -> None:
        clock.now += seconds

    consumer = LeaderlessConsumer(clock, failures=2, code=code)
    assert watermark_offsets(consumer, "t", 0, 10.0, broker="b:9092", clock=clock, sleep=sleep) == (0, 7)


def test_a_partition_that_never_gets_a_leader_fails_with_the_fix() -> None:
    clock = Clock()

    def sleep(seconds: float) -> None:
        clock.now += seconds

    consumer = LeaderlessConsumer(clock, failures=10_000)
    with pytest.raises(KafkaUnavailable, match="brokers at b:9092 are up and lead it"):
        watermark_offsets(consumer, "t", 0, 2.0, broker="b:9092", clock=clock, sleep=sleep)
