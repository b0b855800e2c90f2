"""`--snapshot-engine spark`: the first snapshot read by Spark tasks (local[2,4] on the stack), each
importing the slot's exported snapshot and publishing one ctid range, then the worker streaming
from the slot's consistent LSN. Each test has its own database, slots and topic prefix; each starts
one Spark driver inside the worker (10-20 s), so there are few of them and each checks much.
"""

from __future__ import annotations

import json
import subprocess
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg2
import pytest
from psycopg2 import sql

from cdc_worker.shell.snapshot.spark_ranges import FAKE_HANG_LINE
from tests.integration.conftest import unique_name
from tests.integration.lakehouse import LakeCase, assert_delta_equals_postgres
from tests.integration.test_type_catalog import create, insert
from tests.integration.type_catalog import CATALOG, SETUP
from tests.integration.worker_harness import (
    Record,
    TopicReader,
    WorkerProcess,
    WorkerStarter,
    execute,
    query,
    topic_prefix,
    wait_caught_up,
    wait_for,
)

StartWorker = Callable[..., WorkerProcess]
SPARK = ("--snapshot-engine", "spark", "--spark-master", "local[2,4]")
# Test-only failure injection, see cdc_worker/shell/snapshot/spark_ranges.py (FakeFailure).
FAKE_FAILURE_ENV = "BOTTLEDWATER_FAKE_TASK_FAILURE"


@pytest.fixture
def prefix(kafka_bootstrap: str) -> Iterator[str]:
    yield from topic_prefix(kafka_bootstrap, "bwspark")


@pytest.fixture
def start_worker(
    *, fresh_db: str, prefix: str, kafka_bootstrap: str, registry_url: str, tmp_path: Path
) -> Iterator[StartWorker]:
    args = ["-d", fresh_db, "-p", prefix, "-b", kafka_bootstrap, "-r", registry_url]
    starter = WorkerStarter([*args, "--status-interval", "1", "--snapshot-workers", "2"], tmp_path)

    def start(slot: str, *extra: str, fmt: str = "json", env: dict[str, str] | None = None) -> WorkerProcess:
        return starter.start("-s", slot, "-f", fmt, *extra, env=env)

    yield start
    starter.stop_all()


def snapshot_sessions(dsn: str) -> list[tuple[object, ...]]:
    """Sessions of the snapshot left in the database: range readers and the exporting walsender."""
    return query(
        dsn,
        "SELECT pid, application_name, backend_type FROM pg_stat_activity "
        "WHERE datname = current_database() AND pid <> pg_backend_pid() "
        "AND (application_name LIKE 'bottledwater-snapshot-%%' OR backend_type = 'walsender')",
    )


def compacted_with_toast(records: list[Record]) -> dict[str, object]:
    """What the merge makes of a topic: the last row per key, an unchanged TOAST column
    (`bw.unchanged`) keeping the value it had."""
    view: dict[str, dict[str, object]] = {}
    for record in sorted(records, key=lambda r: (r.lsn, r.seq, r.partition, r.offset)):
        assert record.key is not None
        key = json.dumps(json.loads(record.key), sort_keys=True)
        if record.value is None:
            view.pop(key, None)
            continue
        row = json.loads(record.value)
        unchanged = record.headers.get("bw.unchanged")
        for column in unchanged.split(",") if unchanged else ():
            row[column] = view[key][column]
        view[key] = row
    return dict(view)


def table_as_json(dsn: str, table: str, key: tuple[str, ...]) -> dict[str, object]:
    """The table as its compacted topic should hold it: canonical key JSON -> row as JSON."""
    rows = query(dsn, sql.SQL("SELECT row_to_json(t)::text FROM {} t").format(sql.Identifier(table)))
    view: dict[str, object] = {}
    for (text,) in rows:
        row = json.loads(text)
        view[json.dumps({k: row[k] for k in key}, sort_keys=True)] = row
    return view


WRITES = (
    "INSERT INTO big SELECT g, repeat('n', 80) FROM generate_series(100000 + {i} * 20, 100019 + {i} * 20) g",
    "UPDATE big SET note = 'changed ' || id WHERE id % 997 = {i}",
    "DELETE FROM big WHERE id % 1009 = {i}",
    "INSERT INTO pairs VALUES ({i} + 1000, 'new', 1)",
    "UPDATE pairs SET v = v + 1 WHERE a = {i}",
    "DELETE FROM pairs WHERE a = {i} + 500 AND b = 'x'",
    "UPDATE docs SET body = md5({i}::text) || body WHERE id = {i} % 50 + 1",
    "UPDATE docs SET title = 'retitled' WHERE id = {i} % 50 + 20",
    "UPDATE sparse SET note = 'changed' WHERE id = 180000 + {i} * 7",
    "DELETE FROM sparse WHERE id = 239000 + {i}",
    "INSERT INTO sparse VALUES ({i}, 'back')",  # below the histogram: the open-ended first range
)


def test_spark_snapshot_with_concurrent_writes_and_a_lost_task_equals_postgres(
    *,
    fresh_db: str,
    start_worker: StartWorker,
    reader: TopicReader,
    prefix: str,
    request: pytest.FixtureRequest,
    tmp_path: Path,
) -> None:
    execute(
        fresh_db,
        "CREATE TABLE big (id int PRIMARY KEY, note text)",
        # ~6 MB of heap: several 1 MB ranges (MIN_PAGES_PER_CHUNK) for the two local cores.
        "INSERT INTO big SELECT g, repeat('n', 80) FROM generate_series(1, 60000) g",
        "CREATE TABLE pairs (a int, b text, v int, PRIMARY KEY (a, b))",
        "INSERT INTO pairs SELECT g, s, g FROM generate_series(1, 800) g, unnest(ARRAY['x', 'y']) s",
        "CREATE TABLE docs (id int PRIMARY KEY, title text, body text)",
        # EXTERNAL: stored out of line, uncompressed, so every body is a TOAST value.
        "ALTER TABLE docs ALTER body SET STORAGE EXTERNAL",
        "INSERT INTO docs SELECT g, 'doc ' || g, repeat(md5(g::text), 200) FROM generate_series(1, 100) g",
        # A heap three quarters empty after a mass delete, its rows all in its last pages: equal
        # ctid ranges would leave them to one task, so it is read by ranges of its key.
        "CREATE TABLE sparse (id int PRIMARY KEY, note text)",
        "INSERT INTO sparse SELECT g, repeat('s', 20) FROM generate_series(1, 240000) g",
        "DELETE FROM sparse WHERE id <= 180000",
        "VACUUM ANALYZE sparse",
        "ANALYZE",
    )
    slot = unique_name("slot")
    stop_writing = threading.Event()
    written: list[int] = []
    errors: list[BaseException] = []

    def write() -> None:
        conn = psycopg2.connect(fresh_db)
        conn.autocommit = True
        try:
            i = 0
            while not stop_writing.is_set() and i < 400:
                i += 1
                with conn.cursor() as cur:
                    cur.execute(WRITES[i % len(WRITES)].replace("{i}", str(i)))
                written.append(i)
        except BaseException as exc:  # handed to the test, which fails with it
            errors.append(exc)
        finally:
            conn.close()

    # The first attempt of every range of `big` dies half-way, after Kafka took part of it.
    worker = start_worker(slot, *SPARK, "-T", "partitions=2", env={FAKE_FAILURE_ENV: "public.big"})
    writer = threading.Thread(target=write)
    writer.start()
    try:
        worker.wait_streaming(timeout=300)
    finally:
        stop_writing.set()
        writer.join()
    assert errors == [] and written, "the writer ran during the snapshot"
    execute(fresh_db, "UPDATE big SET note = 'after' WHERE id = 5", "DELETE FROM pairs WHERE a = 7")
    wait_caught_up(fresh_db, slot)

    log = worker.log()
    assert "spark snapshot of 4 table(s)" in log and "spark snapshot complete" in log
    assert "public.sparse read by ranges of its key id (live rows fill" in log
    # The job's progress: each table as it is done, then tables, ranges, rows and the rate.
    for table in ("big", "pairs", "docs", "sparse"):
        assert f"spark snapshot: public.{table} done, " in log, table
    assert "spark snapshot: 4/4 tables, " in log and " rows/s" in log
    assert worker.process is not None
    children = subprocess.run(["ps", "--ppid", str(worker.process.pid), "-o", "comm="], capture_output=True)
    assert b"java" not in children.stdout, "the Spark driver's JVM is gone while the worker streams"
    keys = {"big": ("id",), "pairs": ("a", "b"), "docs": ("id",), "sparse": ("id",)}
    for table, key in keys.items():
        records = reader.read(f"{prefix}.{table}")
        snapshot = [r for r in records if r.op == "r"]
        assert {r.lsn for r in snapshot} == {snapshot[0].lsn}, table
        assert all(r.lsn > snapshot[0].lsn for r in records if r.op != "r"), table
        assert compacted_with_toast(records) == table_as_json(fresh_db, table, key), table
    big = [r for r in reader.read(f"{prefix}.big") if r.op == "r"]
    repeated = Counter(r.key for r in big)
    assert max(repeated.values()) == 2, "the lost first attempts published part of their ranges twice"
    assert worker.stop() == 0

    # The Delta mirrors merged from those topics equal Postgres too. The merge's session starts
    # only now, the worker's Spark driver long gone (two JVMs would crowd the machine).
    spark = request.getfixturevalue("spark")
    lake = LakeCase(
        spark,
        fresh_db,
        request.getfixturevalue("kafka_bootstrap"),
        request.getfixturevalue("registry_url"),
        tmp_path,
        prefix=prefix,
        slot=slot,
    )
    for table in keys:
        run = lake.merge(table, "json")
        assert_delta_equals_postgres(spark, run.path, fresh_db, table)


def test_spark_snapshot_writes_the_bytes_of_the_worker_snapshot(
    fresh_db: str, start_worker: StartWorker, reader: TopicReader, prefix: str, registry_url: str
) -> None:
    chosen = {"integers", "numerics", "floats", "strings", "temporal", "arrays", "custom_types"}
    tables = [t for t in CATALOG if t.name in chosen]
    assert len(tables) == len(chosen) and all(t.schema == "public" for t in tables)
    conn = psycopg2.connect(fresh_db)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            for statement in SETUP:
                cur.execute(statement)
        for table in tables:
            create(conn, table)
            insert(conn, table)
    finally:
        conn.close()
    names = ",".join(f"{t.schema}.{t.name}" for t in tables)
    common = ("--tables", names, "-T", "partitions=3")
    by_worker = start_worker(unique_name("slot"), *common, fmt="avro")
    by_worker.wait_streaming(timeout=300)
    assert by_worker.stop() == 0
    by_spark = start_worker(unique_name("slot"), *common, *SPARK, fmt="avro")
    by_spark.wait_streaming(timeout=300)
    assert "spark snapshot complete" in by_spark.log()
    assert by_spark.stop() == 0

    def content(records: list[Record]) -> Counter[tuple[object, ...]]:
        # The LSN and the snapshot time differ between two slots; everything else is the contract.
        return Counter(
            (r.partition, r.key, r.value, r.headers["bw.op"], r.headers["bw.seq"], r.headers["bw.xid"])
            for r in records
        )

    for table in tables:
        records = reader.read(f"{prefix}.{table.name}")
        lsns = sorted({r.lsn for r in records})
        assert len(lsns) == 2, table.name  # one consistent LSN per snapshot, nothing streamed
        first = [r for r in records if r.lsn == lsns[0]]
        second = [r for r in records if r.lsn == lsns[1]]
        assert len(first) == table.rows, table.name
        assert content(second) == content(first), table.name


def test_a_failing_spark_job_drops_the_slot_and_leaves_no_session(
    fresh_db: str, start_worker: StartWorker
) -> None:
    execute(
        fresh_db,
        "CREATE TABLE doomed (id int PRIMARY KEY, note text)",
        "INSERT INTO doomed SELECT g, 'x' FROM generate_series(1, 5000) g",
    )
    slot = unique_name("slot")
    worker = start_worker(slot, *SPARK, env={FAKE_FAILURE_ENV: "public.doomed:always"})
    assert worker.wait_exit(timeout=300) == 1
    failures = [line for line in worker.log().splitlines() if "the Spark snapshot failed" in line]
    assert len(failures) == 1
    assert "FakeExecutorLoss" in failures[0] and "start the worker again" in failures[0]
    assert query(fresh_db, "SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (slot,)) == []
    # The killed task's backend goes when it sees its socket closed: waited for, not timed.
    wait_for(lambda: snapshot_sessions(fresh_db) == [], "no session of the snapshot left", timeout=30)


def test_a_stop_during_the_spark_job_cancels_it_and_drops_the_slot(
    fresh_db: str, start_worker: StartWorker
) -> None:
    execute(
        fresh_db,
        "CREATE TABLE held (id int PRIMARY KEY, note text)",
        "INSERT INTO held SELECT g, 'x' FROM generate_series(1, 5000) g",
    )
    slot = unique_name("slot")
    # The range's task hangs after its first batch, its connection open in the exported snapshot.
    worker = start_worker(slot, *SPARK, env={FAKE_FAILURE_ENV: "public.held:hang"})
    worker.wait_log(FAKE_HANG_LINE, timeout=300)
    assert worker.stop() == 0
    assert "stopped during the snapshot" in worker.log()
    assert query(fresh_db, "SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (slot,)) == []
    # The killed task's backend goes when it sees its socket closed: waited for, not timed.
    wait_for(lambda: snapshot_sessions(fresh_db) == [], "no session of the snapshot left", timeout=30)


def test_a_spark_snapshot_over_topics_that_hold_rows_tombstones_the_keys_gone_since(
    fresh_db: str, start_worker: StartWorker, reader: TopicReader, prefix: str
) -> None:
    execute(
        fresh_db,
        "CREATE TABLE kept (id int PRIMARY KEY, note text)",
        # ~2 MB: a few ranges, so the keys found again are gathered from several tasks.
        "INSERT INTO kept SELECT g, repeat('k', 80) FROM generate_series(1, 20000) g",
        "CREATE TABLE emptied (id int PRIMARY KEY)",
        "INSERT INTO emptied SELECT generate_series(1, 50)",
    )
    first_slot = unique_name("slot")
    first = start_worker(first_slot)  # the worker's own snapshot fills the topics
    first.wait_streaming(timeout=300)
    assert first.stop() == 0
    # The slot is dropped (nothing captures what follows), then rows go and change meanwhile.
    execute(
        fresh_db,
        sql.SQL("SELECT pg_drop_replication_slot({})").format(sql.Literal(first_slot)),
        "DELETE FROM kept WHERE id % 7 = 0",
        "UPDATE kept SET note = 'changed' WHERE id % 11 = 0",
        "DELETE FROM emptied",
    )
    second = start_worker(unique_name("slot"), *SPARK)
    second.wait_streaming(timeout=300)
    log = second.log()
    assert "spark snapshot complete" in log
    assert f"2857 keys of {prefix}.kept are gone" in log  # ids 7, 14, ... 19999
    assert f"50 keys of {prefix}.emptied are gone" in log

    for table in ("kept", "emptied"):
        records = reader.read(f"{prefix}.{table}")
        snapshot_lsn = max(r.lsn for r in records)
        tombstones = [r for r in records if r.value is None]
        assert tombstones and {(r.op, r.lsn) for r in tombstones} == {("d", snapshot_lsn)}, table
        assert compacted_with_toast(records) == table_as_json(fresh_db, table, ("id",)), table
    assert second.stop() == 0
