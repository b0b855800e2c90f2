"""Fixtures for the integration tier: the real services of the local stack (`bw-stack up`).

Addresses come from the same environment variables the product reads (`eval "$(bw-stack env)"`),
defaulting to the stack's. Every test gets random names and drops what it creates.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING

import psycopg2
import pytest
from psycopg2 import sql

if TYPE_CHECKING:
    from pathlib import Path

    from pyspark.sql import SparkSession
    from xdist.remote import Producer

    from tests.integration.lakehouse import LakeCase
    from tests.integration.lanes import LaneScheduling
    from tests.integration.secured_kafka import SecuredKafka
    from tests.integration.worker_harness import TopicReader, WorkerProcess

DEFAULT_POSTGRES = "postgresql://postgres@127.0.0.1:55432/postgres"
DEFAULT_BROKER = "127.0.0.1:9092"
DEFAULT_REGISTRY = "http://127.0.0.1:8081/apis/ccompat/v7"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/integration" in str(item.path):
            item.add_marker(pytest.mark.integration)


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist's, called only when it runs (`-n`)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Producer) -> LaneScheduling:
    """The tier in two lanes at once, each in one process (tests/integration/lanes.py)."""
    from tests.integration.lanes import LaneScheduling

    return LaneScheduling(config, log)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Stops the secured cluster once the last test that uses it is torn down, not at the session's
    end: its three idle nodes take a fifth of a core (tests/README.md), which the CPU-bound rest of
    the tier needs."""
    yield
    users = [i for i in item.session.items if "secured_kafka" in getattr(i, "fixturenames", ())]
    if users and item is users[-1]:
        from tests.integration.secured_kafka import LEASE

        LEASE.release()


def unique_name(prefix: str) -> str:
    """A random lowercase name, safe as a table, slot, topic or database name."""
    return f"{prefix}_{uuid.uuid4().hex[:12]}"


def dsn_for_database(dsn: str, dbname: str) -> str:
    base = dsn.rsplit("/", 1)[0]
    return f"{base}/{dbname}"


@pytest.fixture(scope="session")
def pg_dsn() -> str:
    dsn = os.environ.get("BOTTLEDWATER_POSTGRES", DEFAULT_POSTGRES)
    try:
        psycopg2.connect(dsn, connect_timeout=5).close()
    except psycopg2.OperationalError as exc:
        pytest.fail(f"the stack's Postgres is not reachable at {dsn} ({exc}): run `bw-stack up`")
    return dsn


@pytest.fixture
def fresh_db(pg_dsn: str) -> Iterator[str]:
    """A new empty database; yields its DSN and drops it (with any slot left in it) afterwards."""
    name = unique_name("bwtest")
    admin = psycopg2.connect(pg_dsn)
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield dsn_for_database(pg_dsn, name)
    finally:
        with admin.cursor() as cur:
            # pg_terminate_backend only signals unless given a timeout; a walsender whose client just
            # closed may still hold its slot when the drop below runs. Waiting (up to 10 s) for it to
            # exit releases the slot first.
            cur.execute(
                "SELECT pg_terminate_backend(active_pid, 10000) FROM pg_replication_slots "
                "WHERE database = %s AND active_pid IS NOT NULL",
                (name,),
            )
            cur.execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = %s",
                (name,),
            )
            cur.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        admin.close()


@pytest.fixture(scope="session")
def kafka_bootstrap() -> str:
    return os.environ.get("BOTTLEDWATER_BROKER", DEFAULT_BROKER)


@pytest.fixture(scope="session")
def registry_url() -> str:
    return os.environ.get("BOTTLEDWATER_SCHEMA_REGISTRY", DEFAULT_REGISTRY)


@pytest.fixture
def lake(
    spark: SparkSession, fresh_db: str, kafka_bootstrap: str, registry_url: str, tmp_path: Path
) -> LakeCase:
    """One lakehouse test's world: its database, topic prefix, slot, warehouse and checkpoints."""
    from tests.integration.lakehouse import LakeCase

    return LakeCase(spark, fresh_db, kafka_bootstrap, registry_url, tmp_path)


@pytest.fixture(scope="session")
def secured_kafka() -> Iterator[SecuredKafka]:
    """The stack's three-node SASL_SSL cluster, one for the whole run: started on first use (unless
    it runs already) and stopped at the end if this run started it."""
    from tests.integration.secured_kafka import secured_cluster

    yield from secured_cluster()


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """One SparkSession for the whole run: starting a JVM per test would dominate the suite."""
    from shared_connections.spark_session import SparkSettings, build_session

    session = build_session(SparkSettings(app_name="bottledwater-tests"))
    yield session
    session.stop()


@pytest.fixture
def reader(kafka_bootstrap: str) -> Iterator[TopicReader]:
    """A Kafka reader of the topics a test's worker writes, closed after the test."""
    from tests.integration.worker_harness import topic_reader

    yield from topic_reader(kafka_bootstrap)


@pytest.fixture
def workers() -> Iterator[list[WorkerProcess]]:
    """The worker processes a test starts (append them): each stopped at teardown, before the test's
    database is dropped."""
    started: list[WorkerProcess] = []
    yield started
    for worker in started:
        worker.ensure_stopped()
