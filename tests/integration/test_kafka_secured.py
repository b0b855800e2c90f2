"""The worker and the merge on the stack's secured three-node cluster (SASL_SSL, SCRAM-SHA-512,
the standard authorizer's ACLs, RF 3): each with its own principal (the worker's Spark snapshot
too), refusals in one line at start, and no secret in any output. One cluster for the whole run
(`secured_kafka`)."""

from __future__ import annotations

import os
import subprocess
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import ConfigResource
from pyspark.sql import SparkSession

from spark_jobs.merge import KafkaSource, run_merge
from spark_jobs.merge_options import MergeOptions
from stack.kafka_cluster import MERGE, WORKER, tls_files
from tests.integration.conftest import unique_name
from tests.integration.lakehouse import assert_delta_equals_postgres
from tests.integration.secured_kafka import SecuredKafka
from tests.integration.worker_harness import (
    BOTTLEDWATER,
    WorkerProcess,
    compacted,
    execute,
    free_port,
    query,
    wait_caught_up,
    wait_for,
)


@dataclass
class Pipeline:
    kafka: SecuredKafka
    dsn: str
    tmp: Path
    prefix: str
    slot: str
    started: list[WorkerProcess]

    def args(self, *extra: str, prefix: str | None = None, bootstrap: str | None = None) -> list[str]:
        return [
            "-d", self.dsn, "-s", self.slot, "-p", prefix or self.prefix,
            "-b", bootstrap or self.kafka.bootstrap, "-f", "json", "--status-interval", "1",
            "--producer", "native", *extra,
        ]  # fmt: skip

    def start(self, *extra: str, user: str = WORKER, wait: bool = True, **kw: str) -> WorkerProcess:
        prefix, bootstrap = kw.pop("prefix", None), kw.pop("bootstrap", None)
        worker = WorkerProcess(
            self.args(*extra, prefix=prefix, bootstrap=bootstrap),
            self.tmp / f"worker-{len(self.started)}.log",
            env=self.kafka.worker_env(user, **kw),
        ).start()
        self.started.append(worker)
        if wait:
            worker.wait_streaming(timeout=120)
        return worker


@pytest.fixture
def pipeline(secured_kafka: SecuredKafka, fresh_db: str, tmp_path: Path) -> Iterator[Pipeline]:
    prefix = unique_name("sec")
    secured_kafka.grant(prefix)
    case = Pipeline(secured_kafka, fresh_db, tmp_path, prefix, unique_name("slot"), [])
    yield case
    for worker in case.started:
        worker.ensure_stopped()
    secured_kafka.delete_prefix(prefix)


def rows_of(dsn: str) -> dict[str, dict[str, object]]:
    return {f'{{"id": {i}}}': {"id": i, "v": v} for i, v in query(dsn, "SELECT id, v FROM t ORDER BY id")}


def test_worker_and_merge_each_with_their_own_principal(pipeline: Pipeline, spark: SparkSession) -> None:
    kafka, dsn = pipeline.kafka, pipeline.dsn
    execute(
        dsn,
        "CREATE TABLE t (id int PRIMARY KEY, v text)",
        "INSERT INTO t SELECT g, 'r' || g FROM generate_series(1, 500) g",
    )
    port = free_port()
    # The initial load on Spark: its tasks publish with the worker's principal and TLS settings,
    # and the driver reads the topics back (the keys they hold) as the worker does.
    worker = pipeline.start(
        "--metrics-port", str(port), "--snapshot-engine", "spark", "--spark-master", "local[2,4]", wait=False
    )  # fmt: skip
    worker.wait_streaming(timeout=300)
    assert "spark snapshot complete: 500 rows" in worker.log(), worker.log()[-3000:]
    execute(
        dsn,
        "UPDATE t SET v = 'u' WHERE id % 7 = 0",
        "DELETE FROM t WHERE id % 11 = 0",
        "UPDATE t SET id = id + 10000 WHERE id % 13 = 0",  # key changes: a tombstone and a new key
        "INSERT INTO t SELECT g, 'n' FROM generate_series(501, 600) g",
    )
    wait_caught_up(dsn, pipeline.slot, timeout=120)
    topic = f"{pipeline.prefix}.t"
    log = worker.log()
    assert "producer: native" in log, log[-3000:]

    # Replicated as the worker says: RF min(3, brokers) = 3, min.insync.replicas 2.
    admin = kafka.admin()
    metadata = admin.list_topics(topic, timeout=30).topics[topic]
    assert {len(p.replicas) for p in metadata.partitions.values()} == {3}
    configs = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, topic)])
    described = next(iter(configs.values())).result(timeout=30)
    assert described["min.insync.replicas"].value == "2"

    # The merge's principal reads what the worker wrote; the topic equals Postgres.
    reader = kafka.reader(MERGE)
    try:
        assert compacted(reader.read(topic, timeout=60)) == rows_of(dsn)
    finally:
        reader.close()

    # ... and may not write at all: its idempotent producer is refused by the cluster.
    refusals: list[KafkaError] = []
    producer = Producer(
        {
            "bootstrap.servers": kafka.bootstrap,
            **kafka.settings(MERGE),
            "error_cb": refusals.append,
            "acks": "all",
        }
    )
    producer.produce(topic, b"x", b'{"id": 1}', on_delivery=lambda error, _: refusals.append(error))
    producer.flush(20)
    producer.poll(1)
    assert any(
        e.code() in (KafkaError.CLUSTER_AUTHORIZATION_FAILED, KafkaError.TOPIC_AUTHORIZATION_FAILED)
        for e in refusals
    ), refusals

    # The Spark merge with the merge's own principal, topics found by pattern.
    warehouse = str(pipeline.tmp / "warehouse")
    options = MergeOptions(warehouse, "json", None, pipeline.prefix, postgres=dsn)
    source = KafkaSource(kafka.bootstrap, options=kafka.spark_options(MERGE))
    runs = run_merge(
        spark, options, source, str(pipeline.tmp / "checkpoints"), pattern=f"{pipeline.prefix}\\..*"
    )
    assert [r.error for r in runs] == [None]
    assert_delta_equals_postgres(spark, f"{warehouse}/public/t", dsn, "t")

    # No secret anywhere: log, /metrics, `topics`, --help, the process list.
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        metrics = response.read().decode()
    env = kafka.worker_env(WORKER)
    topics = run_command_with_env(["topics", *pipeline.args()[:6], "-b", kafka.bootstrap], env)
    assert "replication factor 3, min.insync.replicas 2 (3 broker(s)" in topics.stdout, topics
    helped = run_command_with_env(["--help"], env)
    assert worker.process is not None
    cmdline = Path(f"/proc/{worker.process.pid}/cmdline").read_bytes().decode()
    assert worker.stop() == 0
    secret = kafka.password(WORKER)
    for name, text in {
        "log": worker.log(), "metrics": metrics, "topics": topics.stdout + topics.stderr,
        "--help": helped.stdout + helped.stderr, "process list": cmdline,
    }.items():  # fmt: skip
        assert secret not in text, f"the worker's password in the {name}"
    assert "'sasl.password': '***'" in worker.log()


def run_command_with_env(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("BOTTLEDWATER_")}
    return subprocess.run(
        [BOTTLEDWATER, *args], capture_output=True, text=True, timeout=120, env={**base, **env}, check=False
    )


REFUSALS = {
    "a prefix not its own": ("Kafka's ACLs do not let User:bw-worker create topic", {}),
    "the merge's principal": ("Kafka's ACLs do not let User:bw-merge create topic", {"user": MERGE}),
    "a wrong password": ("SASL authentication error", {"sasl.password": "wr0ng-pa55word"}),
    "a certificate for another host": ("SSL handshake failed", {"bootstrap": "localhost"}),
    "an untrusted certificate": ("certificate verify failed", {"ca": "other"}),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_a_refusal_fails_at_start_in_one_line(case: str, pipeline: Pipeline) -> None:
    expected, how = REFUSALS[case]
    execute(pipeline.dsn, "CREATE TABLE t (id int PRIMARY KEY)", "INSERT INTO t VALUES (1)")
    kw: dict[str, str] = {}
    user = str(how.get("user", WORKER))
    if case == "a prefix not its own":
        kw["prefix"] = unique_name("notmine")
    if "sasl.password" in how:
        kw["sasl.password"] = str(how["sasl.password"])
    if how.get("bootstrap") == "localhost":
        kw["bootstrap"] = pipeline.kafka.bootstrap.replace("127.0.0.1", "localhost")
    if how.get("ca") == "other":
        kw["ssl.ca.location"] = str(tls_files(pipeline.kafka.cfg).other_ca_cert)
    worker = pipeline.start(user=user, wait=False, **kw)
    assert worker.wait_exit(timeout=120) == 2
    log = worker.log()
    errors = [line for line in log.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and expected in errors[0], log[-3000:]
    for secret in (pipeline.kafka.password(user), kw.get("sasl.password")):
        assert secret is None or secret not in log, "a password in the worker's log"
    assert not query(
        pipeline.dsn, "SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (pipeline.slot,)
    )


def test_exactly_once_with_the_pipelines_transactional_ids(pipeline: Pipeline) -> None:
    """--delivery exactly-once on RF 3 with ACLs: the worker's principal may write its slots'
    transactional ids (`bottledwater-<prefix>-<slot>`), and a read_committed reader sees each change."""
    execute(pipeline.dsn, "CREATE TABLE t (id int PRIMARY KEY, v text)")
    worker = pipeline.start("--delivery", "exactly-once")
    assert "exactly-once delivery: transactional.id bottledwater-" in worker.log()
    execute(
        pipeline.dsn,
        "INSERT INTO t SELECT g, 'r' || g FROM generate_series(1, 300) g",
        "UPDATE t SET v = 'u' WHERE id % 7 = 0",
        "DELETE FROM t WHERE id % 11 = 0",
    )
    wait_caught_up(pipeline.dsn, pipeline.slot, timeout=120)
    changes = 300 + 300 // 7 + 300 // 11
    reader = pipeline.kafka.reader()
    try:
        # Committed, and visible to read_committed once the coordinator wrote the commit markers on
        # every partition (after the commit returned: a moment later on three nodes).
        records = wait_for(
            lambda: [r for r in [reader.read(f"{pipeline.prefix}.t")] if len(r) >= changes], "the markers"
        )[0]
    finally:
        reader.close()
    assert len({(r.lsn, r.seq) for r in records}) == len(records) == changes
    assert compacted(records) == rows_of(pipeline.dsn)
    assert worker.stop() == 0


def test_a_principal_refused_transactions_stops_the_worker_in_one_line(
    secured_kafka: SecuredKafka, fresh_db: str, tmp_path: Path
) -> None:
    """The brokers refuse the worker's transactional id (no TransactionalId ACL): exit 2 at start
    with one line naming the ACL to grant, or --delivery at-least-once."""
    prefix = unique_name("sec")
    secured_kafka.grant(prefix, transactions=False)
    case = Pipeline(secured_kafka, fresh_db, tmp_path, prefix, unique_name("slot"), [])
    execute(fresh_db, "CREATE TABLE t (id int PRIMARY KEY, v text)")
    worker = case.start("--delivery", "exactly-once", wait=False)
    try:
        assert worker.wait_exit(120) == 2
        errors = [line for line in worker.log().splitlines() if " ERROR " in line]
        assert len(errors) == 1, worker.log()[-3000:]
        assert "refuses transactional.id" in errors[0] and "--delivery at-least-once" in errors[0]
        assert "TransactionalId" in errors[0]
        assert query(
            fresh_db, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s", (case.slot,)
        ) == [(0,)]
    finally:
        worker.ensure_stopped()
        secured_kafka.delete_prefix(prefix)
