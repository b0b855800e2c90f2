"""Each real service of the stack does the one thing the product needs from it."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import psycopg2
import psycopg2.extras
import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from psycopg2 import sql

from tests.integration.conftest import unique_name

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

PROJECT_ROOT = Path(__file__).resolve().parents[2]
PGOUTPUT_INSERT = ord("I")
READ_TIMEOUT_S = 30.0


def test_postgres_streams_pgoutput_through_a_logical_slot(fresh_db: str) -> None:
    table, publication, slot = unique_name("t"), unique_name("pub"), unique_name("slot")
    with psycopg2.connect(fresh_db) as conn, conn.cursor() as cur:
        cur.execute(sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, name text)").format(sql.Identifier(table)))
        cur.execute(
            sql.SQL("CREATE PUBLICATION {} FOR TABLE {}").format(
                sql.Identifier(publication), sql.Identifier(table)
            )
        )

    repl = psycopg2.connect(fresh_db, connection_factory=psycopg2.extras.LogicalReplicationConnection)
    try:
        rcur = repl.cursor()
        rcur.create_replication_slot(slot, output_plugin="pgoutput")
        with psycopg2.connect(fresh_db) as conn, conn.cursor() as cur:
            cur.execute(sql.SQL("INSERT INTO {} VALUES (1, 'snowman ☃')").format(sql.Identifier(table)))
        rcur.start_replication(
            slot_name=slot, decode=False, options={"proto_version": "1", "publication_names": publication}
        )
        payloads: list[bytes] = []
        deadline = time.monotonic() + READ_TIMEOUT_S
        while time.monotonic() < deadline and not any(p[0] == PGOUTPUT_INSERT for p in payloads):
            msg = rcur.read_message()
            if msg is None:
                time.sleep(0.05)
                continue
            payloads.append(bytes(msg.payload))
            msg.cursor.send_feedback(flush_lsn=msg.data_start)
        inserts = [p for p in payloads if p[0] == PGOUTPUT_INSERT]
        assert inserts, (
            f"no pgoutput Insert message within {READ_TIMEOUT_S}s; got {[p[:1] for p in payloads]}"
        )
        assert "snowman ☃".encode() in inserts[0]
    finally:
        repl.close()  # the slot goes with `fresh_db`, which waits for its walsender to exit first


def test_kafka_round_trips_a_keyed_message(kafka_bootstrap: str) -> None:
    topic = unique_name("smoke")
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])[topic].result(timeout=30)
    try:
        producer = Producer({"bootstrap.servers": kafka_bootstrap, "enable.idempotence": True, "acks": "all"})
        delivered: list[str] = []
        producer.produce(
            topic,
            key=b"k1",
            value=b"v1",
            headers=[("bw.op", b"c")],
            on_delivery=lambda err, msg: delivered.append("ok" if err is None else str(err)),
        )
        assert producer.flush(30) == 0
        assert delivered == ["ok"]

        consumer = Consumer(
            {
                "bootstrap.servers": kafka_bootstrap,
                "group.id": unique_name("g"),
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
            }
        )
        consumer.subscribe([topic])
        try:
            deadline = time.monotonic() + READ_TIMEOUT_S
            msg = None
            while time.monotonic() < deadline:
                msg = consumer.poll(1.0)
                if msg is not None and msg.error() is None:
                    break
            assert msg is not None and msg.error() is None, "nothing consumed"
            assert (msg.key(), msg.value(), msg.headers()) == (b"k1", b"v1", [("bw.op", b"c")])
        finally:
            consumer.close()
    finally:
        admin.delete_topics([topic])[topic].result(timeout=30)


def test_registry_returns_a_registered_avro_schema_by_id(registry_url: str) -> None:
    client = SchemaRegistryClient({"url": registry_url})
    subject = f"{unique_name('smoke')}-value"
    schema_str = (
        '{"type":"record","name":"person","namespace":"bottledwater.public","fields":'
        '[{"name":"id","type":"int"},{"name":"name","type":["null","string"],"default":null}]}'
    )
    schema_id = client.register_schema(subject, Schema(schema_str, "AVRO"))
    fetched = SchemaRegistryClient({"url": registry_url}).get_schema(schema_id)
    assert fetched.schema_type == "AVRO"
    assert '"name":"person"' in fetched.schema_str.replace(" ", "")
    assert client.get_latest_version(subject).schema_id == schema_id
    client.delete_subject(subject, permanent=False)


def test_spark_merges_into_delta_and_reads_kafka(
    spark: SparkSession, kafka_bootstrap: str, tmp_path: Path
) -> None:
    from delta.tables import DeltaTable

    path = str(tmp_path / "people")
    spark.createDataFrame([(1, "a"), (2, "b")], "id INT, name STRING").write.format("delta").save(path)
    updates = spark.createDataFrame([(2, "B"), (3, "c")], "id INT, name STRING")
    (
        DeltaTable.forPath(spark, path)
        .alias("t")
        .merge(updates.alias("s"), "t.id = s.id")
        .whenMatchedUpdateAll()
        .whenNotMatchedInsertAll()
        .execute()
    )
    assert sorted(map(tuple, spark.read.format("delta").load(path).collect())) == [
        (1, "a"),
        (2, "B"),
        (3, "c"),
    ]

    topic = unique_name("smoke")
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])[topic].result(timeout=30)
    try:
        producer = Producer({"bootstrap.servers": kafka_bootstrap})
        for i in range(3):
            producer.produce(topic, key=str(i).encode(), value=f"v{i}".encode())
        assert producer.flush(30) == 0
        rows = (
            spark.read.format("kafka")
            .option("kafka.bootstrap.servers", kafka_bootstrap)
            .option("subscribe", topic)
            .option("startingOffsets", "earliest")
            .load()
            .selectExpr("CAST(key AS STRING) AS k", "CAST(value AS STRING) AS v")
            .collect()
        )
        assert sorted((r.k, r.v) for r in rows) == [("0", "v0"), ("1", "v1"), ("2", "v2")]
    finally:
        admin.delete_topics([topic])[topic].result(timeout=30)


def test_dagster_definitions_load_from_the_workspace() -> None:
    result = subprocess.run(
        [str(Path(sys.executable).parent / "dagster"), "definitions", "validate", "-w", "workspace.yaml"],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]


@pytest.mark.alone  # the lanes share the registry: run by itself, before them
def test_registry_keeps_schema_ids_across_a_restart(registry_url: str) -> None:
    """Schemas live in the stack's Postgres, so a restarted registry still resolves old ids."""
    from stack.config import StackConfig
    from stack.services import all_services

    registry = next(s for s in all_services(StackConfig.from_env()) if s.name == "registry")
    assert registry.address == registry_url, "this test restarts the local stack's registry"
    subject = f"{unique_name('restart')}-value"
    schema_str = '{"type":"record","name":"r","fields":[{"name":"id","type":"long"}]}'
    schema_id = SchemaRegistryClient({"url": registry_url}).register_schema(
        subject, Schema(schema_str, "AVRO")
    )

    registry.stop()
    assert not registry.healthy()
    registry.start()
    registry.wait_healthy(180.0)

    fetched = SchemaRegistryClient({"url": registry_url}).get_schema(schema_id)
    assert '"name":"r"' in fetched.schema_str.replace(" ", "")
