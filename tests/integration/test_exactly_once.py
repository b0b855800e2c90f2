"""`--delivery exactly-once` against the stack's real Postgres and Kafka.

Under a mixed load (inserts, updates, deletes, transactions over two tables, of one to a few hundred
rows, the larger ones streamed by Postgres before their commit) the worker is killed with SIGKILL
several times and started again; a `read_committed` consumer then sees every change exactly once: no
`(bw.lsn, bw.seq)` twice, every Postgres transaction's `bw.seq` numbers all there (none split, none
lost), as many changes as the load made, and the compacted topics equal the tables. Two workers on
one slot: the second fences the first, which stops with one line and exit 2, and streams on where
the first left off. A worker killed while a re-snapshot holds the slot at its watermark (Kafka's
commits ahead of the slot) finishes the re-snapshot after its restart and publishes no change twice.
"""

from __future__ import annotations

import json
import random
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from psycopg2 import sql

from cdc_worker.core.encoding import native
from kafka_contract.topics import control_topic_name, transactional_id
from tests.integration.conftest import unique_name
from tests.integration.worker_harness import (
    AvroDecoder,
    LoadThread,
    WorkerProcess,
    commit_events,
    confirmed_flush,
    current_lsn,
    delete_topics_with_prefix,
    execute,
    ordinary_headers,
    query,
    run_command,
    wait_caught_up,
    wait_for,
)

pytestmark = [pytest.mark.integration]

TABLES = ("accounts", "events")
KILLS = 3


class Load(LoadThread):
    """Transactions on both tables in a thread until stopped, counting the changes they made (an
    update that keeps the key is one change, as a delete or an insert is)."""

    def __init__(self, dsn: str) -> None:
        super().__init__(dsn, seed=7)
        self.changes = 0
        self._next_id = 1

    def transaction(self, cur: Any, rng: random.Random) -> None:
        self.changes += self._transaction(cur, rng)

    def pause(self, rng: random.Random) -> float:
        return float(rng.choice((0.0, 0.001, 0.005)))

    def _transaction(self, cur: Any, rng: random.Random) -> int:
        rows = rng.choice((1, 1, 2, 5, 20, 300))
        first, self._next_id = self._next_id, self._next_id + rows
        changes = 0
        cur.execute(
            "INSERT INTO accounts SELECT g, md5(g::text), 0 FROM generate_series(%s, %s) g",
            (first, first + rows - 1),
        )
        changes += cur.rowcount
        cur.execute(
            "INSERT INTO events (account, kind) SELECT g, 'open' FROM generate_series(%s, %s) g",
            (first, first + rows - 1),
        )
        changes += cur.rowcount
        if first > 50:
            low = rng.randrange(1, first - 20)
            cur.execute(
                "UPDATE accounts SET balance = balance + 1 WHERE id BETWEEN %s AND %s", (low, low + 9)
            )
            changes += cur.rowcount
            cur.execute("DELETE FROM events WHERE account BETWEEN %s AND %s", (low, low + 2))
            changes += cur.rowcount
        return int(changes)


def read_committed(bootstrap: str, topics: list[str]) -> dict[str, list[Any]]:
    """Every message a read_committed consumer sees in `topics`, in offset order per partition:
    read until each partition's position reaches its end (the last offsets are commit markers,
    which no message has)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bw-eos-{uuid.uuid4().hex}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "enable.partition.eof": False,
        }
    )
    try:
        metadata = consumer.list_topics(timeout=10)
        partitions = [
            TopicPartition(t, p, OFFSET_BEGINNING) for t in topics for p in metadata.topics[t].partitions
        ]
        ends = {
            (tp.topic, tp.partition): consumer.get_watermark_offsets(tp, timeout=10, cached=False)[1]
            for tp in partitions
        }
        consumer.assign(partitions)
        messages: dict[str, list[Any]] = defaultdict(list)
        deadline = time.monotonic() + 120

        def done() -> bool:
            positions = consumer.position([TopicPartition(t, p) for t, p in ends])
            return all(
                tp.offset >= ends[tp.topic, tp.partition] or ends[tp.topic, tp.partition] == 0
                for tp in positions
            )

        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                if done():
                    break
                continue
            assert message.error() is None, message.error()
            messages[message.topic() or ""].append(message)
        assert done(), "the read_committed consumer did not reach the topics' ends"
        return messages
    finally:
        consumer.close()


class Case:
    """One test's worker arguments (its own slot and topic prefix) and the workers it started."""

    def __init__(
        self, dsn: str, bootstrap: str, registry: str, log_dir: Path, *, producer: str, fmt: str
    ) -> None:
        self.dsn, self.bootstrap, self.registry = dsn, bootstrap, registry
        self.producer = producer
        self.slot = unique_name("eos")
        self.prefix = unique_name("bw_eos")
        self.log_dir = log_dir
        self.format = fmt
        self.args = [
            "-d", dsn, "-s", self.slot, "-p", self.prefix, "-b", bootstrap, "-r", registry, "-f", fmt,
            "--status-interval", "1", "-T", "partitions=3", "--producer", producer,
            "--delivery", "exactly-once",
        ]  # fmt: skip
        self.started: list[WorkerProcess] = []
        self._avro: AvroDecoder | None = None

    def start(self, *extra: str) -> WorkerProcess:
        worker = WorkerProcess([*self.args, *extra], self.log_dir / f"worker-{len(self.started)}.log").start()
        self.started.append(worker)
        return worker

    def topics(self) -> list[str]:
        return [f"{self.prefix}.{table}" for table in TABLES]

    def decode(self, data: bytes | None) -> Any:
        if data is None:
            return None
        if self.format == "json":
            return json.loads(data)
        if self._avro is None:
            self._avro = AvroDecoder(self.registry)
        return self._avro(data)

    def stop(self) -> None:
        for worker in self.started:
            worker.ensure_stopped()
        delete_topics_with_prefix(self.bootstrap, self.prefix)


def schema(dsn: str) -> None:
    """The two tables; and the database's logical_decoding_work_mem at its minimum, so that the
    load's larger transactions are streamed while they run (protocol 2: spooled, produced at their
    commit) among the others, decoded whole."""
    name = query(dsn, "SELECT current_database()")[0][0]
    execute(
        dsn,
        sql.SQL("ALTER DATABASE {} SET logical_decoding_work_mem = '64kB'").format(sql.Identifier(name)),
        "CREATE TABLE accounts (id int PRIMARY KEY, name text NOT NULL, balance int NOT NULL)",
        "CREATE TABLE events (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, account int NOT NULL, "
        "kind text NOT NULL)",
    )


@pytest.fixture(
    params=[
        pytest.param(("native", "json"), id="native-json"),
        pytest.param(("confluent", "avro"), id="confluent-avro"),
    ]
)
def case(
    request: pytest.FixtureRequest, fresh_db: str, kafka_bootstrap: str, registry_url: str, tmp_path: Path
) -> Iterator[Case]:
    producer, fmt = request.param
    if producer == "native" and not native.NATIVE_AVAILABLE:
        pytest.skip(native.codec_description())
    one = Case(fresh_db, kafka_bootstrap, registry_url, tmp_path, producer=producer, fmt=fmt)
    yield one
    one.stop()


def kafka_position(case: Case) -> int:
    """The position the worker's last Kafka commit recorded: its transactional id's group offset
    of the control topic's partition 0."""
    group = transactional_id(case.slot, case.prefix)
    consumer = Consumer({"bootstrap.servers": case.bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        (committed,) = consumer.committed([TopicPartition(control_topic_name(case.prefix), 0)], timeout=10)
    finally:
        consumer.close()
    return max(committed.offset, 0)


def assert_exactly_once(case: Case, load: Load) -> int:
    """Every change exactly once and every transaction whole to a `read_committed` consumer, the
    compacted topics equal to the tables; returns how many changes were produced before their
    commit (resolved from their commit events, as a consumer does)."""
    control = control_topic_name(case.prefix)
    messages = read_committed(case.bootstrap, [*case.topics(), control])
    commits = commit_events(messages.pop(control, []))
    seen: set[tuple[int, int]] = set()
    seqs: dict[int, set[int]] = defaultdict(set)
    total = early = 0
    for topic_messages in messages.values():
        for message in topic_messages:
            headers, produced_early = ordinary_headers(message, commits)
            early += produced_early
            if headers["bw.op"] == "r":
                continue  # a re-snapshot's row: no change of any transaction
            lsn, seq = int(headers["bw.lsn"]), int(headers["bw.seq"])
            assert (lsn, seq) not in seen, f"change ({lsn}, {seq}) seen twice"
            seen.add((lsn, seq))
            seqs[lsn].add(seq)
            total += 1
    assert total == load.changes, f"{total} changes in Kafka, the load made {load.changes}"
    # Every Postgres transaction whole: its changes numbered 0..n-1 with none missing.
    for lsn, numbers in seqs.items():
        assert numbers == set(range(len(numbers))), f"transaction {lsn} is not whole: {sorted(numbers)[:20]}"
    assert len(seqs) == load.transactions
    # The compacted topics equal the tables.
    for table in TABLES:
        latest: dict[Any, Any] = {}
        for message in messages.get(f"{case.prefix}.{table}", []):
            key = json.dumps(case.decode(message.key()), sort_keys=True)
            value = case.decode(message.value())
            if value is None:
                latest.pop(key, None)
            else:
                latest[key] = value
        rows = query(case.dsn, f"SELECT count(*) FROM {table}")[0][0]
        assert len(latest) == rows, f"{table}: {len(latest)} keys in Kafka, {rows} rows in Postgres"
    balances = dict(query(case.dsn, "SELECT id, balance FROM accounts"))
    compacted_accounts: dict[int, int] = {}
    for message in messages[f"{case.prefix}.accounts"]:
        value = case.decode(message.value())
        key = case.decode(message.key())
        ident = key["id"] if isinstance(key, dict) else key
        if value is None:
            compacted_accounts.pop(ident, None)
        else:
            compacted_accounts[ident] = value["balance"]
    assert compacted_accounts == balances
    return early


def test_killed_workers_publish_every_change_exactly_once(case: Case) -> None:
    schema(case.dsn)
    worker = case.start()
    worker.wait_streaming(60)
    load = Load(case.dsn).start()
    rng = random.Random(11)
    for _ in range(KILLS):
        time.sleep(rng.uniform(2.0, 5.0))
        worker.kill9()
        time.sleep(rng.uniform(0.0, 1.0))
        worker = case.start()
        worker.wait_streaming(60)
    time.sleep(2.0)
    load.stop()
    wait_caught_up(case.dsn, case.slot, timeout=120)
    assert worker.stop() == 0
    assert load.transactions > 50
    early = assert_exactly_once(case, load)
    # With the native producer the streamed ones were produced while they ran.
    assert (early > 0) == (case.producer == "native"), early


def test_a_second_worker_on_the_slot_fences_the_first(case: Case) -> None:
    schema(case.dsn)
    first = case.start()
    first.wait_streaming(60)
    load = Load(case.dsn).start()
    time.sleep(2.0)
    second = case.start()
    assert first.wait_exit(60) == 2
    fenced = [line for line in first.log().splitlines() if "fenced" in line and "ERROR" in line]
    assert fenced, first.log()[-3000:]
    assert "run one worker per slot" in fenced[-1]
    second.wait_streaming(60)
    time.sleep(2.0)
    load.stop()
    wait_caught_up(case.dsn, case.slot, timeout=120)
    assert second.stop() == 0
    assert_exactly_once(case, load)


# One producer: what is read again and not published is decided before either producer sees it.
@pytest.mark.parametrize("case", [pytest.param(("native", "json"), id="native-json")], indirect=True)
def test_a_resnapshot_killed_midway_finishes_and_no_change_is_published_twice(case: Case) -> None:
    schema(case.dsn)
    execute(case.dsn, "INSERT INTO events (account, kind) SELECT g, 'old' FROM generate_series(1, 20000) g")
    # -x: the table's rows reach Kafka only through the re-snapshot, read 200 rows a chunk.
    case.args += ["-x", "--resnapshot-chunk-rows", "200"]
    worker = case.start()
    worker.wait_streaming(60)
    load = Load(case.dsn).start()
    asked = run_command(["resnapshot", "-d", case.dsn, "-s", case.slot, "-p", case.prefix, "public.events"])
    assert asked.returncode == 0, asked.stderr
    # Killed once the slot acknowledged a watermark written after the first chunks, at a moment
    # when Kafka's recorded position is past the slot's: the re-snapshot holds the slot at its
    # watermark while the load's transactions are committed in Kafka past it.
    worker.wait_log("re-snapshot of public.events starts", 60)
    time.sleep(1.0)
    under_way = current_lsn(case.dsn)
    wait_for(
        lambda: (confirmed_flush(case.dsn, case.slot) or 0) >= under_way, "an acknowledged watermark", 60
    )
    wait_for(lambda: kafka_position(case) > (confirmed_flush(case.dsn, case.slot) or 0), "Kafka ahead", 60)
    worker.kill9()
    assert ", done" not in worker.log(), "killed too late to test a resumption"
    again = case.start()
    again.wait_log("re-snapshot of public.events goes on after", 120)
    log = again.log()
    assert "re-snapshot of public.events goes on after" in log, log[-3000:]
    assert "read again and not published" in log, log[-3000:]
    # The load inserts into the table being read, whose last chunk would chase it: stopped first.
    time.sleep(3.0)
    load.stop()
    again.wait_log(", done", 180)
    wait_caught_up(case.dsn, case.slot, timeout=120)
    assert again.stop() == 0
    assert_exactly_once(case, load)
