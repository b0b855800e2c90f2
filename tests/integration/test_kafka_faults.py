"""Brokers failing under load, on the stack's secured three-node cluster (RF 3, min.insync 2).

One workload for every case, so that the tier pays for one snapshot and one stream: a table of
60,000 rows is snapshotted while the leader of one of its partitions is killed (-9), then a writer
keeps up a mixed stream (inserts, updates, key changes, deletes, transactions over two tables, one
large transaction) through, one after the other: kill -9 of a partition leader, SIGSTOP of a broker
for 30 s, a rolling restart of all three nodes, and the controller quorum losing one node for a
while. Then the worker is killed (-9) with changes in flight, and what Kafka holds is checked
against what the slot acknowledged, before the worker is restarted to catch up.

After all of it: every compacted topic equals Postgres (no key lost or resurrected), within every
partition `(bw.lsn, bw.seq)` never goes backwards for a key, and the Delta mirrors equal Postgres
after a merge. Each case's stall (how long until the slot acknowledged what was written when the
fault began), and the run's duplicates and librdkafka's retry lines, are printed (at-least-once:
counted, not hidden).
"""

from __future__ import annotations

import random
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg2
import pytest
from psycopg2 import sql
from pyspark.sql import SparkSession

from spark_jobs.merge import KafkaSource, MergeOptions, run_merge
from stack.kafka_cluster import MERGE, WORKER, KafkaNode
from tests.integration.conftest import unique_name
from tests.integration.lakehouse import assert_delta_equals_postgres
from tests.integration.secured_kafka import SecuredKafka
from tests.integration.worker_harness import (
    Record,
    WorkerProcess,
    compacted,
    confirmed_flush,
    current_lsn,
    execute,
    query,
    wait_caught_up,
    wait_for,
)

SNAPSHOT_ROWS = 30_000
LARGE_TXN_ROWS = 10_000
STOP_S = 30.0
# About 20 transactions a second: enough to be mid-flight at every fault, few enough that the
# merge at the end stays short.
WRITER_PAUSE_S = 0.05
NODE_UP_TIMEOUT_S = 240.0
CATCH_UP_TIMEOUT_S = 300.0


class Writer:
    """One connection committing the mixed workload in a loop until stopped; every transaction
    also inserts its number into `ledger`, so the order of commits is known."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.stop_event = threading.Event()
        self.committed = 0
        self.large_done = threading.Event()
        self.want_large = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Writer:
        self.thread.start()
        return self

    def stop(self) -> int:
        self.stop_event.set()
        self.thread.join(60)
        if self.error is not None:
            raise self.error
        return self.committed

    def _run(self) -> None:
        rng = random.Random(24)
        try:
            conn = psycopg2.connect(self.dsn)
            with conn.cursor() as cur:
                next_id = SNAPSHOT_ROWS + 1
                while not self.stop_event.is_set():
                    n = self.committed + 1
                    cur.execute("INSERT INTO t VALUES (%s, %s)", (next_id, f"i{n}"))
                    next_id += 1
                    cur.execute("UPDATE t SET v = %s WHERE id = %s", (f"u{n}", rng.randint(1, next_id)))
                    if n % 5 == 0:  # a key change: a tombstone for the old key, the row under the new
                        old = rng.randint(1, SNAPSHOT_ROWS)
                        cur.execute("UPDATE t SET id = id + 10000000 WHERE id = %s", (old,))
                    if n % 3 == 0:
                        cur.execute("DELETE FROM t WHERE id = %s", (rng.randint(1, next_id),))
                    if n % 2 == 0:  # the same transaction over a second table
                        cur.execute(
                            "INSERT INTO u VALUES (%s, %s) ON CONFLICT (k) DO UPDATE SET n = u.n + 1",
                            (n % 500, n),
                        )
                    if self.want_large.is_set() and not self.large_done.is_set():
                        cur.execute(
                            "INSERT INTO t SELECT g, 'large' FROM generate_series(%s, %s) g",
                            (50_000_000, 50_000_000 + LARGE_TXN_ROWS - 1),
                        )
                        self.large_done.set()
                    cur.execute("INSERT INTO ledger VALUES (%s)", (n,))
                    conn.commit()
                    self.committed = n
                    time.sleep(WRITER_PAUSE_S)
            conn.close()
        except BaseException as exc:  # surfaced by stop()
            self.error = exc


def leader_of(kafka: SecuredKafka, topic: str, partition: int = 0) -> KafkaNode:
    metadata = kafka.admin().list_topics(topic, timeout=30).topics[topic]
    leader = metadata.partitions[partition].leader
    return next(node for node in kafka.nodes() if node.node_id == leader)


def wait_fully_replicated(kafka: SecuredKafka, topics: list[str]) -> None:
    def in_sync() -> bool:
        metadata = kafka.admin().list_topics(timeout=30)
        return all(
            len(p.isrs) == 3
            for t in topics
            if t in metadata.topics
            for p in metadata.topics[t].partitions.values()
        )

    wait_for(in_sync, "every partition's replicas back in sync", NODE_UP_TIMEOUT_S)


def restart(node: KafkaNode) -> None:
    node.start()
    node.wait_healthy(NODE_UP_TIMEOUT_S)


def stall_of(dsn: str, slot: str, fault: Callable[[], None]) -> tuple[float, float]:
    """Runs `fault`; returns (the stall: how long after the fault began the slot acknowledged
    what had been written when it began, the fault's own duration)."""
    target = current_lsn(dsn)
    began = time.monotonic()
    acknowledged: list[float] = []

    def watch() -> None:
        while (confirmed_flush(dsn, slot) or 0) < target and time.monotonic() - began < CATCH_UP_TIMEOUT_S:
            time.sleep(0.2)
        acknowledged.append(time.monotonic() - began)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    fault()
    lasted = time.monotonic() - began
    watcher.join(CATCH_UP_TIMEOUT_S)
    assert (confirmed_flush(dsn, slot) or 0) >= target, "the slot did not move on after the fault"
    return acknowledged[0], lasted


def check_order(records: list[Record]) -> int:
    """Asserts `(bw.lsn, bw.seq)` never goes backwards for a key within a partition, but for a
    replay: after a worker restart, changes since the last acknowledgement are sent again, each at
    a position the key already had (at-least-once). Returns those duplicates."""
    last: dict[tuple[int, bytes | None], tuple[int, int]] = {}
    seen: set[tuple[int, bytes | None, int, int]] = set()
    duplicates = 0
    for record in sorted(records, key=lambda r: (r.partition, r.offset)):
        position = (record.lsn, record.seq)
        key = (record.partition, record.key)
        identity = (record.partition, record.key, record.lsn, record.seq)
        if identity in seen:
            duplicates += 1
        else:
            assert position >= last.get(key, (0, 0)), f"{record.topic}: went backwards at {record}"
        last[key] = position
        seen.add(identity)
    return duplicates


def pending_commits(dsn: str, slot: str, publication: str) -> int:
    """Committed transactions the slot still holds (not acknowledged), peeked without consuming."""
    rows = query(
        dsn,
        "SELECT get_byte(data, 0) FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL, "
        "'proto_version', '1', 'publication_names', %s)",
        (slot, publication),
    )
    return sum(1 for (kind,) in rows if kind == ord("C"))


@pytest.fixture
def faults_db(secured_kafka: SecuredKafka, fresh_db: str, tmp_path: Path) -> Iterator[tuple[str, str]]:
    prefix = unique_name("flt")
    secured_kafka.grant(prefix)
    yield fresh_db, prefix
    for node in secured_kafka.nodes():  # whatever a failure left stopped or down
        node.signal(signal.SIGCONT)
        if node.pid() is None:
            restart(node)
    secured_kafka.delete_prefix(prefix)


def test_brokers_failing_under_load_lose_and_reorder_nothing(
    secured_kafka: SecuredKafka, faults_db: tuple[str, str], tmp_path: Path, spark: SparkSession
) -> None:
    kafka, (dsn, prefix) = secured_kafka, faults_db
    slot = unique_name("slot")
    execute(
        dsn,
        "CREATE TABLE t (id bigint PRIMARY KEY, v text)",
        "CREATE TABLE u (k int PRIMARY KEY, n bigint)",
        "CREATE TABLE ledger (n bigint PRIMARY KEY)",
        f"INSERT INTO t SELECT g, 's' || g FROM generate_series(1, {SNAPSHOT_ROWS}) g",
    )
    args = [
        "-d", dsn, "-s", slot, "-p", prefix, "-b", kafka.bootstrap, "-f", "json", "--status-interval", "1",
        "--producer", "native", "-T", "partitions=3",
    ]  # fmt: skip
    # Deliveries wait out a broker's absence (librdkafka's default gives up after 300 s anyway).
    env = kafka.worker_env(WORKER, **{"message.timeout.ms": "300000"})
    logs = tmp_path / "worker.log"
    worker = WorkerProcess(args, logs, env=env).start()
    topics = [f"{prefix}.t", f"{prefix}.u", f"{prefix}.ledger"]
    stalls: dict[str, tuple[float, float]] = {}
    try:
        # During the snapshot: the leader of one of the big table's partitions, killed.
        worker.wait_log(f"created topic {prefix}.t", timeout=120)
        snapshot_leader = leader_of(kafka, topics[0])
        began = time.monotonic()
        snapshot_leader.signal(signal.SIGKILL)
        worker.wait_streaming(timeout=CATCH_UP_TIMEOUT_S)
        stalls["kill -9 of a leader during the snapshot"] = (time.monotonic() - began, 0.0)
        restart(snapshot_leader)
        wait_fully_replicated(kafka, topics)

        writer = Writer(dsn).start()
        wait_for(lambda: writer.committed > 200, "the writer to get going", 60)

        def kill_leader() -> None:
            node = leader_of(kafka, topics[0], 1)
            node.signal(signal.SIGKILL)
            time.sleep(10)
            restart(node)

        stalls["kill -9 of a partition leader"] = stall_of(dsn, slot, kill_leader)
        wait_fully_replicated(kafka, topics)
        writer.want_large.set()

        def stop_one() -> None:
            node = leader_of(kafka, topics[1])
            node.signal(signal.SIGSTOP)
            time.sleep(STOP_S)
            node.signal(signal.SIGCONT)

        stalls[f"SIGSTOP of a broker for {STOP_S:.0f} s"] = stall_of(dsn, slot, stop_one)
        wait_fully_replicated(kafka, topics)
        assert writer.large_done.is_set()

        def rolling_restart() -> None:
            for node in kafka.nodes():
                node.stop()
                restart(node)
                wait_fully_replicated(kafka, topics)

        stalls["rolling restart of all three"] = stall_of(dsn, slot, rolling_restart)

        def lose_a_controller() -> None:
            node = kafka.nodes()[-1]
            node.signal(signal.SIGKILL)
            time.sleep(15)
            restart(node)

        stalls["controller quorum losing one node"] = stall_of(dsn, slot, lose_a_controller)
        wait_fully_replicated(kafka, topics)

        # The worker killed with changes in flight: every transaction the slot no longer holds
        # (acknowledged) must be in Kafka.
        committed = writer.stop()
        worker.kill9()
        wait_for(
            lambda: query(dsn, "SELECT NOT active FROM pg_replication_slots WHERE slot_name = %s", (slot,))[
                0
            ][0],
            "the slot to be released",
        )
        pending = pending_commits(dsn, slot, slot)
        reader = kafka.reader(MERGE)
        try:
            in_kafka = {int(r.json_key()["n"]) for r in reader.read(topics[2], timeout=120) if r.value}
            missing = sorted(set(range(1, committed - pending + 1)) - in_kafka)
            assert not missing, (
                f"the slot acknowledged transactions Kafka does not hold (committed {committed}, "
                f"pending {pending}, missing {missing[:10]})"
            )

            restarted = WorkerProcess(args, logs, env=env).start()
            restarted.wait_streaming(timeout=CATCH_UP_TIMEOUT_S)
            wait_caught_up(dsn, slot, timeout=CATCH_UP_TIMEOUT_S)
            assert restarted.stop() == 0

            duplicates = 0
            for table, topic in zip(("t", "u", "ledger"), topics, strict=True):
                records = reader.read(topic, timeout=300)
                duplicates += check_order(records)
                key = "id" if table == "t" else ("k" if table == "u" else "n")
                columns = "id, v" if table == "t" else ("k, n" if table == "u" else "n")
                names = [c.strip() for c in columns.split(",")]
                statement = sql.SQL("SELECT {} FROM {}").format(
                    sql.SQL(", ").join(map(sql.Identifier, names)), sql.Identifier(table)
                )
                rows = query(dsn, statement)
                expected = {f'{{"{key}": {row[0]}}}': dict(zip(names, row, strict=True)) for row in rows}
                assert compacted(records) == expected, f"{topic} differs from Postgres"
        finally:
            reader.close()
    finally:
        worker.ensure_stopped()

    warehouse = str(tmp_path / "warehouse")
    options = MergeOptions(warehouse, "json", None, prefix, postgres=dsn)
    source = KafkaSource(kafka.bootstrap, options=kafka.spark_options(MERGE))
    # The two tables of the workload; the ledger only tells the order of commits.
    runs = run_merge(spark, options, source, str(tmp_path / "checkpoints"), topics=topics[:2])
    assert [r.error for r in runs] == [None, None]
    for table in ("t", "u"):
        assert_delta_equals_postgres(spark, f"{warehouse}/public/{table}", dsn, table)

    log = logs.read_text(errors="replace")
    retries = sum(
        1
        for line in log.splitlines()
        if line.startswith("%") and ("retry" in line.lower() or "|FAIL|" in line)
    )
    report = "; ".join(
        f"{case}: stall {stall:.1f} s (fault {lasted:.0f} s)" for case, (stall, lasted) in stalls.items()
    )
    print(
        f"\nRESULT broker faults: {report}; duplicates {duplicates}; librdkafka retry/failure lines {retries}"
    )
    assert kafka.password(WORKER) not in log
