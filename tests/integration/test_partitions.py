"""Partitioned tables captured as one table (`--partitions root`, the default) against the stack's
Postgres 15, Kafka and registry: a two-level partitioned table under a mixed workload during and
after the snapshot, read back from its root's one topic in JSON and Avro (two workers on the same
database), beside a `--partitions leaf` worker that keeps a topic per leaf; then the refusal to
switch a slot's mode. The Delta mirror's test is in test_lakehouse_partitions.py.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from psycopg2 import sql

from cdc_worker.shell.postgres.catalog import connect, load_tables
from cdc_worker.shell.postgres.partitions import PartitionMode
from cdc_worker.shell.postgres.truncate_guard import guard_new_leaves, install
from tests.integration.conftest import unique_name
from tests.integration.worker_harness import (
    AvroDecoder,
    TopicReader,
    WorkerProcess,
    compacted,
    delete_topics_with_prefix,
    execute,
    query,
    run_command,
    wait_caught_up,
    worker_args,
)

SCHEMA = [
    # Two levels: by region, and Europe again by month; a default partition takes the rest.
    "CREATE TABLE events (id int, region text, month int, payload text, PRIMARY KEY (id, region, month))"
    " PARTITION BY LIST (region)",
    "CREATE TABLE events_eu PARTITION OF events FOR VALUES IN ('eu') PARTITION BY RANGE (month)",
    "CREATE TABLE events_eu_h1 PARTITION OF events_eu FOR VALUES FROM (1) TO (7)",
    "CREATE TABLE events_eu_h2 PARTITION OF events_eu FOR VALUES FROM (7) TO (13)",
    "CREATE TABLE events_us PARTITION OF events FOR VALUES IN ('us')",
    "CREATE TABLE events_rest PARTITION OF events DEFAULT",
    "INSERT INTO events SELECT g, (ARRAY['eu', 'us', 'asia'])[g % 3 + 1], g % 12 + 1, 'p' || g"
    " FROM generate_series(1, 3000) g",
]
# While the snapshot runs: inserts across partitions, an update moving rows to another partition
# (their key changes: the partition key is in every key of a partitioned table), deletes, a
# partition created and written to.
DURING = [
    "INSERT INTO events SELECT g, (ARRAY['eu', 'us', 'asia'])[g % 3 + 1], g % 12 + 1, 'n' || g"
    " FROM generate_series(3001, 3300) g",
    "UPDATE events SET region = 'us', payload = 'moved' WHERE region = 'eu' AND id % 10 = 0",
    "UPDATE events SET payload = 'changed' WHERE id % 7 = 0",
    "DELETE FROM events WHERE id % 11 = 0",
    "CREATE TABLE events_apac PARTITION OF events FOR VALUES IN ('apac')",
    "INSERT INTO events SELECT g, 'apac', 1, 'a' || g FROM generate_series(4001, 4050) g",
]
# Once streaming: a table with rows (its columns in another order) attached, a partition created
# and written to; then a partition detached, a leaf of the start and the new one truncated, rows
# moved between sub-partitions.
ATTACHED = [
    "CREATE TABLE events_latam (payload text, month int, id int, region text,"
    " PRIMARY KEY (id, region, month))",
    "INSERT INTO events_latam SELECT 'l' || g, 2, g, 'latam' FROM generate_series(5001, 5040) g",
    "ALTER TABLE events ATTACH PARTITION events_latam FOR VALUES IN ('latam')",
    # Created while streaming: guarded once its first row is decoded, then truncated below.
    "CREATE TABLE events_mena PARTITION OF events FOR VALUES IN ('mena')",
    "INSERT INTO events SELECT g, 'mena', 5, 'm' || g FROM generate_series(7001, 7020) g",
]
AFTER = [
    "ALTER TABLE events DETACH PARTITION events_us",
    "TRUNCATE events_eu_h2",
    "TRUNCATE events_mena",
    "UPDATE events SET month = 8 WHERE region = 'eu' AND month = 1 AND id % 3 = 0",
    "INSERT INTO events VALUES (6001, 'eu', 12, 'last')",
]


@pytest.fixture
def prefixes(kafka_bootstrap: str) -> Iterator[dict[str, str]]:
    names = {mode: unique_name(f"bw{mode}") for mode in ("json", "avro", "leaf")}
    yield names
    for name in names.values():
        delete_topics_with_prefix(kafka_bootstrap, name)


def _rows(dsn: str, table: str) -> dict[str, Any]:
    """The table as its compacted topic should hold it: canonical key text -> row."""
    statement = sql.SQL("SELECT id, region, month, payload FROM {}").format(sql.Identifier(table))
    return {
        json.dumps({"id": i, "month": m, "region": r}, sort_keys=True): {
            "id": i, "region": r, "month": m, "payload": p
        }
        for i, r, m, p in query(dsn, statement)
    }  # fmt: skip


def test_a_partitioned_table_is_one_topic_through_a_mixed_workload(
    *,
    fresh_db: str,
    kafka_bootstrap: str,
    registry_url: str,
    prefixes: dict[str, str],
    reader: TopicReader,
    workers: list[WorkerProcess],
    tmp_path: Path,
) -> None:
    execute(fresh_db, *SCHEMA)
    slots = {mode: unique_name(f"slot_{mode}") for mode in prefixes}
    for mode, prefix in prefixes.items():
        fmt = "avro" if mode == "avro" else "json"
        args = worker_args(
            fresh_db, slots[mode], prefix=prefix, bootstrap=kafka_bootstrap, registry=registry_url, fmt=fmt
        )
        args += ["--partitions", "leaf"] if mode == "leaf" else []
        workers.append(WorkerProcess(args, tmp_path / f"{mode}.log").start())
    execute(fresh_db, *DURING)
    for worker in workers:
        worker.wait_streaming(60)
    execute(fresh_db, *ATTACHED)
    attached = _rows(fresh_db, "events_latam")
    # The attached partition's rows are not in the WAL: the worker that guards the new leaf first
    # asks every slot for a re-snapshot of it, which publishes them under the root, with nothing
    # written to it since (docs/worker.md, Partitioned tables); the leaf-mode worker ignores it.
    for worker in workers[:2]:
        worker.wait_log("re-snapshot of public.events_latam: 40 rows, done", 60)
    for slot in slots.values():
        wait_caught_up(fresh_db, slot, 60)
    detached = _rows(fresh_db, "events_us")
    truncated = {**_rows(fresh_db, "events_eu_h2"), **_rows(fresh_db, "events_mena")}
    execute(fresh_db, *AFTER)
    for slot in slots.values():
        wait_caught_up(fresh_db, slot, 60)

    root = _rows(fresh_db, "events")
    assert not set(detached) & set(root) and len(attached) == 40 and truncated
    # A detached partition's rows leave the root in Postgres but no change says so: they stay in
    # the topic (and the mirror), which `verify` reports; documented in docs/worker.md.
    expected = {**root, **detached}
    for mode, decode in (("json", json.loads), ("avro", AvroDecoder(registry_url))):
        topics = {t for t in reader.topics() if t.startswith(prefixes[mode] + ".")}
        assert topics == {f"{prefixes[mode]}.events", f"{prefixes[mode]}.bottledwater.control"}, mode
        records = reader.read(f"{prefixes[mode]}.events", timeout=60)
        view = compacted(records, decode)
        assert {json.loads(k)["region"] for k in view} == {"eu", "asia", "apac", "latam", "us"}, mode
        assert any(decode(r.key)["region"] == "mena" for r in records), "the new leaf's rows came and went"
        assert view == expected, mode
        # The leaf's TRUNCATE reached the topic: a tombstone for each of its keys (in `expected`).
        assert not set(truncated) & set(view), mode
    for worker in workers:
        # Partitions created empty then written to: their rows came through the WAL, no re-snapshot.
        assert "re-snapshot of public.events_mena" not in worker.log()
        assert "re-snapshot of public.events_apac" not in worker.log()
    assert "re-snapshot" not in workers[2].log(), "--partitions leaf: the latam topic had the rows"

    # Leaf by leaf: a topic per leaf partition (as before the root mode existed), none for the root.
    leaf_topics = {t.removeprefix(prefixes["leaf"] + ".") for t in reader.topics()
                   if t.startswith(prefixes["leaf"] + ".")}  # fmt: skip
    assert {"events_eu_h1", "events_eu_h2", "events_us", "events_rest"} <= leaf_topics
    assert "events" not in leaf_topics and "events_eu" not in leaf_topics
    h1 = compacted(reader.read(f"{prefixes['leaf']}.events_eu_h1", timeout=60))
    assert h1 == _rows(fresh_db, "events_eu_h1")

    # A resumed slot keeps its mode: switching is refused in one line that says what to do.
    assert workers[0].stop() == 0
    args = worker_args(
        fresh_db,
        slots["json"],
        prefix=prefixes["json"],
        bootstrap=kafka_bootstrap,
        registry=registry_url,
        fmt="json",
    )
    again = WorkerProcess([*args, "--partitions", "leaf"], tmp_path / "switch.log").start()
    workers.append(again)
    assert again.wait_exit(60) == 2
    (line,) = [ln for ln in again.log().splitlines() if "captures partitioned tables" in ln]
    assert "restart with --partitions root" in line and f"bottledwater slot drop -s {slots['json']}" in line

    # A partition attached with rows while this slot's worker is down: the other root worker guards
    # it and asks every slot; the request waits in this slot's WAL and is read after the restart.
    execute(
        fresh_db,
        "CREATE TABLE events_oc (LIKE events_rest INCLUDING ALL)",
        "INSERT INTO events_oc SELECT g, 'oc', 3, 'o' || g FROM generate_series(8001, 8005) g",
        "ALTER TABLE events ATTACH PARTITION events_oc FOR VALUES IN ('oc')",
    )
    workers[1].wait_log("re-snapshot of public.events_oc: 5 rows, done", 60)
    restarted = WorkerProcess(args, tmp_path / "restarted.log").start()
    workers.append(restarted)
    restarted.wait_log("re-snapshot of public.events_oc: 5 rows, done", 60)
    assert restarted.stop() == 0

    # The guards go with the database's last slot, not before (which slot captures which root is
    # not written in the database).
    guards = "SELECT count(*) FROM pg_trigger WHERE tgname LIKE 'bottledwater_truncate_%'"
    assert query(fresh_db, guards)[0][0] > 0
    for worker in workers[1:3]:
        assert worker.stop() == 0
    said = []
    for slot in slots.values():
        dropped = run_command(["slot", "drop", "-d", fresh_db, "-s", slot])
        assert dropped.returncode == 0, dropped.stderr
        said.append(dropped.stdout)
    assert all("TRUNCATE guards are kept" in out for out in said[:-1]), said
    assert "removed the partitions' TRUNCATE guards" in said[-1], said
    assert query(fresh_db, guards)[0][0] == 0


def test_the_truncate_guard_deletes_a_leafs_rows_but_not_under_a_root_truncate(fresh_db: str) -> None:
    """The guard alone, against the real catalog, read back through pgoutput as the worker reads
    it: a leaf's TRUNCATE arrives as deletes under the root; a root's TRUNCATE as one TRUNCATE; a
    partition attached with rows is asked for with a re-snapshot request."""
    execute(
        fresh_db,
        *SCHEMA,
        "CREATE PUBLICATION guarded FOR TABLE events WITH (publish_via_partition_root = true)",
        "SELECT pg_create_logical_replication_slot('guarded', 'pgoutput')",
    )
    conn = connect(fresh_db)
    try:
        # Leaf by leaf, a leaf's TRUNCATE is its own topic's: nothing to guard.
        assert install(conn, load_tables(conn, ["public.events*"], partitions=PartitionMode.LEAF)) == []
        assert query(fresh_db, "SELECT count(*) FROM pg_trigger WHERE tgname LIKE 'bottledwater%'") == [(0,)]
        (root,) = load_tables(conn, ["public.events"])
        assert install(conn, [root]) == [] and install(conn, [root]) == [], "installed once, idempotent"
    finally:
        conn.close()

    def published(statement: str) -> Counter[str]:
        """pgoutput's messages for `statement` by kind (D: delete, T: truncate)."""
        execute(fresh_db, statement)
        changes = query(
            fresh_db,
            "SELECT chr(get_byte(data, 0)) FROM pg_logical_slot_get_binary_changes("
            "'guarded', NULL, NULL, 'proto_version', '1', 'publication_names', 'guarded')",
        )
        return Counter(kind for (kind,) in changes if kind in "DT")

    (in_h2,) = query(fresh_db, "SELECT count(*) FROM events_eu_h2")[0]
    assert in_h2 > 0 and published("TRUNCATE events_eu_h2") == Counter({"D": in_h2})
    (in_eu,) = query(fresh_db, "SELECT count(*) FROM events_eu")[0]
    assert published("TRUNCATE events_eu") == Counter({"D": in_eu}), "a sub-partitioned level"
    assert published("TRUNCATE events") == Counter({"T": 1}), "the root's TRUNCATE is published itself"
    # The mark of the root's statement ends with it: a later leaf TRUNCATE is guarded again.
    again = "TRUNCATE events; INSERT INTO events VALUES (1, 'us', 1, 'x'); TRUNCATE events_us"
    assert published(again) == Counter({"T": 1, "D": 1})

    def asked() -> list[Any]:
        """The tables of the re-snapshot requests written since, and the slot they are for."""
        messages = query(
            fresh_db,
            "SELECT data FROM pg_logical_slot_get_binary_changes('guarded', NULL, NULL, 'proto_version',"
            " '1', 'publication_names', 'guarded', 'messages', 'true') WHERE get_byte(data, 0) = 77",
        )
        # pgoutput's Message: 'M', flags, LSN, the prefix ending in a NUL, the content's length.
        start = len(b"M") + 1 + 8 + len(b"bottledwater\0") + 4
        bodies = [json.loads(bytes(data)[start:]) for (data,) in messages]
        return [(body["slot"], body["tables"]) for body in bodies]

    # A partition attached with rows is asked for (every slot) in its guard's transaction; one made
    # empty then written to is not; one detached and attached again is new again.
    execute(fresh_db, *ATTACHED)
    conn = connect(fresh_db)
    try:
        assert guard_new_leaves(conn, ["guarded"]) == {root.schema.oid: []}
        assert asked() == [("*", [["public", "events_latam"]])]
        assert guard_new_leaves(conn, ["guarded"]) == {} and asked() == [], "guarded: seen"
        execute(
            fresh_db,
            "ALTER TABLE events DETACH PARTITION events_latam",
            "ALTER TABLE events ATTACH PARTITION events_latam FOR VALUES IN ('latam')",
        )
        assert guard_new_leaves(conn, ["guarded"]) == {root.schema.oid: []}
        assert asked() == [("*", [["public", "events_latam"]])]
    finally:
        conn.close()
    execute(fresh_db, "SELECT pg_drop_replication_slot('guarded')")


def test_a_leaf_named_under_partitions_root_is_said(
    fresh_db: str, kafka_bootstrap: str, registry_url: str, tmp_path: Path
) -> None:
    execute(fresh_db, *SCHEMA)
    args = worker_args(fresh_db, unique_name("slot"), prefix=unique_name("bw"), bootstrap=kafka_bootstrap,
                 registry=registry_url, fmt="json")  # fmt: skip
    worker = WorkerProcess([*args, "--tables", "public.events_eu_h1"], tmp_path / "leaf.log").start()
    try:
        assert worker.wait_exit(60) == 2, "nothing is selected: refused"
    finally:
        worker.ensure_stopped()
    (line,) = [ln for ln in worker.log().splitlines() if "--tables matches partition" in ln]
    assert "public.events_eu_h1" in line and "select its root, or pass --partitions leaf" in line
