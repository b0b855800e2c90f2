"""The stream through the native producer puts in Kafka exactly what the stream through
confluent-kafka puts.

With the native producer (`--producer native`, and `auto` where it can be built) every message of
the stream goes through it: runs of row changes are encoded and produced from Rust in one call,
with their `bw.*` headers made there, everything else (truncates, DDL, re-snapshot rows) one
message at a time. Two workers stream the same WAL from two slots, one per producer; their topics
must hold the same messages (key, value, every header) in the same partitions and order, through
inserts, updates leaving TOASTed columns out, key changes, deletes, an unkeyed table (whose deletes
take a `bw.seq` but publish nothing), a truncate and a run longer than the worker's run limit. A
message over the size limit inside a run is a data error both handle alike under `--on-error`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from cdc_worker.core.encoding import native
from kafka_contract import control
from tests.integration.conftest import unique_name
from tests.integration.worker_harness import (
    Record,
    TopicReader,
    WorkerProcess,
    confirmed_flush,
    current_lsn,
    delete_topics_with_prefix,
    execute,
    wait_caught_up,
)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not native.NATIVE_AVAILABLE, reason=native.codec_description()),
]

PRODUCERS = ("native", "confluent")
OVERSIZE = "SELECT string_agg(md5(g::text), '') FROM generate_series(1, 40000) g"  # 1.28 MB of text


class Streams:
    """One worker per producer on the same database, each with its own slot and topic prefix."""

    def __init__(self, dsn: str, bootstrap: str, registry: str, log_dir: Path) -> None:
        self.dsn, self.bootstrap, self.registry, self.log_dir = dsn, bootstrap, registry, log_dir
        self.slots = {producer: unique_name(f"slot_{producer}") for producer in PRODUCERS}
        self.prefixes = {producer: unique_name(f"bw_{producer}") for producer in PRODUCERS}
        self.workers: dict[str, WorkerProcess] = {}

    def start(self, *extra: str) -> dict[str, WorkerProcess]:
        for producer in PRODUCERS:
            args = ["-d", self.dsn, "-s", self.slots[producer], "-p", self.prefixes[producer]]
            args += ["-b", self.bootstrap, "-r", self.registry, "-f", "json", "--status-interval", "1"]
            args += ["-T", "partitions=3", "--producer", producer, "-x", *extra]
            log = self.log_dir / f"worker-{producer}-{len(self.workers)}.log"
            self.workers[producer] = WorkerProcess(args, log).start()
        for worker in self.workers.values():
            worker.wait_streaming()
        return self.workers

    def caught_up(self) -> None:
        for slot in self.slots.values():
            wait_caught_up(self.dsn, slot)

    def stop(self) -> None:
        for worker in self.workers.values():
            worker.ensure_stopped()
        for prefix in self.prefixes.values():
            delete_topics_with_prefix(self.bootstrap, prefix)


@pytest.fixture
def streams(fresh_db: str, kafka_bootstrap: str, registry_url: str, tmp_path: Path) -> Iterator[Streams]:
    both = Streams(fresh_db, kafka_bootstrap, registry_url, tmp_path)
    yield both
    both.stop()


def held(
    reader: TopicReader, prefix: str, name: str
) -> list[tuple[int, bytes | None, bytes | None, dict[str, str]]]:
    """What topic `name` under `prefix` holds, partition by partition in offset order, the prefix
    in values (a control event names its table's topic) replaced by `<prefix>`. A message without
    a key (an unkeyed table's) goes to a random partition, so those are compared in `(bw.lsn,
    bw.seq)` order with the partition left out. Progress events are left out: each worker sends
    them on its own clock (what they carry is checked in test_lakehouse_watermark.py)."""
    records = [r for r in reader.read(f"{prefix}.{name}") if r.headers.get("bw.op") != control.PROGRESS]
    if all(r.key is None for r in records):
        records = sorted(records, key=lambda r: (r.lsn, r.seq))
    return [
        (-1 if r.key is None else r.partition, r.key, _unprefixed(r.value, prefix), r.headers)
        for r in records
    ]


def _unprefixed(value: bytes | None, prefix: str) -> bytes | None:
    return None if value is None else value.replace(prefix.encode(), b"<prefix>")


def test_the_native_producer_streams_what_confluent_kafka_streams(
    fresh_db: str, streams: Streams, reader: TopicReader
) -> None:
    execute(
        fresh_db,
        "CREATE TABLE t (id int PRIMARY KEY, body text, n numeric(10, 2), at timestamptz, tags text[])",
        # Stored out of line and uncompressed, so that an update of another column leaves it out.
        "ALTER TABLE t ALTER COLUMN body SET STORAGE EXTERNAL",
        "CREATE TABLE u (v int, w text)",
        "ALTER TABLE u REPLICA IDENTITY FULL",
    )
    workers = streams.start("-u")
    assert "producer: native" in workers["native"].log()
    execute(
        fresh_db,
        "INSERT INTO t SELECT g, 'b' || g, g / 3.0, timestamptz '2026-01-01 00:00+00' + g * interval '1 h', "
        "ARRAY['a', g::text, NULL] FROM generate_series(1, 300) g",
        "INSERT INTO t VALUES (1000, repeat(md5('toast'), 400), 1, now(), NULL)",
        "UPDATE t SET n = n + 1 WHERE id <= 50 OR id = 1000",
        "UPDATE t SET id = id + 5000 WHERE id BETWEEN 10 AND 20",
        "DELETE FROM t WHERE id BETWEEN 100 AND 150",
        "INSERT INTO t SELECT g, NULL, NULL, NULL, '{}' FROM generate_series(2001, 4500) g",
    )
    # One transaction across both tables: the runs end at each change of relation, and the
    # unkeyed table's delete takes a seq without publishing anything.
    execute(
        fresh_db,
        "BEGIN",
        "INSERT INTO t VALUES (9001, 'x', 1, now(), NULL), (9002, 'y', 2, now(), NULL)",
        "INSERT INTO u VALUES (1, 'one'), (2, 'two')",
        "UPDATE u SET w = 'uno' WHERE v = 1",
        "DELETE FROM u WHERE v = 2",
        "UPDATE t SET body = 'z' WHERE id = 9001",
        "COMMIT",
        "TRUNCATE u",
        "INSERT INTO u VALUES (3, 'three')",
    )
    streams.caught_up()
    for name in ("t", "u", "bottledwater.control"):
        native_side = held(reader, streams.prefixes["native"], name)
        confluent_side = held(reader, streams.prefixes["confluent"], name)
        assert native_side, f"nothing in topic {name}"
        assert native_side == confluent_side, name
    records = reader.read(f"{streams.prefixes['native']}.t")
    assert any(r.headers.get("bw.unchanged") == "body" for r in records), (
        "an update left the TOASTed body out"
    )
    assert sum(r.value is None for r in records) == 11 + 51, "key changes and deletes are tombstones"
    transaction = sorted(
        (r for r in records if r.json_key()["id"] in (9001, 9002)), key=lambda r: (r.lsn, r.seq)
    )
    # 9001, 9002, then u's insert x2, update, delete (numbered, not published on t), then t's update.
    assert [r.seq for r in transaction] == [0, 1, 6]
    # Each change right after a run of another relation is there too (it once joined a finished run).
    unkeyed = sorted(reader.read(f"{streams.prefixes['native']}.u"), key=lambda r: (r.lsn, r.seq))
    assert [(r.op, r.seq, r.json_value()) for r in unkeyed] == [
        ("c", 2, {"v": 1, "w": "one"}),
        ("c", 3, {"v": 2, "w": "two"}),
        ("u", 4, {"v": 1, "w": "uno"}),
        ("c", 0, {"v": 3, "w": "three"}),
    ]


def oversize_outcome(reader: TopicReader, prefix: str, worker: WorkerProcess) -> tuple[list[int], bool]:
    records: list[Record] = reader.read(f"{prefix}.t", 3)
    return sorted(r.json_key()["id"] for r in records), "skipped (--on-error=log)" in worker.log()


def test_a_message_over_the_size_limit_inside_a_run_is_skipped_alike_under_log(
    fresh_db: str, streams: Streams, reader: TopicReader
) -> None:
    execute(fresh_db, "CREATE TABLE t (id int PRIMARY KEY, body text)")
    workers = streams.start("-e", "log")
    execute(
        fresh_db,
        f"INSERT INTO t VALUES (1, 'small'), (2, ({OVERSIZE})), (3, 'small')",
        "INSERT INTO t VALUES (4, 'later')",
    )
    streams.caught_up()
    outcomes = {p: oversize_outcome(reader, streams.prefixes[p], workers[p]) for p in PRODUCERS}
    assert outcomes["native"] == outcomes["confluent"] == ([1, 3, 4], True)
    for worker in workers.values():
        assert worker.stop() == 0


def test_a_message_over_the_size_limit_inside_a_run_stops_both_alike_under_exit(
    fresh_db: str, streams: Streams, reader: TopicReader
) -> None:
    execute(fresh_db, "CREATE TABLE t (id int PRIMARY KEY, body text)")
    execute(fresh_db, "INSERT INTO t VALUES (0, 'before')")
    workers = streams.start()
    streams.caught_up()
    before = {p: confirmed_flush(fresh_db, streams.slots[p]) or 0 for p in PRODUCERS}
    # One run of 52 inserts, the 51st over the size limit.
    execute(
        fresh_db,
        f"INSERT INTO t SELECT g, CASE WHEN g = 51 THEN ({OVERSIZE}) ELSE 'small' END "
        "FROM generate_series(1, 52) g",
    )
    for producer, worker in workers.items():
        assert worker.wait_exit() == 1, producer
        log = worker.log()
        assert "message.max.bytes" in log and "public.t" in log and "commit LSN" in log, producer
        after = confirmed_flush(fresh_db, streams.slots[producer]) or 0
        assert before[producer] <= after < current_lsn(fresh_db), (
            f"{producer}: the failed transaction was acked"
        )
