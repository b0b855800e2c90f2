"""`--capture-ddl` end to end: the real worker installs its event trigger in a fresh database, DDL
run there arrives on the control topic as `ddl` events in commit order (a rolled-back one never),
among the row changes of its transaction; a role without the privilege gets one clear start-up
line; `ddl install|uninstall` and `slot drop` put the trigger in place and remove it."""

# ruff: noqa: F811 (the worker tests' fixtures, imported, are redefined as parameters)

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg2
import pytest
from psycopg2 import sql

from tests.integration.conftest import dsn_for_database, unique_name
from tests.integration.test_worker import (  # noqa: F401 (fixtures)
    StartWorker,
    prefix,
    slot_name,
    start_worker,
    table_ddl,
    topic,
)
from tests.integration.worker_harness import (
    Record,
    TopicReader,
    execute,
    query,
    run_command,
    wait_caught_up,
)

TRIGGERS = "SELECT evtname FROM pg_event_trigger WHERE evtname LIKE 'bottledwater_ddl%' ORDER BY 1"


def ddl_events(reader: TopicReader, prefix: str, count: int) -> list[Record]:
    control = reader.control_events(f"{prefix}.bottledwater.control", count)
    return [r for r in control if r.op == "ddl"]


def summary(record: Record) -> tuple[Any, ...]:
    value = record.json_value()
    return (
        record.json_key(),
        value["ddl_command"],
        value["ddl_object_type"],
        value["table"],
        value["ddl_renamed_to"],
        [(c["name"], c["type"]) for c in value["ddl_columns"]],
    )


def test_ddl_of_every_kind_reaches_the_control_topic_in_commit_order(
    fresh_db: str, start_worker: StartWorker, reader: TopicReader, prefix: str, slot_name: str
) -> None:
    execute(fresh_db, table_ddl("t", "id int PRIMARY KEY, v int"), "INSERT INTO t VALUES (1, 1)")
    worker = start_worker("--capture-ddl")
    assert [r[0] for r in query(fresh_db, TRIGGERS)] == ["bottledwater_ddl_drop", "bottledwater_ddl_end"]
    execute(
        fresh_db,
        "ALTER TABLE t ADD COLUMN note text",
        "ALTER TABLE t RENAME COLUMN note TO remark",
        "ALTER TABLE t ALTER COLUMN remark TYPE varchar(20)",
        "ALTER TABLE t DROP COLUMN v",
        "CREATE TABLE u (id bigint PRIMARY KEY, amount numeric(10,2))",
        "ALTER TABLE u RENAME TO u2",
        "DROP TABLE u2",
        "CREATE TEMP TABLE scratch (id int)",  # temporary: not captured
    )
    # Rolled back: no event. DDL between two inserts of one transaction: between them by seq.
    conn = psycopg2.connect(fresh_db)
    with conn.cursor() as cur:
        cur.execute("ALTER TABLE t ADD COLUMN ghost int")
    conn.rollback()
    with conn, conn.cursor() as cur:
        cur.execute("INSERT INTO t (id) VALUES (2)")
        cur.execute("ALTER TABLE t ADD COLUMN z int")
        cur.execute("INSERT INTO t (id, z) VALUES (3, 7)")
    conn.close()
    wait_caught_up(fresh_db, slot_name)
    events = ddl_events(reader, prefix, 8)
    t_columns = [("id", "integer"), ("v", "integer")]
    remark = ("remark", "character varying(20)")
    u_columns = [("id", "bigint"), ("amount", "numeric(10,2)")]
    assert [summary(e) for e in events] == [
        ("public.t#ddl", "ALTER TABLE", "table", "t", None, [*t_columns, ("note", "text")]),
        ("public.t#ddl", "ALTER TABLE", "table column", "t", None, [*t_columns, ("remark", "text")]),
        ("public.t#ddl", "ALTER TABLE", "table", "t", None, [*t_columns, remark]),
        ("public.t#ddl", "ALTER TABLE", "table", "t", None, [("id", "integer"), remark]),
        ("public.u#ddl", "CREATE TABLE", "table", "u", None, u_columns),
        ("public.u#ddl", "ALTER TABLE", "table", "u", "public.u2", u_columns),
        ("public.u2#ddl", "DROP TABLE", "table", "u2", None, []),
        ("public.t#ddl", "ALTER TABLE", "table", "t", None, [("id", "integer"), remark, ("z", "integer")]),
    ]  # fmt: skip
    assert "ghost" not in str([e.json_value() for e in events])
    values = [e.json_value() for e in events]
    assert values[0]["ddl_statement"] == "ALTER TABLE t ADD COLUMN note text"
    assert values[0]["topic"] == topic(prefix, "t") and values[6]["topic"] == topic(prefix, "u2")
    positions = [(e.lsn, e.seq) for e in events]
    assert positions == sorted(positions) and len(set(e.lsn for e in events)) == len(events)
    assert all(v["lsn"] == e.lsn and v["seq"] == e.seq for v, e in zip(values, events, strict=True))
    # The mixed transaction: insert (seq 0), DDL (seq 1), insert (seq 2), one commit LSN.
    rows = {r.json_key()["id"]: r for r in reader.read(topic(prefix, "t"), 3)}
    mixed = events[-1]
    assert (rows[2].lsn, rows[2].seq) == (mixed.lsn, 0)
    assert (mixed.lsn, mixed.seq) == (mixed.lsn, 1)
    assert (rows[3].lsn, rows[3].seq) == (mixed.lsn, 2)
    assert rows[3].json_value() == {"id": 3, "remark": None, "z": 7}

    # A restart installs nothing twice; slot drop (the database's last slot) removes the trigger.
    assert worker.stop() == 0
    start_worker("--capture-ddl").stop()
    dropped = run_command(["-d", fresh_db, "-s", slot_name, "slot", "drop"])
    assert dropped.returncode == 0, dropped.stderr
    assert "removed the DDL event trigger" in dropped.stdout
    assert query(fresh_db, TRIGGERS) == []


@pytest.fixture
def limited_role(pg_dsn: str, fresh_db: str) -> Iterator[str]:
    """A LOGIN REPLICATION role that is no superuser; yields its DSN on `fresh_db`."""
    role = unique_name("bwrole")
    execute(pg_dsn, sql.SQL("CREATE ROLE {} LOGIN REPLICATION").format(sql.Identifier(role)))
    try:
        database = psycopg2.extensions.parse_dsn(fresh_db)["dbname"]
        yield dsn_for_database(pg_dsn, database).replace("postgres@", f"{role}@", 1)
    finally:
        execute(
            fresh_db,
            sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)),
        )
        execute(pg_dsn, sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_a_role_without_the_privilege_gets_one_line_and_a_superuser_installs_it(
    fresh_db: str, limited_role: str, start_worker: StartWorker, slot_name: str
) -> None:
    worker = start_worker("--capture-ddl", dsn=limited_role, wait=False)
    assert worker.wait_exit() == 2
    lines = [line for line in worker.log().splitlines() if "--capture-ddl" in line]
    role = psycopg2.extensions.parse_dsn(limited_role)["user"]
    assert len(lines) == 1
    assert f"role {role} cannot create the event trigger" in lines[0]
    assert "superuser" in lines[0] and "rds_superuser" in lines[0] and "ddl install" in lines[0]
    assert query(fresh_db, TRIGGERS) == []  # nothing created before the checks pass

    refused = run_command(["-d", limited_role, "ddl", "install"])
    assert refused.returncode == 2 and "cannot install" in refused.stderr
    installed = run_command(["-d", fresh_db, "ddl", "install"])
    assert installed.returncode == 0 and "installed the DDL event trigger" in installed.stdout
    again = run_command(["-d", fresh_db, "ddl", "install"])
    assert again.returncode == 0 and "already installed" in again.stdout
    assert len(query(fresh_db, TRIGGERS)) == 2
    removed = run_command(["-d", fresh_db, "ddl", "uninstall"])
    assert removed.returncode == 0 and "removed" in removed.stdout
    assert query(fresh_db, TRIGGERS) == []
