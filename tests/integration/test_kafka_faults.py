"""Brokers failing under load, on the stack's secured three-node cluster (RF 3, min.insync 2).

One workload for every case, so that the tier pays for one snapshot and one stream: a table of
30,000 rows is snapshotted while the leader of one of its partitions is killed (-9), then a writer
keeps up a mixed stream (inserts, updates, key changes, deletes, transactions over two tables, one
large transaction) through, one after the other: kill -9 of a partition leader, SIGSTOP of a broker
for 30 s, a rolling restart of all three nodes, and kill -9 of the controller quorum's active leader.
Then the worker is killed (-9) with changes in flight, and what Kafka holds is checked against what
the slot acknowledged, before the worker is restarted to catch up.

After all of it: every compacted topic equals Postgres (no key lost or resurrected), within every
partition `(bw.lsn, bw.seq)` never goes backwards for a key, and the Delta mirrors equal Postgres
after a merge. For each case, one `RESULT broker fault` line in pytest's output (printed past its
capture) gives the stall (how long until the slot acknowledged what was written when the fault
began, and the longest time its acknowledged position stood still while the writer kept writing),
the librdkafka retry and failure lines the worker logged meanwhile, and the duplicates
(at-least-once: counted, not hidden) among the records written meanwhile: a record whose
`(key, bw.lsn, bw.seq)` its partition already held.
"""

from __future__ import annotations

import random
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaException
from psycopg2 import sql
from pyspark.sql import SparkSession

from spark_jobs.merge import KafkaSource, run_merge
from spark_jobs.merge_options import MergeOptions
from stack import kafka_cluster, process
from stack.kafka_cluster import MERGE, WORKER, KafkaNode
from tests.integration.conftest import unique_name
from tests.integration.lakehouse import assert_delta_equals_postgres
from tests.integration.secured_kafka import SecuredKafka
from tests.integration.worker_harness import (
    LoadThread,
    Record,
    TopicReader,
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


class Writer(LoadThread):
    """One connection committing the mixed workload in a loop until stopped; every transaction
    also inserts its number into `ledger`, so the order of commits is known."""

    def __init__(self, dsn: str) -> None:
        super().__init__(dsn, seed=24)
        self.next_id = SNAPSHOT_ROWS + 1
        self.large_done = threading.Event()
        self.want_large = threading.Event()

    def transaction(self, cur: Any, rng: random.Random) -> None:
        n, next_id = self.transactions + 1, self.next_id
        cur.execute("INSERT INTO t VALUES (%s, %s)", (next_id, f"i{n}"))
        self.next_id = next_id = next_id + 1
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

    def pause(self, rng: random.Random) -> float:
        return WRITER_PAUSE_S


def leader_id(kafka: SecuredKafka, topic: str, partition: int = 0) -> int:
    """The node leading `topic`'s partition, -1 while it has none."""
    return int(kafka.admin().list_topics(topic, timeout=30).topics[topic].partitions[partition].leader)


def leader_of(kafka: SecuredKafka, topic: str, partition: int = 0) -> KafkaNode:
    leader = leader_id(kafka, topic, partition)
    return next(node for node in kafka.nodes() if node.node_id == leader)


@dataclass
class Case:
    """One fault, and what the records and the worker's log written from its start until the next
    case's start are measured by."""

    name: str
    marks: dict[tuple[str, int], int]  # per (topic, partition): its high watermark at the start
    log_at: int  # the worker log's size at the start
    stall: float = 0.0  # until the slot acknowledged what was written when the fault began
    standstill: float = 0.0  # the longest time the slot's acknowledged position stood still
    lasted: float = 0.0
    duplicates: int = 0
    retries: int = 0
    notes: list[str] = field(default_factory=list)


def begin(name: str, reader: TopicReader, topics: list[str], log: Path) -> Case:
    def marks() -> tuple[dict[tuple[str, int], int]] | None:  # a tuple: truthy even when empty
        try:
            return ({
                (topic, partition): high
                for topic in topics
                for partition, high in reader.high_watermarks(topic).items()  # none before it exists
            },)  # fmt: skip
        except KafkaException:  # the reader's connection to a node just restarted, not yet renewed
            return None

    [found] = wait_for(marks, "the topics' high watermarks", 60)
    return Case(name, found, log.stat().st_size if log.exists() else 0)


def case_of(record: Record, cases: list[Case]) -> Case:
    """The last case that began before `record` was written."""
    place = (record.topic, record.partition)
    return [case for case in cases if case.marks.get(place, 0) <= record.offset][-1]


def is_retry_line(line: str) -> bool:
    """librdkafka's own log lines (`%LEVEL|time|FAC|...`) of a retry or a failed connection."""
    return line.startswith("%") and ("retry" in line.lower() or "|FAIL|" in line)


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


def restart(kafka: SecuredKafka, node: KafkaNode) -> None:
    """Starts `node` again once the cluster no longer lists it among its brokers. A broker stays
    listed until the controller fences it (its controlled shutdown completed, or its session timed
    out after a kill): started before that, the new process would pass the health check (the node
    is listed) and the replicas' in-sync sets would still count the old one, so a rolling restart
    could stop the next node while this one was still away. And its port must be closed: a JVM
    whose main thread has ended is taken for gone by `stop` while its other threads still hold the
    listener for a moment, which made the start refuse the busy port."""
    wait_for(
        lambda: node.node_id not in kafka_cluster.cluster_brokers(kafka.cfg),
        f"the cluster to fence node {node.node_id}",
        NODE_UP_TIMEOUT_S,
    )
    wait_for(lambda: not process.port_open(node.port), f"node {node.node_id}'s port to close", 60)
    node.start()
    node.wait_healthy(NODE_UP_TIMEOUT_S)


def longest_standstill(samples: list[tuple[float, int]]) -> float:
    """The longest time (s) the acknowledged LSN stood still, from (time, LSN) samples. Pure."""
    longest, since = 0.0, samples[0][0] if samples else 0.0
    for (_, before), (at, lsn) in zip(samples, samples[1:], strict=False):
        longest = max(longest, at - since)  # until the sample that saw it move
        if lsn > before:
            since = at
    return longest


def stall_of(dsn: str, slot: str, fault: Callable[[], None]) -> tuple[float, float, float]:
    """Runs `fault` while the writer writes; returns how long after the fault began the slot
    acknowledged what had been written when it began, the longest time its acknowledged position
    stood still meanwhile (the worker's stall: the writer never stops), and the fault's own
    duration."""
    target = current_lsn(dsn)
    began = time.monotonic()
    acknowledged: list[float] = []
    samples: list[tuple[float, int]] = []
    fault_done = threading.Event()

    def watch() -> None:
        while time.monotonic() - began < CATCH_UP_TIMEOUT_S:
            lsn = confirmed_flush(dsn, slot) or 0
            samples.append((time.monotonic(), lsn))
            if lsn >= target and not acknowledged:
                acknowledged.append(time.monotonic() - began)
            if acknowledged and fault_done.is_set():
                return
            time.sleep(0.2)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        fault()
    finally:
        fault_done.set()
    lasted = time.monotonic() - began
    watcher.join(CATCH_UP_TIMEOUT_S)
    assert acknowledged, "the slot did not move on after the fault"
    return acknowledged[0], longest_standstill(samples), lasted


def check_order(records: list[Record]) -> list[Record]:
    """Asserts `(bw.lsn, bw.seq)` never goes backwards for a key within a partition, but for a
    replay: after a worker restart, changes since the last acknowledgement are sent again, each at
    a position the key already had (at-least-once). Returns those duplicates."""
    last: dict[tuple[int, bytes | None], tuple[int, int]] = {}
    seen: set[tuple[int, bytes | None, int, int]] = set()
    duplicates: list[Record] = []
    for record in sorted(records, key=lambda r: (r.partition, r.offset)):
        position = (record.lsn, record.seq)
        key = (record.partition, record.key)
        identity = (record.partition, record.key, record.lsn, record.seq)
        if identity in seen:
            duplicates.append(record)
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
            restart(secured_kafka, node)
    secured_kafka.delete_prefix(prefix)


def test_brokers_failing_under_load_lose_and_reorder_nothing(
    secured_kafka: SecuredKafka,
    faults_db: tuple[str, str],
    tmp_path: Path,
    spark: SparkSession,
    capsys: pytest.CaptureFixture[str],
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
    topics = [f"{prefix}.t", f"{prefix}.u", f"{prefix}.ledger"]
    reader = kafka.reader(MERGE)
    cases = [begin("kill -9 of a partition leader during the snapshot", reader, topics, logs)]
    worker = WorkerProcess(args, logs, env=env).start()
    try:
        # During the snapshot: the leader of one of the big table's partitions, killed.
        worker.wait_log(f"created topic {prefix}.t", timeout=120)
        snapshot_leader = leader_of(kafka, topics[0])
        began = time.monotonic()
        snapshot_leader.signal(signal.SIGKILL)
        worker.wait_streaming(timeout=CATCH_UP_TIMEOUT_S)
        cases[0].stall = time.monotonic() - began
        restart(kafka, snapshot_leader)
        wait_fully_replicated(kafka, topics)

        writer = Writer(dsn).start()
        wait_for(lambda: writer.transactions > 200, "the writer to get going", 60)

        def run_case(name: str, fault: Callable[[], None]) -> None:
            case = begin(name, reader, topics, logs)
            cases.append(case)
            case.stall, case.standstill, case.lasted = stall_of(dsn, slot, fault)
            wait_fully_replicated(kafka, topics)

        def kill_leader() -> None:
            # Restarted once its partitions have a new leader: the controller fenced it.
            node = leader_of(kafka, topics[0], 1)
            node.signal(signal.SIGKILL)
            wait_for(lambda: leader_id(kafka, topics[0], 1) not in (node.node_id, -1), "a new leader", 60)
            restart(kafka, node)

        run_case("kill -9 of a partition leader", kill_leader)
        writer.want_large.set()

        def stop_one() -> None:
            node = leader_of(kafka, topics[1])
            node.signal(signal.SIGSTOP)
            time.sleep(STOP_S)
            node.signal(signal.SIGCONT)

        run_case(f"SIGSTOP of a broker for {STOP_S:.0f} s", stop_one)
        assert writer.large_done.is_set()

        def rolling_restart() -> None:
            for node in kafka.nodes():
                node.stop()
                restart(kafka, node)
                wait_fully_replicated(kafka, topics)

        run_case("rolling restart of all three", rolling_restart)

        def lose_the_quorum_leader() -> None:
            # The active controller, wherever the last election put it; restarted once the other
            # two have elected a new one (which they can: two of three voters are a majority).
            elected = kafka.quorum_leader()
            assert elected is not None, "no node knows the controller quorum's leader"
            leader, epoch = elected
            node = next(n for n in kafka.nodes() if n.node_id == leader)
            survivors = [n for n in kafka.nodes() if n is not node]
            node.signal(signal.SIGKILL)

            def new_leader() -> bool:
                now = kafka.quorum_leader(survivors)
                return now is not None and now[1] > epoch and now[0] != leader

            wait_for(new_leader, "the two other controllers to elect a leader", 60)
            successor = kafka.quorum_leader(survivors) or (-1, -1)
            cases[-1].notes.append(
                f"quorum leader node {leader} (epoch {epoch}) killed, node {successor[0]} elected "
                f"(epoch {successor[1]})"
            )
            restart(kafka, node)

        run_case("kill -9 of the controller quorum's leader", lose_the_quorum_leader)

        # The worker killed with changes in flight: every transaction the slot no longer holds
        # (acknowledged) must be in Kafka.
        cases.append(begin("kill -9 of the worker, then its restart (replay)", reader, topics, logs))
        writer.stop()
        committed = writer.transactions
        worker.kill9()
        wait_for(
            lambda: query(dsn, "SELECT NOT active FROM pg_replication_slots WHERE slot_name = %s", (slot,))[
                0
            ][0],
            "the slot to be released",
        )
        pending = pending_commits(dsn, slot, slot)
        in_kafka = {int(r.json_key()["n"]) for r in reader.read(topics[2], timeout=120) if r.value}
        missing = sorted(set(range(1, committed - pending + 1)) - in_kafka)
        assert not missing, (
            f"the slot acknowledged transactions Kafka does not hold (committed {committed}, "
            f"pending {pending}, missing {missing[:10]})"
        )

        began = time.monotonic()
        restarted = WorkerProcess(args, logs, env=env).start()
        restarted.wait_streaming(timeout=CATCH_UP_TIMEOUT_S)
        wait_caught_up(dsn, slot, timeout=CATCH_UP_TIMEOUT_S)
        cases[-1].stall = time.monotonic() - began  # from the restart to the slot caught up
        assert restarted.stop() == 0

        for table, topic in zip(("t", "u", "ledger"), topics, strict=True):
            records = reader.read(topic, timeout=300)
            for duplicate in check_order(records):
                case_of(duplicate, cases).duplicates += 1
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
        worker.ensure_stopped()

    warehouse = str(tmp_path / "warehouse")
    options = MergeOptions(warehouse, "json", None, prefix, postgres=dsn)
    source = KafkaSource(kafka.bootstrap, options=kafka.spark_options(MERGE))
    # The two tables of the workload; the ledger only tells the order of commits.
    runs = run_merge(spark, options, source, str(tmp_path / "checkpoints"), topics=topics[:2])
    assert [r.error for r in runs] == [None, None]
    for table in ("t", "u"):
        assert_delta_equals_postgres(spark, f"{warehouse}/public/{table}", dsn, table)

    log = logs.read_bytes()
    ends = [case.log_at for case in cases[1:]] + [len(log)]
    for case, end in zip(cases, ends, strict=True):
        lines = log[case.log_at : end].decode(errors="replace").splitlines()
        case.retries = sum(1 for line in lines if is_retry_line(line))
    with capsys.disabled():  # shown in every run's output, not only a failing one's
        for case in cases:
            notes = "".join(f"; {note}" for note in case.notes)
            print(
                f"\nRESULT broker fault: {case.name}: acknowledged after {case.stall:.1f} s, longest "
                f"stand-still {case.standstill:.1f} s (fault {case.lasted:.0f} s), librdkafka retry/failure "
                f"lines {case.retries}, duplicates {case.duplicates}{notes}"
            )
    assert kafka.password(WORKER).encode() not in log
