"""The failover drill, on Postgres 17 and 18: a primary and a hot standby that syncs slots
(`sync_replication_slots`, and `synchronized_standby_slots` on the primary), the worker streaming
through a multi-host DSN (`target_session_attrs=read-write`) under concurrent writes (inserts,
updates, key changes, deletes, transactions over two tables), the primary stopped with
`-m immediate` mid-stream, the standby promoted, and writes resumed on the new primary: the same
worker process reconnects (`--reconnect-timeout`, one line per attempt) to the new primary and
streams on from the synced slot without a new snapshot, and the compacted topics equal the new
primary: no key lost, none resurrected; on 17, after one merge, the Delta mirrors equal it too. On the
stack's 15, through a TCP forwarder that cuts the connection: the deadline of the reconnect (exit
1), and a slot gone when the worker reconnects (one line to the runbook, exit 2, which the
supervisor pages with), then at the next start.

Each major's pair is the stack's drill pair (stack/postgres_versions.py, `drill=True`): created
afresh for the module and wiped after it, since the drill leaves it promoted and crashed.
"""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg2
import pytest
from psycopg2 import sql
from pyspark.sql import SparkSession

from cdc_worker.shell.postgres.failover import standby_slot
from cdc_worker.worker import EXIT_RUNTIME_ERROR, EXIT_STARTUP_ERROR
from stack.config import StackConfig
from stack.postgres_versions import STANDBY_SLOT, Cluster
from tests.integration.conftest import unique_name
from tests.integration.lakehouse import LakeCase, assert_delta_equals_postgres
from tests.integration.worker_harness import (
    TcpForwarder,
    TopicReader,
    WorkerStarter,
    compacted,
    execute,
    query,
    topic_prefix,
    wait_caught_up,
    wait_for,
)

DRILL_MAJORS = (17, 18)
# The merge after the drill runs on one major: it reads Kafka and the new primary's catalog the same
# way on both, and costs tens of seconds of the suite per run.
DELTA_MAJOR = 17
READ_WRITE_DSN_MAJOR = 17
SYNC_TIMEOUT_S = 180.0
FIRST_ROWS = 500


@dataclass(frozen=True)
class Pair:
    primary: Cluster
    standby: Cluster


@pytest.fixture(scope="module", params=DRILL_MAJORS, ids=lambda major: f"pg{major}")
def pair(request: pytest.FixtureRequest) -> Iterator[Pair]:
    cfg = StackConfig.from_env()
    primary = Cluster(cfg, request.param, drill=True)
    standby = Cluster(cfg, request.param, standby=True, drill=True)
    for cluster in (standby, primary):  # a previous drill left them promoted and crashed
        cluster.wipe()
    primary.start()
    standby.start()
    # The walsenders of failover slots wait for the standby's slot: nothing reaches the worker that
    # the standby has not received (without it, the warning the worker prints).
    execute(
        primary.url(),
        (sql.SQL("ALTER SYSTEM SET synchronized_standby_slots = {}").format(sql.Literal(STANDBY_SLOT)),),
        "SELECT pg_reload_conf()",
    )
    try:
        yield Pair(primary, standby)
    finally:
        for cluster in (standby, primary):
            cluster.wipe()


@pytest.fixture
def prefix(kafka_bootstrap: str) -> Iterator[str]:
    yield from topic_prefix(kafka_bootstrap, "drill")


class Writer(threading.Thread):
    """Random changes on two tables until stopped or until its server goes away."""

    def __init__(self, dsn: str, first_new_id: int) -> None:
        super().__init__(daemon=True)
        self.dsn = dsn
        self.next_id = first_new_id
        self.stopping = threading.Event()
        self.committed = 0
        self.random = random.Random(first_new_id)

    def run(self) -> None:
        try:
            conn = psycopg2.connect(self.dsn)
            with conn.cursor() as cur:
                while not self.stopping.is_set():
                    self.one_transaction(cur)
                    conn.commit()
                    self.committed += 1
            conn.close()
        except psycopg2.Error:
            return  # the primary was stopped under it: the drill's point

    def one_transaction(self, cur: psycopg2.extensions.cursor) -> None:
        key = self.random.randint(1, self.next_id)
        kind = self.random.randrange(5)
        if kind == 0:
            cur.execute("INSERT INTO a VALUES (%s, 0, 'new')", (self.next_id,))
            self.next_id += 1
        elif kind == 1:
            cur.execute("UPDATE a SET v = v + 1 WHERE id = %s", (key,))
        elif kind == 2:  # a key change: a tombstone for the old key, the row under the new one
            cur.execute("UPDATE a SET id = %s WHERE id = %s", (self.next_id, key))
            self.next_id += 1
        elif kind == 3:
            cur.execute("DELETE FROM a WHERE id = %s", (key,))
        else:  # one transaction over both tables
            cur.execute("INSERT INTO a VALUES (%s, 1, 'pair')", (self.next_id,))
            cur.execute("UPDATE b SET v = v + 1, a_id = %s WHERE id = %s", (self.next_id, key % 200 + 1))
            self.next_id += 1


def table_as_json(dsn: str, table: str) -> dict[str, object]:
    rows = query(dsn, sql.SQL("SELECT id, row_to_json(t)::text FROM {} t").format(sql.Identifier(table)))
    return {json.dumps({"id": key}): json.loads(value) for key, value in rows}


def test_a_promotion_mid_stream_loses_and_resurrects_nothing(
    *,
    pair: Pair,
    prefix: str,
    reader: TopicReader,
    kafka_bootstrap: str,
    registry_url: str,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    database = unique_name("drill")
    execute(pair.primary.url(), sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
    old_primary, new_primary = pair.primary.url(database), pair.standby.url(database)
    execute(
        old_primary,
        "CREATE TABLE a (id int PRIMARY KEY, v int, note text)",
        "CREATE TABLE b (id int PRIMARY KEY, a_id int, v int)",
        f"INSERT INTO a SELECT g, 0, 'first' FROM generate_series(1, {FIRST_ROWS}) g",
        "INSERT INTO b SELECT g, g, 0 FROM generate_series(1, 200) g",
    )
    # On 18 the DSN leaves target_session_attrs out: reconnecting, the worker reaches the standby
    # before its promotion, sees it still syncing the slot, and waits for the promotion.
    attrs = " target_session_attrs=read-write" if pair.primary.major == READ_WRITE_DSN_MAJOR else ""
    both = (
        f"host=127.0.0.1,127.0.0.1 port={pair.primary.port},{pair.standby.port} user=postgres "
        f"dbname={database}{attrs}"
    )
    slot = unique_name("slot")
    args = ["-d", both, "-s", slot, "-p", prefix, "-b", kafka_bootstrap, "-r", registry_url, "-f", "json"]
    workers = WorkerStarter(
        [*args, "--status-interval", "1", "-T", "partitions=2", "--reconnect-timeout", "300"], tmp_path
    )
    try:
        first = workers.start()
        first.wait_streaming(120)
        assert "failover slot: on" in first.log()
        assert "synchronized_standby_slots is not set" not in first.log()

        writer = Writer(old_primary, FIRST_ROWS + 1)
        writer.start()
        standby = psycopg2.connect(pair.standby.url(database))
        standby.autocommit = True
        wait_for(
            lambda: standby_slot(standby, slot).sync_ready,
            "the slot sync-ready on the standby",
            SYNC_TIMEOUT_S,
        )
        standby.close()
        wait_for(lambda: writer.committed >= 200, "200 more transactions streamed", 120)

        pair.primary.stop("immediate")  # mid-stream: the writer and the worker lose their server
        writer.join(30)
        # The standby refuses a read-write session, or (on 18) is still syncing the slot: not
        # necessarily at the first attempt, which may still find the standby's own connection
        # failing as its upstream went away.
        first.wait_log("reconnecting to Postgres: attempt 1 ", 120)
        if not attrs:
            first.wait_log("a standby still syncing slot", 120)
        pair.standby.promote()

        # The same process reaches the new primary and streams on from the synced slot.
        first.wait_log(f"streaming on from slot {slot}", 120)
        assert first.returncode is None
        log = first.log()
        (reached,) = [
            line for line in log.splitlines() if "reconnecting to Postgres" in line and "(timeline" in line
        ]
        assert f"reached 127.0.0.1:{pair.standby.port}" in reached
        assert log.count("created slot") == 1, "no new snapshot"
        after = Writer(new_primary, writer.next_id + 1_000_000)
        for _ in range(300):
            with psycopg2.connect(new_primary) as conn, conn.cursor() as cur:
                after.one_transaction(cur)
        wait_caught_up(new_primary, slot, 120)
        for table in ("a", "b"):
            records = reader.read(f"{prefix}.{table}")
            assert compacted(records) == table_as_json(new_primary, table), table
        assert first.stop() == 0
        if pair.primary.major != DELTA_MAJOR:
            return
        # The lake too: one merge of both topics, and each Delta mirror equals the new primary.
        spark: SparkSession = request.getfixturevalue("spark")
        lake = LakeCase(spark, new_primary, kafka_bootstrap, registry_url, tmp_path, prefix=prefix, slot=slot)
        runs = lake.merge_all("json")
        assert not [run.error for run in runs.values() if run.error]
        for table in ("a", "b"):
            assert_delta_equals_postgres(spark, lake.path(table), new_primary, table)
    finally:
        workers.stop_all()


def test_a_slot_lost_while_reconnecting_stops_the_worker_in_one_line(
    *, fresh_db: str, prefix: str, kafka_bootstrap: str, tmp_path: Path
) -> None:
    """On the stack's 15, through a forwarder that cuts the worker's connections: the reconnect's
    deadline (exit 1), then a slot dropped while the worker reconnects (exit 2, the line of the
    runbook, no new snapshot), then the same at the next start."""
    execute(fresh_db, "CREATE TABLE a (id int PRIMARY KEY)", "INSERT INTO a VALUES (1)")
    params = psycopg2.extensions.parse_dsn(fresh_db)
    forwarder = TcpForwarder(params.get("host", "127.0.0.1"), int(params.get("port", 5432)))
    through = psycopg2.extensions.make_dsn(fresh_db, host="127.0.0.1", port=forwarder.port)
    slot = unique_name("slot")
    workers = WorkerStarter(
        ["-d", through, "-s", slot, "-p", prefix, "-b", kafka_bootstrap, "-f", "json"], tmp_path
    )
    try:
        first = workers.start("--reconnect-timeout", "2")
        first.wait_streaming(120)
        forwarder.cut()
        assert first.wait_exit(120) == EXIT_RUNTIME_ERROR
        assert "could not reconnect within 2 s (--reconnect-timeout)" in first.log()
        forwarder.restore()

        second = workers.start("--reconnect-timeout", "300")
        second.wait_streaming(120)
        forwarder.cut()
        second.wait_log("reconnecting to Postgres: attempt 1 failed", 120)
        wait_for(
            lambda: (
                query(fresh_db, "SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s", (slot,))
                == [(None,)]
            ),
            "the cut walsender to end",
        )
        execute(fresh_db, ("SELECT pg_drop_replication_slot(%s)", (slot,)))
        forwarder.restore()
        assert second.wait_exit(120) == EXIT_STARTUP_ERROR, "needs a person: the supervisor pages"
        (line,) = [line for line in second.log().splitlines() if f"slot {slot} does not exist there" in line]
        assert f"bottledwater rebuild --confirm {slot}" in line and "Rebuilding after a lost slot" in line
        assert "created slot" not in second.log()

        third = workers.start()
        assert third.wait_exit(120) == EXIT_STARTUP_ERROR
        (line,) = [line for line in third.log().splitlines() if f"slot {slot} does not exist" in line]
        assert f"bottledwater rebuild --confirm {slot}" in line and "Rebuilding after a lost slot" in line
        assert "created slot" not in third.log()
    finally:
        workers.stop_all()
        forwarder.close()
