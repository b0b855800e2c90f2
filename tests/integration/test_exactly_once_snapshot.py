"""The snapshot under `--delivery exactly-once`, killed twice, against the stack's real Postgres and
Kafka: every table's rows reach a `read_committed` consumer once, each table's changes only from
the point its rows were read at, and the compacted topics equal the tables.

Ten tables of 40,000 rows are read by two reader processes while a load updates, deletes and
inserts rows of every table (some transactions over two tables, some truncating one). The worker
and its readers are killed with SIGKILL once two tables are in Kafka, started again (it keeps the
slot and reads the tables Kafka lacks at a new exported snapshot), killed again once that snapshot
put a table in Kafka (the worker alone: its readers abort their tables themselves), and started a
third time, which finishes the snapshot and streams. The later starts run one reader, which must still fence
(abort) the transaction the first start's second reader left open.

A new slot over topics an earlier slot filled deletes the earlier snapshot's points and retracts the
rows deleted meanwhile with tombstones inside each table's own transaction.
"""

from __future__ import annotations

import random
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from psycopg2 import sql

from cdc_worker.core.encoding import native
from kafka_contract.topics import control_topic_name, snapshot_points_group, transactional_id
from tests.integration.test_exactly_once import Case, read_committed
from tests.integration.worker_harness import LoadThread, execute, query, run_command, wait_caught_up, wait_for

pytestmark = [pytest.mark.integration]

TABLES = tuple(f"t{index}" for index in range(10))
ROWS = 40_000


class TableLoad(LoadThread):
    """Small transactions on random tables in a thread until stopped: updates, deletes, inserts,
    now and then one over two tables, and a TRUNCATE of one table once."""

    def __init__(self, dsn: str) -> None:
        super().__init__(dsn, seed=11)
        self._next_id = ROWS + 1

    def transaction(self, cur: Any, rng: random.Random) -> None:
        for table in rng.sample(TABLES, rng.choice((1, 1, 1, 2))):
            name = sql.Identifier(table)
            low = rng.randrange(1, ROWS)
            update = sql.SQL("UPDATE {} SET v = v + 1 WHERE id BETWEEN %s AND %s").format(name)
            cur.execute(update, (low, low + 4))
            cur.execute(sql.SQL("DELETE FROM {} WHERE id = %s").format(name), (low + 7,))
            cur.execute(sql.SQL("INSERT INTO {} VALUES (%s, 0, 'new')").format(name), (self._next_id,))
            self._next_id += 1
        if self.transactions == 40:
            cur.execute("TRUNCATE t9")

    def pause(self, rng: random.Random) -> float:
        return 0.002


def snapshot_points(case: Case) -> dict[str, int]:
    """Per topic, the LSN its table's exactly-once snapshot was read at, as Kafka recorded it."""
    group = snapshot_points_group(transactional_id(case.slot, case.prefix))
    consumer = Consumer({"bootstrap.servers": case.bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        found = consumer.committed([TopicPartition(t, 0) for t in topics(case)], timeout=10)
    finally:
        consumer.close()
    return {tp.topic: tp.offset for tp in found if tp.offset >= 0}


def settled_points(case: Case) -> dict[str, int]:
    """`snapshot_points` once they stay the same for a second: a killed worker's reader processes
    may commit the table they were finishing before they notice they lost their parent."""
    points = snapshot_points(case)
    while True:
        time.sleep(1.0)
        again = snapshot_points(case)
        if again == points:
            return points
        points = again


def topics(case: Case) -> list[str]:
    return [f"{case.prefix}.{table}" for table in TABLES]


@pytest.fixture
def case(
    request: pytest.FixtureRequest, fresh_db: str, kafka_bootstrap: str, registry_url: str, tmp_path: Path
) -> Iterator[Case]:
    """Killed twice: the native producer and JSON (each reader's tables go through its transactional
    native producer); over full topics: confluent-kafka's and Avro (the tables whose old keys must
    be seen go through confluent-kafka's producer whatever `--producer` says)."""
    producer, fmt = getattr(request, "param", ("native", "json"))
    if producer == "native" and not native.NATIVE_AVAILABLE:
        pytest.skip(native.codec_description())
    one = Case(fresh_db, kafka_bootstrap, registry_url, tmp_path, producer=producer, fmt=fmt)
    one.args += ["--snapshot-workers", "2"]
    yield one
    one.stop()


def test_a_snapshot_killed_twice_publishes_every_row_once(case: Case) -> None:
    for table in TABLES:
        name = sql.Identifier(table)
        execute(
            case.dsn,
            sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, v int NOT NULL, pad text NOT NULL)").format(name),
            sql.SQL("INSERT INTO {} SELECT g, 0, repeat('x', 200) FROM generate_series(1, {}) g").format(
                name, sql.Literal(ROWS)
            ),
        )
    load = TableLoad(case.dsn).start()
    first = case.start()
    wait_for(lambda: len(snapshot_points(case)) >= 2, "two tables in Kafka", 120)
    first.kill9_all()  # its readers too, each leaving its table's transaction open
    held = settled_points(case)
    assert len(held) < len(TABLES), "killed after the snapshot completed: nothing left to finish"
    # The later starts run one reader: the first start's second reader left a table's transaction
    # open, which must be fenced (aborted) all the same, or read_committed consumers of its
    # partitions wait for the coordinator's timeout (15 minutes).
    second = case.start("--snapshot-workers", "1")
    wait_for(lambda: len(snapshot_points(case)) > len(held), "a table read at a new snapshot", 120)
    second.kill9()
    again = settled_points(case)
    assert len(again) < len(TABLES), "killed after the snapshot completed: nothing left to finish"
    assert max(again.values()) > max(held.values()), "no table was read at a new snapshot"
    assert f"stopped with {len(held)} of {len(TABLES)} tables in Kafka" in second.log(), second.log()[-3000:]
    assert "may have run 2 readers (--snapshot-workers is 1 now)" in second.log(), second.log()[-3000:]
    third = case.start("--snapshot-workers", "1")
    third.wait_streaming(180)
    assert f"stopped with {len(again)} of {len(TABLES)} tables in Kafka" in third.log(), third.log()[-3000:]
    time.sleep(2.0)
    load.stop()
    wait_caught_up(case.dsn, case.slot, timeout=120)
    assert third.stop() == 0

    points = snapshot_points(case)
    assert set(points) == set(topics(case))
    control = control_topic_name(case.prefix)
    messages = read_committed(case.bootstrap, [*topics(case), control])
    # Per topic, what it holds in LSN order: (lsn, 0 for a snapshot row, seq, key, row); a TRUNCATE
    # on the control topic (None, None) empties it at its place.
    history: dict[str, list[tuple[int, int, int, Any, Any]]] = defaultdict(list)
    for message in messages.get(control, []):
        event = case.decode(message.value())
        if isinstance(event, dict) and event.get("op") == "truncate":
            history[event["topic"]].append((int(event["lsn"]), 1, int(event["seq"]), None, None))
    changes: set[tuple[int, int]] = set()
    for table in TABLES:
        topic = f"{case.prefix}.{table}"
        read: set[Any] = set()
        for message in messages.get(topic, []):
            headers = {k: v.decode() for k, v in message.headers() or []}
            lsn, seq, key = int(headers["bw.lsn"]), int(headers["bw.seq"]), case.decode(message.key())
            ident = key["id"] if isinstance(key, dict) else key
            value = case.decode(message.value())
            row = None if value is None else (value["v"], value["pad"])
            if headers["bw.op"] == "r":
                assert ident not in read, f"{table}: row {ident} read twice"
                assert lsn == points[topic], f"{table}: a row read at {lsn}, its snapshot at {points[topic]}"
                read.add(ident)
                history[topic].append((lsn, 0, seq, ident, row))
                continue
            assert (lsn, seq) not in changes, f"change {(lsn, seq)} published twice"
            changes.add((lsn, seq))
            # A change committed before the table's rows were read is in them already.
            assert lsn >= points[topic], f"{table}: a change at {lsn} before its rows' {points[topic]}"
            history[topic].append((lsn, 1, seq, ident, row))
        latest: dict[Any, Any] = {}
        for _lsn, _kind, _seq, ident, row in sorted(history[topic], key=lambda entry: entry[:3]):
            if ident is None:
                latest.clear()  # the TRUNCATE
            elif row is None:
                latest.pop(ident, None)
            else:
                latest[ident] = row
        rows = query(case.dsn, sql.SQL("SELECT id, v, pad FROM {}").format(sql.Identifier(table)))
        assert latest == {ident: (v, pad) for ident, v, pad in rows}, (
            f"{table}: the topic differs from the table"
        )
    # The first start read the tables it committed at the slot's point, the later ones after it.
    by_point: dict[int, list[str]] = defaultdict(list)
    for topic, point in points.items():
        by_point[point].append(topic)
    assert len(by_point) >= 2 and len(by_point[min(by_point)]) == len(held)


@pytest.mark.parametrize("case", [("confluent", "avro")], indirect=True, ids=["confluent-avro"])
def test_a_new_slot_over_full_topics_retracts_gone_rows_in_each_tables_transaction(case: Case) -> None:
    for table in TABLES[:2]:
        name = sql.Identifier(table)
        execute(
            case.dsn,
            sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, v int NOT NULL, pad text NOT NULL)").format(name),
            sql.SQL("INSERT INTO {} SELECT g, 0, 'x' FROM generate_series(1, 1000) g").format(name),
        )
    first = case.start()
    first.wait_streaming(120)
    assert first.stop() == 0
    dropped = run_command(["-d", case.dsn, "-s", case.slot, "slot", "drop"])
    assert dropped.returncode == 0, dropped.stderr
    # Gone while nothing captured them: the new slot's snapshot must retract them from the topics.
    execute(case.dsn, "DELETE FROM t0 WHERE id <= 100", "UPDATE t1 SET v = 5 WHERE id <= 10")
    second = case.start()
    second.wait_streaming(120)
    assert second.stop() == 0
    log = second.log()
    assert "deleted consumer group" in log, log[-3000:]  # the first slot's points
    assert "topic " in log and "already holds 1000 keys" in log, log[-3000:]
    points = snapshot_points(case)
    messages = read_committed(case.bootstrap, topics(case)[:2])
    for table in TABLES[:2]:
        topic = f"{case.prefix}.{table}"
        latest: dict[Any, Any] = {}
        for message in messages[topic]:
            value = case.decode(message.value())
            key = case.decode(message.key())
            ident = key["id"] if isinstance(key, dict) else key
            if value is None:
                headers = {k: v.decode() for k, v in message.headers() or []}
                assert int(headers["bw.lsn"]) == points[topic], "a tombstone outside the new snapshot"
                latest.pop(ident, None)
            else:
                latest[ident] = value["v"]
        rows = query(case.dsn, sql.SQL("SELECT id, v FROM {}").format(sql.Identifier(table)))
        assert latest == dict(rows), f"{table}: the topic differs from the table"
