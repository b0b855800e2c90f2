"""Large transactions under `--delivery exactly-once` with the native producer: produced into Kafka
while they run, invisible to a `read_committed` consumer until their commit, each then visible
whole; a rolled-back one never; a worker killed inside one publishes it once after its restart; a
rolled-back subtransaction sends its transaction back to the spool, published at the commit.

Each test's database streams any transaction past 64kB of changes (`logical_decoding_work_mem`), so
that a few thousand rows are streamed in several chunks. What is in the partitions before a commit
is read `read_uncommitted` (what was produced) against `read_committed` (what is visible).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg2
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from psycopg2 import sql

from cdc_worker.core.encoding import native
from kafka_contract.topics import control_topic_name
from tests.integration.conftest import unique_name
from tests.integration.worker_harness import (
    WorkerProcess,
    WorkerStarter,
    commit_events,
    execute,
    ordinary_headers,
    query,
    topic_prefix,
    wait_caught_up,
    wait_for,
)

pytestmark = [pytest.mark.integration]

ROWS = 3000  # at 64kB of logical_decoding_work_mem, streamed in several chunks
TABLES = ("big_a", "big_b", "small")
QUIET_S = 1.0  # a read ends once nothing more came for this long


class Streamed:
    """A test's database, topic prefix, slot and exactly-once workers (native producer, JSON)."""

    def __init__(self, db: str, prefix: str, kafka: str, registry: str, tmp_path: Path) -> None:
        self.db, self.prefix, self.kafka = db, prefix, kafka
        self.slot = unique_name("eos_big")
        args = ["-d", db, "-s", self.slot, "-p", prefix, "-b", kafka, "-r", registry, "-f", "json"]
        args += ["--status-interval", "1", "-T", "partitions=1", "--delivery", "exactly-once"]
        args += ["--producer", "native", "--spool-dir", str(tmp_path / "spool")]
        self.workers = WorkerStarter(args, tmp_path)

    def start(self) -> WorkerProcess:
        worker = self.workers.start()
        worker.wait_streaming()
        return worker

    def topic(self, table: str) -> str:
        return f"{self.prefix}.{table}"

    def messages(self, table: str, *, committed: bool = True) -> list[Any]:
        """What a consumer sees now in `table`'s topic, `read_committed` or not."""
        return read(self.kafka, self.topic(table), committed=committed)

    def rows(self, table: str) -> dict[int, Any]:
        """`table`'s topic as a `read_committed` consumer compacts it, each change's headers in the
        ordinary layout (a change produced before its commit given its commit event's)."""
        commits = commit_events(read(self.kafka, control_topic_name(self.prefix)))
        latest: dict[int, Any] = {}
        seen: set[tuple[int, int]] = set()
        for message in self.messages(table):
            headers, _ = ordinary_headers(message, commits)
            position = (int(headers["bw.lsn"]), int(headers["bw.seq"]))
            assert position not in seen, f"{table}: change {position} seen twice"
            seen.add(position)
            key = json.loads(message.key())["id"]
            value = message.value()
            if value is None:
                latest.pop(key, None)
            else:
                latest[key] = json.loads(value)
        return latest

    def table(self, table: str) -> dict[int, Any]:
        result = query(
            self.db, sql.SQL("SELECT id, row_to_json(t)::text FROM {} t").format(sql.Identifier(table))
        )
        return {key: json.loads(value) for key, value in result}


def read(bootstrap: str, topic: str, *, committed: bool = True) -> list[Any]:
    """Every message of `topic` a consumer reads from the beginning until nothing more comes for
    `QUIET_S` (read_committed stops before a transaction still open)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bw-streamed-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed" if committed else "read_uncommitted",
        }
    )
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        messages: list[Any] = []
        quiet_since = time.monotonic()
        while time.monotonic() - quiet_since < QUIET_S:
            message = consumer.poll(0.2)
            if message is None or message.error() is not None:
                continue
            messages.append(message)
            quiet_since = time.monotonic()
        return messages
    finally:
        consumer.close()


@pytest.fixture
def streamed(fresh_db: str, kafka_bootstrap: str, registry_url: str, tmp_path: Path) -> Iterator[Streamed]:
    if not native.NATIVE_AVAILABLE:
        pytest.skip(native.codec_description())
    name = query(fresh_db, "SELECT current_database()")[0][0]
    execute(
        fresh_db,
        sql.SQL("ALTER DATABASE {} SET logical_decoding_work_mem = '64kB'").format(sql.Identifier(name)),
        *[f"CREATE TABLE {t} (id int PRIMARY KEY, note text NOT NULL)" for t in TABLES],
        "INSERT INTO big_a VALUES (0, 'before')",
    )
    for prefix in topic_prefix(kafka_bootstrap, "bw_big"):
        case = Streamed(fresh_db, prefix, kafka_bootstrap, registry_url, tmp_path)
        yield case
        case.workers.stop_all()


def open_transaction(dsn: str, table: str, first: int, tag: str) -> psycopg2.extensions.connection:
    """A transaction left open after inserting `ROWS` rows into `table` from id `first`."""
    conn = psycopg2.connect(dsn)
    with conn.cursor() as cur:
        cur.execute(
            sql.SQL("INSERT INTO {} SELECT g, %s || repeat('x', 40) FROM generate_series(%s, %s) g").format(
                sql.Identifier(table)
            ),
            (tag, first, first + ROWS - 1),
        )
    return conn


def produced(streamed: Streamed, table: str, count: int = ROWS // 2) -> None:
    """Wait until `count` messages of `table` are in Kafka, committed or not (Postgres keeps the
    transaction's last changes, under `logical_decoding_work_mem`, until it sends more or commits)."""
    wait_for(lambda: len(streamed.messages(table, committed=False)) >= count, f"{count} produced", 60)


def test_a_rolled_back_transaction_is_produced_while_it_runs_and_never_visible(streamed: Streamed) -> None:
    worker = streamed.start()
    conn = open_transaction(streamed.db, "big_b", 1, "rolled back")
    produced(streamed, "big_b")  # in Kafka while the transaction runs...
    assert streamed.messages("big_b") == []  # ... and invisible to read_committed
    conn.rollback()
    conn.close()
    execute(streamed.db, "INSERT INTO big_b VALUES (-1, 'after')")
    wait_caught_up(streamed.db, streamed.slot)
    assert streamed.rows("big_b") == streamed.table("big_b") == {-1: {"id": -1, "note": "after"}}
    # The aborted ones stay in the log, where read_committed skips them.
    assert len(streamed.messages("big_b", committed=False)) > ROWS // 2 + 1
    assert worker.stop() == 0


def test_two_at_once_and_a_small_one_between_are_each_visible_at_their_commit(streamed: Streamed) -> None:
    worker = streamed.start()
    first = open_transaction(streamed.db, "big_a", 1, "first")
    second = open_transaction(streamed.db, "big_b", 1, "second")
    produced(streamed, "big_a")
    produced(streamed, "big_b")
    # A small transaction committed meanwhile is visible at once where it shares no partition...
    execute(
        streamed.db, "INSERT INTO small VALUES (1, 'between')", "UPDATE big_a SET note = 'small' WHERE id = 0"
    )
    wait_for(lambda: len(streamed.messages("small")) == 1, "the small transaction visible", 30)
    # ... and a change of a key after it is later in the key's partition (per-key order).
    with first.cursor() as cur:
        cur.execute("UPDATE big_a SET note = 'first' WHERE id = 0")
    first.commit()
    wait_for(lambda: len(streamed.messages("big_a")) == 1 + 1 + ROWS + 1, "the first visible whole", 30)
    assert streamed.messages("big_b") == [], "the second is still open"
    second.commit()
    wait_caught_up(streamed.db, streamed.slot)
    for table in TABLES:
        assert streamed.rows(table) == streamed.table(table), table
    assert streamed.rows("big_a")[0]["note"] == "first"
    assert worker.log().count("produced as they came") == 2, worker.log()[-3000:]
    assert worker.stop() == 0
    first.close()
    second.close()


def test_a_worker_killed_inside_a_transaction_publishes_it_once(streamed: Streamed) -> None:
    worker = streamed.start()
    conn = open_transaction(streamed.db, "big_b", 1, "killed")
    produced(streamed, "big_b")
    worker.kill9()  # its Kafka transaction is left open for the next start to abort
    worker = streamed.start()
    with conn.cursor() as cur:
        cur.execute("UPDATE big_b SET note = 'updated' WHERE id <= 10")
    conn.commit()
    conn.close()
    wait_caught_up(streamed.db, streamed.slot)
    assert streamed.rows("big_b") == streamed.table("big_b")
    assert len(streamed.messages("big_b")) == ROWS + 10
    assert worker.stop() == 0


def test_a_rolled_back_subtransaction_sends_its_transaction_to_the_spool(streamed: Streamed) -> None:
    worker = streamed.start()
    conn = open_transaction(streamed.db, "big_a", 1, "kept")
    with conn.cursor() as cur:
        cur.execute("SAVEPOINT s")
        cur.execute(
            "INSERT INTO big_a SELECT g, 'dropped' FROM generate_series(%s, %s) g", (ROWS + 1, 2 * ROWS)
        )
        cur.execute("ROLLBACK TO SAVEPOINT s")
        cur.execute("INSERT INTO big_a VALUES (-1, 'after the savepoint')")
    conn.commit()
    conn.close()
    wait_caught_up(streamed.db, streamed.slot)
    assert streamed.rows("big_a") == streamed.table("big_a")
    assert len(streamed.messages("big_a")) == 1 + ROWS + 1
    assert "produced at its commit from its spool: a subtransaction rolled back" in worker.log()
    assert worker.stop() == 0


def test_the_stream_asks_postgres_to_stream_large_transactions_sooner(streamed: Streamed) -> None:
    """At the server's default `logical_decoding_work_mem` (64MB) the worker's own walsender streams
    from 8MB on: a 14MB transaction, which 64MB would have sent whole at its commit, is streamed
    and produced while it runs."""
    name = query(streamed.db, "SELECT current_database()")[0][0]
    execute(
        streamed.db, sql.SQL("ALTER DATABASE {} RESET logical_decoding_work_mem").format(sql.Identifier(name))
    )
    worker = streamed.start()
    assert "logical_decoding_work_mem lowered from 64MB to 8MB" in worker.log()
    execute(streamed.db, "INSERT INTO big_b SELECT g, repeat('x', 100) FROM generate_series(1, 100000) g")
    wait_caught_up(streamed.db, streamed.slot)
    stats = "SELECT stream_txns FROM pg_stat_replication_slots WHERE slot_name = %s"
    # The walsender reports its decoding statistics as it goes.
    wait_for(lambda: query(streamed.db, stats, (streamed.slot,))[0][0] >= 1, "the transaction streamed", 30)
    assert "produced as they came" in worker.log()
    assert len(streamed.rows("big_b")) == 100_000
    assert worker.stop() == 0
