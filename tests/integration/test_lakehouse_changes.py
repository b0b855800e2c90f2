"""Changes the merge must get right: reordering across partitions, key changes, unchanged TOAST
values, ADD COLUMN mid-stream, TRUNCATE (with the SCD2 history table, and before the first row)."""

from __future__ import annotations

import shutil
import time
from datetime import UTC, datetime
from pathlib import Path

import psycopg2
import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from confluent_kafka.schema_registry import SchemaRegistryClient
from psycopg2 import sql

from cdc_worker.core.encoding.avro_serializer import AvroEventSerializer
from cdc_worker.core.model import ChangeEvent, Column, Op, TableSchema, TruncateEvent
from cdc_worker.core.pgtypes.oids import PgType
from cdc_worker.shell.stream.resnapshot_reader import request_resnapshot
from kafka_contract.topics import control_topic_name
from spark_jobs import quality
from spark_jobs.lake import delta_tables
from spark_jobs.merging import scd2
from spark_jobs.rules import layout
from tests.integration.conftest import unique_name
from tests.integration.lakehouse import LakeCase, assert_delta_equals_postgres, execute, sorted_rows


def test_events_of_one_key_out_of_order_across_partitions_resolve_by_lsn(lake: LakeCase) -> None:
    """The worker keeps a key in one partition; a repartitioned topic or a replay does not. Messages
    encoded by the worker's own serializer are put in chosen partitions, newest first."""
    name = unique_name("items")
    schema = TableSchema(1, "public", name, (Column("id", PgType.INT4, -1), Column("label", PgType.TEXT, -1)),
                         key_columns=("id",))  # fmt: skip
    serializer = AvroEventSerializer(
        SchemaRegistryClient({"url": lake.registry}), {}, topic_prefix=lake.prefix
    )
    topic = lake.topic(name)
    admin = AdminClient({"bootstrap.servers": lake.bootstrap})
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(30)
    producer = Producer({"bootstrap.servers": lake.bootstrap})

    def send(partition: int, op: Op, key: int, label: str | None, lsn: int) -> None:
        row = None if op == Op.DELETE else (str(key), label)
        event = ChangeEvent(op, schema, (str(key),), row, (), lsn, 0, lsn, datetime.fromtimestamp(lsn, UTC))
        message = serializer(event)
        assert message is not None
        producer.produce(message.topic, message.value, message.key, partition, headers=message.headers)
        assert producer.flush(30) == 0

    # One batch: the newer event first in partition 1, the older after it in partition 0.
    send(1, Op.UPDATE, 1, "new", 300)
    send(0, Op.INSERT, 1, "old", 100)
    send(0, Op.INSERT, 2, "two", 400)
    send(1, Op.INSERT, 3, "three", 700)
    send(1, Op.DELETE, 4, None, 800)
    send(0, Op.INSERT, 4, "four again", 900)  # a later insert after a delete wins
    lake.merge(name)
    expected = [(1, "new"), (2, "two"), (3, "three"), (4, "four again")]
    assert sorted_rows(lake.spark.read.format("delta").load(lake.path(name)), ["id", "label"]) == expected

    # Later runs: a delete, then stale events arriving after what they precede.
    send(1, Op.DELETE, 2, None, 500)
    lake.merge(name)
    send(0, Op.UPDATE, 1, "stale update", 200)  # older than "new"
    send(0, Op.INSERT, 2, "stale insert", 450)  # older than the delete: must not resurrect key 2
    send(0, Op.DELETE, 3, None, 600)  # a stale delete must not remove the newer row
    lake.merge(name)
    expected = [(1, "new"), (3, "three"), (4, "four again")]
    assert sorted_rows(lake.spark.read.format("delta").load(lake.path(name)), ["id", "label"]) == expected


def test_key_change_and_add_column_mid_stream(lake: LakeCase) -> None:
    name = unique_name("accounts")
    table = sql.Identifier(name)
    execute(
        lake.dsn,
        sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, owner text)").format(table),
        sql.SQL("INSERT INTO {} SELECT i, 'owner ' || i FROM generate_series(1, 10) i").format(table),
    )
    with lake.worker("avro", name) as worker:
        worker.wait_caught_up()
        lake.merge(name)
        execute(
            lake.dsn,
            sql.SQL("UPDATE {} SET id = id + 100 WHERE id <= 3").format(table),  # tombstone + new key
            sql.SQL("INSERT INTO {} VALUES (11, 'before the column')").format(table),
            sql.SQL("ALTER TABLE {} ADD COLUMN {} numeric(8,3)").format(
                table, sql.Identifier("credit limit")
            ),
            sql.SQL("INSERT INTO {} VALUES (12, 'after the column', 12.5)").format(table),
            sql.SQL("UPDATE {} SET {} = 1.125 WHERE id IN (4, 101)").format(
                table, sql.Identifier("credit limit")
            ),
        )
        worker.wait_caught_up()
    run = lake.merge(name)  # one batch holding both value schema versions
    assert run.batches[-1].added_columns == ["credit limit"]
    assert_delta_equals_postgres(lake.spark, lake.path(name), lake.dsn, name)


@pytest.mark.parametrize("fmt", ["avro", "json"])
def test_widening_column_types_mid_stream_widens_the_delta_columns(lake: LakeCase, fmt: str) -> None:
    name = unique_name("widen")
    table = sql.Identifier(name)
    execute(
        lake.dsn,
        sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, n int, r real, amount numeric(6,2))").format(table),
        sql.SQL("INSERT INTO {} SELECT i, i, i / 4.0, i + 0.25 FROM generate_series(1, 5) i").format(table),
    )
    with lake.worker(fmt, name) as worker:
        worker.wait_caught_up()
        lake.merge(name, fmt)
        execute(
            lake.dsn,
            sql.SQL("ALTER TABLE {} ALTER COLUMN id TYPE bigint, ALTER COLUMN n TYPE bigint").format(table),
            sql.SQL("ALTER TABLE {} ALTER COLUMN r TYPE double precision").format(table),
            sql.SQL("ALTER TABLE {} ALTER COLUMN amount TYPE numeric(12,4)").format(table),
            sql.SQL("INSERT INTO {} VALUES (10000000000, 5000000000, 0.1, 12345678.1234)").format(table),
            sql.SQL("UPDATE {} SET n = n * 3000000000 WHERE id = 2").format(table),
        )
        worker.wait_caught_up()
    lake.merge(name, fmt)
    types = {
        f.name: f.dataType.simpleString()
        for f in lake.spark.read.format("delta").load(lake.path(name)).schema
    }
    # JSON carries no types: the merge takes them from the Postgres catalog, widened alike.
    assert (types["id"], types["n"], types["r"], types["amount"]) == (
        "bigint",
        "bigint",
        "double",
        "decimal(12,4)",
    )
    assert_delta_equals_postgres(lake.spark, lake.path(name), lake.dsn, name)


def test_unchanged_toast_values_are_kept(lake: LakeCase) -> None:
    name = unique_name("documents")
    table = sql.Identifier(name)
    # 400 md5s: ~13 kB that pglz cannot squeeze under the 2 kB TOAST threshold, so it is stored out of line.
    big = "(SELECT string_agg(md5(random()::text || g), '') FROM generate_series(1, 400) g)"
    execute(
        lake.dsn,
        sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, body text, views int)").format(table),
        sql.SQL("INSERT INTO {} VALUES (1, " + big + ", 0)").format(table),
    )
    with lake.worker("avro", name) as worker:
        worker.wait_caught_up()
        lake.merge(name)
        execute(lake.dsn, sql.SQL("UPDATE {} SET views = views + 1 WHERE id = 1").format(table))
        # Inserted and then updated without touching the body: the batch itself must carry it.
        execute(lake.dsn, sql.SQL("INSERT INTO {} VALUES (2, " + big + ", 0)").format(table))
        execute(lake.dsn, sql.SQL("UPDATE {} SET views = 5 WHERE id = 2").format(table))
        worker.wait_caught_up()
    lake.merge(name)
    assert _header_seen(lake, lake.topic(name), "bw.unchanged"), "no update carried an unchanged TOAST column"
    assert_delta_equals_postgres(lake.spark, lake.path(name), lake.dsn, name)


def test_truncate_removes_older_rows_and_closes_history(lake: LakeCase) -> None:
    name = unique_name("events")
    table = sql.Identifier(name)
    execute(
        lake.dsn,
        sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, what text)").format(table),
        sql.SQL("INSERT INTO {} SELECT i, 'before ' || i FROM generate_series(1, 5) i").format(table),
    )
    with lake.worker("avro", name) as worker:
        worker.wait_caught_up()
        lake.merge(name, history=True)
        execute(
            lake.dsn,
            sql.SQL("UPDATE {} SET what = 'updated' WHERE id = 1").format(table),
            sql.SQL("TRUNCATE {}").format(table),
            sql.SQL("INSERT INTO {} VALUES (2, 'after'), (6, 'after')").format(table),
        )
        worker.wait_caught_up()
    lake.merge(name, history=True)
    assert_delta_equals_postgres(lake.spark, lake.path(name), lake.dsn, name)
    history = lake.spark.read.format("delta").load(lake.path(name) + "__history")
    current = sorted_rows(history.where(f"{scd2.END_LSN} IS NULL"), ["id", "what"])
    assert current == [(2, "after"), (6, "after")]
    closed = sorted_rows(history.where(f"{scd2.END_LSN} IS NOT NULL"), ["id", "what"])
    assert closed == [
        (1, "before 1"),
        (1, "updated"),
        (2, "before 2"),
        (3, "before 3"),
        (4, "before 4"),
        (5, "before 5"),
    ]

    # A new checkpoint replays the rows from before the TRUNCATE: they stay gone.
    shutil.rmtree(Path(lake.checkpoints))
    lake.merge(name, history=True)
    assert_delta_equals_postgres(lake.spark, lake.path(name), lake.dsn, name)


def test_history_opens_a_version_only_when_a_value_changes(lake: LakeCase) -> None:
    name = unique_name("people")
    table = sql.Identifier(name)
    execute(
        lake.dsn,
        sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, what text, n int)").format(table),
        sql.SQL("INSERT INTO {} SELECT i, 'what ' || i, i FROM generate_series(1, 4) i").format(table),
    )
    with lake.worker("avro", name) as worker:
        worker.wait_caught_up()
        lake.merge(name, history=True)
        execute(
            lake.dsn,
            sql.SQL("UPDATE {} SET what = what WHERE id = 1").format(table),  # repeats the row
            sql.SQL("UPDATE {} SET n = 20 WHERE id = 2").format(table),
            sql.SQL("UPDATE {} SET n = 20 WHERE id = 2").format(table),  # repeats it, same batch
            sql.SQL("DELETE FROM {} WHERE id = 3").format(table),
            sql.SQL("INSERT INTO {} VALUES (3, 'what 3', 3)").format(table),  # back: a new version
        )
        # A re-snapshot while streaming repeats every row once more.
        conn = psycopg2.connect(lake.dsn)
        try:
            conn.autocommit = True
            request_resnapshot(conn, lake.slot, [("public", name)])
        finally:
            conn.close()
        deadline = time.monotonic() + 60
        while f"re-snapshot of public.{name}: 4 rows, done" not in worker.log_tail(None):
            assert time.monotonic() < deadline, worker.log_tail()
            time.sleep(0.3)
        worker.wait_caught_up()
    lake.merge(name, history=True)
    assert_delta_equals_postgres(lake.spark, lake.path(name), lake.dsn, name)
    history_path = lake.path(name) + "__history"

    def versions() -> list[tuple[object, ...]]:
        history = lake.spark.read.format("delta").load(history_path)
        return sorted_rows(history, ["id", "what", "n", scd2.START_LSN, scd2.END_LSN])

    found = versions()
    assert [(v[0], v[1], v[2], v[4] is None) for v in found] == [
        (1, "what 1", 1, True),
        (2, "what 2", 2, False),
        (2, "what 2", 20, True),
        (3, "what 3", 3, False),
        (3, "what 3", 3, True),
        (4, "what 4", 4, True),
    ]
    # A new checkpoint reads every change again: each one finds its version already there.
    shutil.rmtree(Path(lake.checkpoints))
    lake.merge(name, history=True)
    assert versions() == found


@pytest.mark.parametrize("fmt", ["avro", "json"])
def test_truncate_before_the_first_row_then_rows(lake: LakeCase, fmt: str) -> None:
    """The first batch the merge sees holds only the TRUNCATE (an empty table truncated): the
    mirror must not be created keyless then, and the rows inserted after it end up keyed."""
    name = unique_name("queue")
    table = sql.Identifier(name)
    execute(lake.dsn, sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, what text)").format(table))
    with lake.worker(fmt, name) as worker:
        worker.wait_caught_up()
        execute(lake.dsn, sql.SQL("TRUNCATE {}").format(table))
        worker.wait_caught_up()
        run = lake.merge(name, fmt)
        assert [(b.messages, b.truncated_before is not None) for b in run.batches] == [(0, True)]
        execute(
            lake.dsn,
            sql.SQL("INSERT INTO {} SELECT i, 'row ' || i FROM generate_series(1, 6) i").format(table),
            sql.SQL("UPDATE {} SET what = 'updated' WHERE id = 2").format(table),
            sql.SQL("DELETE FROM {} WHERE id = 3").format(table),
        )
        worker.wait_caught_up()
    lake.merge(name, fmt)
    path = lake.path(name)
    assert_delta_equals_postgres(lake.spark, path, lake.dsn, name)
    assert delta_tables.table_properties(lake.spark, path)[layout.KEY_PROPERTY] == '["id"]'
    for check in (quality.key_uniqueness(lake.spark, path), quality.non_null_keys(lake.spark, path),
                  quality.reconciliation(lake.spark, path, lake.dsn)):  # fmt: skip
        assert check.passed, check


def test_rows_older_than_a_truncate_seen_before_the_table_existed_stay_gone(lake: LakeCase) -> None:
    """A TRUNCATE merged before any row of its table; changes older than it arrive in later batches
    (here: published late, as after a repartition or a replay) and must not survive it."""
    name = unique_name("jobs")
    schema = TableSchema(1, "public", name, (Column("id", PgType.INT4, -1), Column("what", PgType.TEXT, -1)),
                         key_columns=("id",))  # fmt: skip
    serializer = AvroEventSerializer(
        SchemaRegistryClient({"url": lake.registry}), {}, topic_prefix=lake.prefix
    )
    topic, control = lake.topic(name), control_topic_name(lake.prefix)
    admin = AdminClient({"bootstrap.servers": lake.bootstrap})
    for created in admin.create_topics([NewTopic(topic, 2, 1), NewTopic(control, 1, 1)]).values():
        created.result(30)
    producer = Producer({"bootstrap.servers": lake.bootstrap})

    def at(lsn: int) -> datetime:
        return datetime.fromtimestamp(lsn, UTC)

    def send(partition: int, key: int, what: str, lsn: int) -> None:
        event = ChangeEvent(Op.INSERT, schema, (str(key),), (str(key), what), (), lsn, 0, lsn, at(lsn))
        message = serializer(event)
        assert message is not None
        producer.produce(message.topic, message.value, message.key, partition, headers=message.headers)
        assert producer.flush(30) == 0

    for message in serializer.truncate(TruncateEvent((schema,), False, False, 500, 0, 500, at(500))):
        producer.produce(message.topic, message.value, message.key, headers=message.headers)
    assert producer.flush(30) == 0
    lake.merge(name, history=True)
    assert not delta_tables.table_exists(lake.spark, lake.path(name))

    send(0, 1, "stale", 100)
    send(0, 2, "stale", 400)
    send(1, 2, "after", 600)
    send(1, 3, "after", 700)
    lake.merge(name, history=True)
    path = lake.path(name)
    expected = [(2, "after"), (3, "after")]
    assert sorted_rows(lake.spark.read.format("delta").load(path), ["id", "what"]) == expected
    properties = delta_tables.table_properties(lake.spark, path)
    assert (properties[layout.KEY_PROPERTY], properties[layout.TRUNCATED_BEFORE_PROPERTY]) == (
        '["id"]',
        "500/0",
    )
    history = lake.spark.read.format("delta").load(path + "__history")
    assert sorted_rows(history, ["id", "what", scd2.END_LSN]) == [(2, "after", None), (3, "after", None)]

    send(0, 4, "stale", 450)  # a batch of its own, after the mirror exists
    lake.merge(name, history=True)
    assert sorted_rows(lake.spark.read.format("delta").load(path), ["id", "what"]) == expected

    shutil.rmtree(Path(lake.checkpoints))  # everything again, the TRUNCATE and the rows in one batch
    lake.merge(name, history=True)
    assert sorted_rows(lake.spark.read.format("delta").load(path), ["id", "what"]) == expected
    for check in (quality.key_uniqueness(lake.spark, path), quality.non_null_keys(lake.spark, path)):
        assert check.passed, check


def _header_seen(lake: LakeCase, topic: str, header: str) -> bool:
    consumer = Consumer({"bootstrap.servers": lake.bootstrap, "group.id": unique_name("g"),
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})  # fmt: skip
    consumer.subscribe([topic])
    try:
        misses = 0
        while misses < 5:
            message = consumer.poll(2.0)
            if message is None or message.error() is not None:
                misses += 1
                continue
            if any(k == header for k, _ in message.headers() or ()):
                return True
        return False
    finally:
        consumer.close()
