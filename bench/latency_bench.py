"""(c) Commit -> Kafka latency at a fixed rate: one-row transactions committed at `--rate` per second
for `--seconds`, each message's broker append time (LogAppendTime, i.e. when Kafka accepted it)
minus its commit timestamp (`bw.commit_ts`, Postgres' clock; same machine).

Baseline, measured in the same run: a bare producer with the worker's settings (acks=all,
idempotent) sending the same number of messages at the same rate, append time minus send time;
that is the part of the latency that Kafka itself costs.

Also, in the same run, when each message became **visible**: a `read_committed` consumer polling
the topic throughout the load (`fetch.wait.max.ms` 5, as a consumer that cares for latency sets
it) notes each message's arrival, minus its commit timestamp. Under `--delivery exactly-once` the
broker appends a message before the worker's Kafka transaction commits, so only this figure says
when a consumer could read it (`visible_p99_ms`); under at-least-once the two differ by the
consumer's fetch.

Run: `.venv/bin/python bench/latency_bench.py [--rate 1000] [--seconds 10] [--format avro|json]
[--delivery at-least-once|exactly-once]`.

Ends with one `RESULT bench=latency name=value ... load1=...` line (`worker_bench_common.result`).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

import psycopg2
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic
from worker_bench_common import (
    BROKER,
    Worker,
    delete_topics,
    execute,
    report,
    result,
    scratch_database,
    unique,
)

MILLIS = 1000.0


def paced(rate: float, seconds: float) -> list[float]:
    """Send times (monotonic) `1/rate` apart, starting now."""
    start = time.monotonic()
    return [start + i / rate for i in range(int(rate * seconds))]


def commit_at_rate(dsn: str, rate: float, seconds: float, connections: int) -> float:
    """One-row transactions on schedule, spread over `connections` (one connection cannot commit
    1,000 times a second with a WAL flush each); returns the achieved rate (it may fall behind)."""
    times = paced(rate, seconds)

    def run(share: list[float]) -> None:
        conn = psycopg2.connect(dsn)
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("PREPARE ins AS INSERT INTO ticks (at) VALUES (clock_timestamp())")
            for due in share:
                delay = due - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                cur.execute("EXECUTE ins")
        conn.close()

    threads = [threading.Thread(target=run, args=(times[i::connections],)) for i in range(connections)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return len(times) / (time.monotonic() - times[0])


def read_all(topic: str, count: int) -> list[tuple[int, dict[str, bytes]]]:
    """(append time ms, headers) of `count` messages of a one-partition topic."""
    consumer = Consumer({"bootstrap.servers": BROKER, "group.id": unique("lat"), "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    out: list[tuple[int, dict[str, bytes]]] = []
    deadline = time.monotonic() + 120
    while len(out) < count and time.monotonic() < deadline:
        for message in consumer.consume(1000, 1.0):
            if message.error() is None:
                out.append((message.timestamp()[1], dict(message.headers() or [])))
    consumer.close()
    return out


class LiveReader:
    """A read_committed consumer of a one-partition topic, in a thread from `start` until `stop`:
    each message's arrival (wall clock, ms) with its headers."""

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self.arrivals: list[tuple[float, dict[str, bytes]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> LiveReader:
        self._thread.start()
        return self

    def warmed_up(self, timeout: float = 60.0) -> None:
        """Once the first message (a warm-up transaction's) came, forgotten: the consumer's own
        start-up (its group and fetch set up) is not the worker's latency."""
        deadline = time.monotonic() + timeout
        while not self.arrivals:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no warm-up message in {self.topic} within {timeout}s")
            time.sleep(0.01)
        self.arrivals.clear()

    def stop(self, count: int, timeout: float = 120.0) -> list[tuple[float, dict[str, bytes]]]:
        """The arrivals, once `count` came (or after `timeout`)."""
        deadline = time.monotonic() + timeout
        while len(self.arrivals) < count and time.monotonic() < deadline:
            time.sleep(0.05)
        self._stop.set()
        self._thread.join(30)
        return self.arrivals

    def _run(self) -> None:
        consumer = Consumer(
            {
                "bootstrap.servers": BROKER, "group.id": unique("live"), "enable.auto.commit": False,
                "isolation.level": "read_committed", "fetch.wait.max.ms": 5,
            }
        )  # fmt: skip
        consumer.assign([TopicPartition(self.topic, 0, OFFSET_BEGINNING)])
        try:
            while not self._stop.is_set():
                # One at a time: a batch call waits for its count or its timeout, not for the first.
                message = consumer.poll(0.05)
                if message is not None and message.error() is None:
                    self.arrivals.append((time.time() * MILLIS, dict(message.headers() or [])))
        finally:
            consumer.close()


def since_commit(stamps: list[tuple[float, dict[str, bytes]]]) -> list[float]:
    """Each time (ms) minus its message's commit timestamp (`bw.commit_ts`)."""
    return [
        stamp
        - datetime.fromisoformat(headers["bw.commit_ts"].decode().replace("Z", "+00:00")).timestamp() * MILLIS
        for stamp, headers in stamps
    ]


def percentiles(values: list[float]) -> tuple[float, float, float]:
    ordered = sorted(values)
    cut = statistics.quantiles(ordered, n=100)
    return cut[49], cut[98], ordered[-1]


def baseline_ms(rate: float, seconds: float) -> list[float]:
    """Bare producer: append time minus send time (wall clock) for messages sent at `rate`."""
    topic = unique("latbase")
    admin = AdminClient({"bootstrap.servers": BROKER})
    config = {"message.timestamp.type": "LogAppendTime"}
    admin.create_topics([NewTopic(topic, 1, -1, config=config)])[topic].result(30)
    producer = Producer(
        {"bootstrap.servers": BROKER, "enable.idempotence": True, "acks": "all", "linger.ms": 20}
    )
    warm_up = unique("warm")  # connection and metadata set up before the clock starts, as in the worker
    producer.produce(topic, b"warm-up", headers=[("sent", b"0"), (warm_up, b"")])
    producer.flush(30)
    try:
        for due in paced(rate, seconds):
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            producer.produce(topic, b"x", headers=[("sent", str(time.time() * MILLIS).encode())])
            producer.poll(0)
        producer.flush(60)
        timed = read_all(topic, int(rate * seconds) + 1)
        return [stamp - float(h["sent"]) for stamp, h in timed if warm_up not in h]
    finally:
        admin.delete_topics([topic])[topic].result(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--format", choices=("avro", "json"), default="avro")
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument("--delivery", choices=("at-least-once", "exactly-once"), default="at-least-once")
    args = parser.parse_args()

    prefix = unique("bench")
    with scratch_database() as dsn, tempfile.TemporaryDirectory() as log_dir:
        execute(dsn, "CREATE TABLE ticks (id bigserial PRIMARY KEY, at timestamptz)")
        extra = ["-x", "-f", args.format, "-T", "partitions=1", "-T", "message.timestamp.type=LogAppendTime"]
        worker = Worker(
            dsn, unique("lat"), prefix, *extra, "--delivery", args.delivery, log_dir=Path(log_dir)
        )
        count = int(args.rate * args.seconds)
        try:
            worker.wait_log("streaming slot")
            live = LiveReader(f"{prefix}.ticks").start()
            execute(dsn, "INSERT INTO ticks (at) VALUES (clock_timestamp())")  # the warm-up
            live.warmed_up()
            achieved = commit_at_rate(dsn, args.rate, args.seconds, args.connections)
            arrivals = live.stop(count)
            messages = read_all(f"{prefix}.ticks", count + 1)[1:]
        finally:
            worker.stop()
            delete_topics(prefix)
    latencies = since_commit([(float(stamp), headers) for stamp, headers in messages])
    visible = since_commit(arrivals)
    base = baseline_ms(args.rate, args.seconds)
    p50, p99, worst = percentiles(latencies)
    v50, v99, vworst = percentiles(visible)
    b50, b99, bworst = percentiles(base)
    report(
        f"(c) commit -> Kafka latency, {len(latencies):,} transactions at {achieved:,.0f}/s "
        f"(asked {args.rate:,.0f}/s), {args.format}, {args.delivery}",
        [
            ("bare producer p50 / p99 / max", f"{b50:7.1f} / {b99:7.1f} / {bworst:7.1f} ms  (baseline)"),
            (
                "worker, appended p50 / p99 / max",
                f"{p50:7.1f} / {p99:7.1f} / {worst:7.1f} ms  (target p99 < 100 ms)",
            ),
            ("ratio p50, p99", f"{p50 / b50:7.2f}x, {p99 / b99:.2f}x"),
            (
                "worker, visible to read_committed p50 / p99 / max",
                f"{v50:7.1f} / {v99:7.1f} / {vworst:7.1f} ms  ({len(visible):,} seen; exactly-once: <= 50)",
            ),
        ],
    )

    result(
        "latency", format=args.format, delivery=args.delivery, transactions=len(latencies),
        rate=round(achieved), p50_ms=p50, p99_ms=p99, max_ms=worst, baseline_p50_ms=b50,
        baseline_p99_ms=b99, p50_vs_baseline=p50 / b50, p99_vs_baseline=p99 / b99,
        visible_p50_ms=v50, visible_p99_ms=v99, visible_max_ms=vworst, visible_seen=len(visible),
        visible_p99_vs_baseline=v99 / b99,
    )  # fmt: skip


if __name__ == "__main__":
    main()
