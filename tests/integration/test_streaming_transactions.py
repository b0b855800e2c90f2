"""Large transactions streamed while they run (Postgres 14+, pgoutput protocol 2, `streaming 'on'`,
the worker's default): spooled, published at their commit in commit order, aborts discarded.

Each test sets `logical_decoding_work_mem` to its minimum (64kB) on its own database, so that a few
thousand rows are streamed, and checks in `pg_stat_replication_slots` that they were.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import psycopg2
import pytest
from psycopg2 import sql

from tests.integration.conftest import unique_name
from tests.integration.worker_harness import (
    Record,
    TopicReader,
    WorkerProcess,
    WorkerStarter,
    compacted,
    confirmed_flush,
    delete_topics_with_prefix,
    execute,
    query,
    run_command,
    topic_prefix,
    wait_caught_up,
    wait_for,
)

ROWS = 3000  # at 64kB of logical_decoding_work_mem, streamed in several chunks


@pytest.fixture
def prefix(kafka_bootstrap: str) -> Iterator[str]:
    yield from topic_prefix(kafka_bootstrap, "bw")


@pytest.fixture
def db(fresh_db: str) -> str:
    """A database whose walsenders stream any transaction past 64kB of changes."""
    name = query(fresh_db, "SELECT current_database()")[0][0]
    execute(
        fresh_db,
        sql.SQL("ALTER DATABASE {} SET logical_decoding_work_mem = '64kB'").format(sql.Identifier(name)),
        "CREATE TABLE items (id int PRIMARY KEY, payload text, n int)",
    )
    return fresh_db


class Harness:
    def __init__(self, db: str, prefix: str, kafka: str, registry: str, tmp_path: Path) -> None:
        self.db, self.prefix = db, prefix
        self.slot = unique_name("slot")
        self.spool_dir = tmp_path / "spool"
        args = ["-d", db, "-s", self.slot, "-p", prefix, "-b", kafka, "-r", registry, "-f", "json"]
        args += ["--status-interval", "1", "-T", "partitions=1", "--spool-dir", str(self.spool_dir)]
        args += ["--spool-memory-mb", "1"]  # a few thousand rows reach the spool files
        self.workers = WorkerStarter(args, tmp_path)

    def start(self) -> WorkerProcess:
        worker = self.workers.start()
        worker.wait_streaming()
        return worker

    def streamed_transactions(self) -> int:
        rows = query(
            self.db, "SELECT stream_txns FROM pg_stat_replication_slots WHERE slot_name = %s", (self.slot,)
        )
        return int(rows[0][0]) if rows else 0

    def topic(self) -> str:
        return f"{self.prefix}.items"


@pytest.fixture
def harness(
    db: str, prefix: str, kafka_bootstrap: str, registry_url: str, tmp_path: Path
) -> Iterator[Harness]:
    h = Harness(db, prefix, kafka_bootstrap, registry_url, tmp_path)
    yield h
    h.workers.stop_all()


def table_as_json(dsn: str) -> dict[str, object]:
    rows = query(dsn, "SELECT id, row_to_json(t)::text FROM items t")
    return {json.dumps({"id": key}): json.loads(value) for key, value in rows}


def records_of(reader: TopicReader, harness: Harness) -> list[Record]:
    wait_caught_up(harness.db, harness.slot)
    return reader.read(harness.topic())


def assert_topic_equals_postgres(records: list[Record], harness: Harness) -> None:
    assert compacted(records) == table_as_json(harness.db)
    by_commit: dict[int, list[int]] = {}
    for record in records:
        by_commit.setdefault(record.lsn, []).append(record.seq)
    for lsn, seqs in by_commit.items():  # each delivery of a transaction numbers it 0..n-1
        assert sorted(set(seqs)) == list(range(len(set(seqs)))), f"seq of {lsn} has gaps"


def insert_rows(cur: psycopg2.extensions.cursor, first: int, count: int, tag: str) -> None:
    cur.execute(
        "INSERT INTO items SELECT g, %s || repeat('x', 40), g FROM generate_series(%s, %s) g",
        (tag, first, first + count - 1),
    )


def connect(dsn: str) -> psycopg2.extensions.connection:
    conn = psycopg2.connect(dsn)
    conn.autocommit = False
    return conn


def test_interleaved_streamed_transactions_abort_and_savepoint(harness: Harness, reader: TopicReader) -> None:
    worker = harness.start()
    a, b, c, d = (connect(harness.db) for _ in range(4))
    try:
        with a.cursor() as ca, b.cursor() as cb, c.cursor() as cc, d.cursor() as cd:
            insert_rows(ca, 1, ROWS, "a")  # A starts first ...
            insert_rows(cb, 100_001, ROWS, "b")
            insert_rows(cc, 200_001, ROWS, "c")  # C aborts: nothing of it may appear
            insert_rows(cd, 300_001, ROWS, "d")
            cd.execute("SAVEPOINT s1")
            insert_rows(cd, 310_001, ROWS, "d-rolled-back")
            cd.execute("UPDATE items SET n = -1 WHERE id BETWEEN 300001 AND 300100")
            cd.execute("ROLLBACK TO SAVEPOINT s1")
            cd.execute("SAVEPOINT s2")
            insert_rows(cd, 320_001, ROWS, "d-kept")
            cd.execute("RELEASE SAVEPOINT s2")
            ca.execute("UPDATE items SET n = n + 1 WHERE id <= 100")
            cb.execute("DELETE FROM items WHERE id BETWEEN 100001 AND 100050")
        wait_for(lambda: harness.streamed_transactions() >= 1, "a streamed transaction", 120)
        before = confirmed_flush(harness.db, harness.slot) or 0
        b.commit()  # ... but B commits first
        c.rollback()
        d.commit()
        a.commit()
    finally:
        for conn in (a, b, c, d):
            conn.close()
    records = records_of(reader, harness)
    # A, B and D at least (C may end before it streams)
    wait_for(lambda: harness.streamed_transactions() >= 3, "three streamed transactions", 60)
    assert_topic_equals_postgres(records, harness)
    ids = {json.loads(r.key)["id"] for r in records if r.key is not None}
    assert not ids & set(range(200_001, 200_001 + ROWS)), "the aborted transaction was published"
    assert not ids & set(range(310_001, 310_001 + ROWS)), "the rolled-back subtransaction was published"
    first_offset: dict[int, int] = {}
    for record in records:
        first_offset.setdefault(record.lsn, record.offset)
    commit_order = sorted(first_offset, key=first_offset.__getitem__)
    assert commit_order == sorted(commit_order), "transactions published in commit order"
    assert all(lsn > before for lsn in commit_order)
    assert worker.stop() == 0
    assert list(harness.spool_dir.glob("bw-spool-*")) == []


def test_a_schema_change_inside_a_streamed_transaction(harness: Harness, reader: TopicReader) -> None:
    """Changes are encoded as their chunk arrives: those before an ALTER under the old shape, those
    after it under the new one, and a transaction committing meanwhile under the old one."""
    worker = harness.start()
    conn = connect(harness.db)
    try:
        with conn.cursor() as cur:
            insert_rows(cur, 1, ROWS, "before")
            wait_for(lambda: harness.streamed_transactions() >= 1, "a streamed transaction", 120)
            execute(harness.db, "INSERT INTO items VALUES (900000, 'meanwhile', 1)")
            cur.execute("ALTER TABLE items ADD COLUMN extra text DEFAULT 'new'")
            insert_rows(cur, 10_001, ROWS, "after")
            cur.execute("UPDATE items SET extra = 'updated' WHERE id <= 100")
            cur.execute("DELETE FROM items WHERE id BETWEEN 101 AND 150")
        conn.commit()
    finally:
        conn.close()
    records = records_of(reader, harness)
    table = table_as_json(harness.db)
    topic = compacted(records)
    assert topic.keys() == table.keys()
    for key, row in table.items():
        assert isinstance(row, dict)
        if 150 < row["id"] <= ROWS or row["id"] == 900000:  # written before the ALTER: no `extra`
            assert topic[key] == {k: v for k, v in row.items() if k != "extra"}, key
        else:
            assert topic[key] == row, key
    assert worker.stop() == 0
    assert list(harness.spool_dir.glob("bw-spool-*")) == []


def resnapshot_done(reader: TopicReader, harness: Harness) -> bool:
    control = f"{harness.prefix}.bottledwater.control"
    if reader.count(control) == 0:
        return False
    reports = [r.json_value() for r in reader.read(control) if r.op.startswith("snapshot_")]
    return any(r["op"] == "snapshot_done" and r["table"] == "items" for r in reports)


@pytest.mark.parametrize("ending", ["commit", "rollback"])
def test_a_resnapshot_asked_while_a_streamed_transaction_is_open(
    harness: Harness, reader: TopicReader, ending: str
) -> None:
    """That transaction's changes were spooled without their keys, which a chunk needs: no chunk is
    read until it ends, by its commit or by its abort (the database then stays idle)."""
    execute(harness.db, "INSERT INTO items SELECT g, 'v' || g, 0 FROM generate_series(1, 2000) g")
    worker = harness.start()
    conn = connect(harness.db)
    try:
        with conn.cursor() as cur:
            cur.execute("UPDATE items SET n = n + 1000, payload = payload || repeat('y', 40)")
            wait_for(lambda: harness.streamed_transactions() >= 1, "a streamed transaction", 120)
            asked = run_command(
                ["resnapshot", "-d", harness.db, "-s", harness.slot, "-p", harness.prefix, "public.items"]
            )
            assert asked.returncode == 0, asked.stderr
            cur.execute("UPDATE items SET n = n + 1 WHERE id <= 500")
        if ending == "commit":
            conn.commit()
        else:
            conn.rollback()
    finally:
        conn.close()
    wait_for(lambda: resnapshot_done(reader, harness), "the re-snapshot of items to finish", 120)
    records = records_of(reader, harness)
    assert compacted(records) == table_as_json(harness.db)
    assert any(r.op == "r" for r in records[2000:]), "the re-snapshot published rows"
    assert worker.stop() == 0


def test_kill_9_in_the_middle_of_a_streamed_transaction(harness: Harness, reader: TopicReader) -> None:
    worker = harness.start()
    conn = connect(harness.db)
    try:
        with conn.cursor() as cur:
            insert_rows(cur, 1, ROWS * 10, "big")  # past the 1MB of spool memory
            wait_for(lambda: harness.streamed_transactions() >= 1, "the transaction streamed", 120)
            wait_for(lambda: list(harness.spool_dir.glob("bw-spool-*")), "a spool file", 120)
            worker.kill9()
            assert reader.count(harness.topic()) == 0, "published before its commit"
            worker = harness.start()  # the spool files of the killed worker are removed
            insert_rows(cur, ROWS * 10 + 1, ROWS, "big, after the restart")
            cur.execute("UPDATE items SET n = 0 WHERE id % 7 = 0")
        conn.commit()
    finally:
        conn.close()
    records = records_of(reader, harness)
    assert_topic_equals_postgres(records, harness)
    assert len(table_as_json(harness.db)) == ROWS * 11
    assert worker.stop() == 0
    assert list(harness.spool_dir.glob("bw-spool-*")) == []


def test_kill_9_at_the_commit_of_a_streamed_transaction(harness: Harness, reader: TopicReader) -> None:
    """Killed while the commit is published (in bulk by the native producer): the slot is not
    acknowledged past a transaction Kafka does not hold whole, and the restarted worker
    republishes it whole, numbered from 0 again."""
    worker = harness.start()
    execute(harness.db, "INSERT INTO items VALUES (0, 'before', 0)")
    wait_caught_up(harness.db, harness.slot)
    already = reader.count(harness.topic())
    conn = connect(harness.db)
    try:
        with conn.cursor() as cur:
            insert_rows(cur, 1, ROWS * 5, "big")
            cur.execute("DELETE FROM items WHERE id % 3 = 0")
        wait_for(lambda: harness.streamed_transactions() >= 1, "the transaction streamed", 120)
        conn.commit()
    finally:
        conn.close()
    # Killed as soon as the commit's first messages reach Kafka (or after, if it was quicker).
    wait_for(lambda: reader.count(harness.topic()) > already, "the commit being published", 120)
    worker.kill9()
    acked = confirmed_flush(harness.db, harness.slot) or 0
    before_restart = reader.read(harness.topic())
    big = before_restart[already].lsn
    events = ROWS * 5 + ROWS * 5 // 3 + 1  # the inserts, then the deletes of every third row and of 0
    if acked > big:
        assert whole_delivery(before_restart, big) == list(range(events)), "acknowledged, not in Kafka"
    worker = harness.start()
    records = records_of(reader, harness)
    assert_topic_equals_postgres(records, harness)
    assert whole_delivery(records, big) == list(range(events))
    assert worker.stop() == 0
    assert list(harness.spool_dir.glob("bw-spool-*")) == []


def whole_delivery(records: list[Record], lsn: int) -> list[int]:
    """The `bw.seq` of the last delivery of the transaction committed at `lsn` (from its last
    message numbered 0 on; one partition): 0..n-1 when it was published whole."""
    seqs = [r.seq for r in records if r.lsn == lsn]
    last_start = len(seqs) - 1 - seqs[::-1].index(0) if 0 in seqs else 0
    return seqs[last_start:]


# -- streamed and protocol 1 alike, for both codecs ----------------------------------------------

MODES = [("streamed", "native"), ("protocol1", "native"), ("streamed", "python"), ("protocol1", "python")]


def toasted(count: int) -> str:
    """`count` rows for `others` whose doc (8 kB of md5 text, which does not compress) is TOASTed."""
    return (
        f"INSERT INTO others SELECT g, (SELECT string_agg(md5(g::text || i::text), '') "
        f"FROM generate_series(1, 256) i), g FROM generate_series(1, {count}) g"
    )


def test_streamed_and_protocol_1_publish_identical_topics_with_both_codecs(
    db: str, kafka_bootstrap: str, registry_url: str, tmp_path: Path, reader: TopicReader
) -> None:
    """One workload read by four workers at once (each with its own slot and topics, Avro):
    streamed in progress or with protocol 1, native or Python codec. Every topic holds the same
    messages, byte for byte, headers included: rolled-back savepoints, a key change, unchanged
    TOAST columns, two tables interleaved, another streamed transaction aborted in between."""
    execute(db, "CREATE TABLE others (id int PRIMARY KEY, doc text, n int)", toasted(20))
    prefixes = {mode: unique_name("bw") for mode in MODES}
    starters: list[WorkerStarter] = []
    slots: dict[tuple[str, str], str] = {}
    try:
        for mode in MODES:
            slots[mode] = unique_name("slot")
            args = ["-d", db, "-s", slots[mode], "-p", prefixes[mode], "-b", kafka_bootstrap, "-r"]
            args += [registry_url, "-f", "avro", "-x", "--status-interval", "1", "-T", "partitions=1"]
            args += ["--codec", mode[1], "--spool-dir", str(tmp_path / "spool"), "--spool-memory-mb", "1"]
            if mode[0] == "protocol1":
                args.append("--no-stream-in-progress")
            (tmp_path / "-".join(mode)).mkdir()
            starters.append(WorkerStarter(args, tmp_path / "-".join(mode)))
        workers = [starter.start() for starter in starters]
        for worker in workers:
            worker.wait_streaming()
        big, aborted = connect(db), connect(db)
        try:
            with big.cursor() as cur, aborted.cursor() as other:
                insert_rows(cur, 1, ROWS, "a")
                cur.execute("SAVEPOINT s1")
                insert_rows(cur, 10_001, ROWS, "rolled back")
                cur.execute("UPDATE items SET n = -1 WHERE id <= 100")
                cur.execute("ROLLBACK TO SAVEPOINT s1")
                insert_rows(other, 50_001, ROWS, "aborted")  # streamed too, then rolled back
                cur.execute("UPDATE others SET n = n + 1")  # doc unchanged: TOASTed, not sent
                execute(db, "INSERT INTO others VALUES (1000, 'committed meanwhile', 0)")
                aborted.rollback()
                cur.execute("UPDATE items SET id = id + 100000 WHERE id <= 20")  # key change
                cur.execute("UPDATE items SET payload = 'updated' WHERE id BETWEEN 21 AND 40")
                cur.execute("DELETE FROM others WHERE id <= 5")
                cur.execute("DELETE FROM items WHERE id BETWEEN 41 AND 60")
                insert_rows(cur, 20_001, ROWS, "b")
            big.commit()
        finally:
            big.close()
            aborted.close()
        for mode in MODES:
            wait_caught_up(db, slots[mode])
        streamed = query(
            db, "SELECT count(*) FROM pg_stat_replication_slots WHERE slot_name = %s AND stream_txns > 0",
            (slots["streamed", "native"],),
        )  # fmt: skip
        assert streamed[0][0] == 1, "the transaction was not streamed in progress"
        topics: dict[tuple[str, str], list[tuple[str, bytes | None, bytes | None, dict[str, str]]]] = {}
        for mode in MODES:
            topics[mode] = [
                (r.topic.removeprefix(prefixes[mode]), r.key, r.value, r.headers)
                for table in ("items", "others")
                for r in reader.read(f"{prefixes[mode]}.{table}")
            ]
        expected = topics["protocol1", "python"]
        assert len(expected) > 2 * ROWS + 20
        assert any("bw.unchanged" in headers for *_, headers in expected), "no unchanged TOAST column"
        for mode in MODES:
            assert topics[mode] == expected, mode
        for worker in workers:
            assert worker.stop() == 0
    finally:
        for starter in starters:
            starter.stop_all()
        for prefix in prefixes.values():  # the slots go with the database (`fresh_db`)
            delete_topics_with_prefix(kafka_bootstrap, prefix)
