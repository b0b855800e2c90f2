"""Column lists and row filters (`--columns`, `--exclude-columns`, `--row-filter`) against the
stack's Postgres 15, Kafka and registry: the topics hold exactly the published columns and rows,
through updates that move rows into and out of the filter, in JSON and Avro (two workers on the
same database); the refusals at start; a changed selection on a resumed slot refused."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient

from tests.integration.conftest import unique_name
from tests.integration.worker_harness import (
    AvroDecoder,
    TopicReader,
    WorkerProcess,
    compacted,
    delete_topics_with_prefix,
    execute,
    query,
    wait_caught_up,
    worker_args,
)

SCHEMA = [
    "CREATE TABLE users (id int PRIMARY KEY, email text, password_hash text, national_id text)",
    "INSERT INTO users SELECT g, 'u' || g || '@x', 'hash' || g, 'nid' || g FROM generate_series(1, 300) g",
    # A filter on a column outside the key needs it in the replica identity: FULL here.
    "CREATE TABLE orders (id int PRIMARY KEY, region text NOT NULL, total int)",
    "ALTER TABLE orders REPLICA IDENTITY FULL",
    "INSERT INTO orders SELECT g, (ARRAY['eu', 'us'])[g % 2 + 1], g FROM generate_series(1, 400) g",
]
SELECTION = ["--exclude-columns", "users=password_hash,national_id", "--row-filter", "orders=region = 'eu'"]
WORKLOAD = [
    "UPDATE orders SET region = 'us' WHERE id IN (2, 4)",  # out of the filter: a delete of the key
    "UPDATE orders SET region = 'eu' WHERE id IN (1, 3)",  # into it: an insert
    "UPDATE orders SET total = -1 WHERE id IN (6, 5)",  # inside it (6), outside it (5)
    "INSERT INTO orders VALUES (1001, 'eu', 1), (1002, 'us', 2)",
    "DELETE FROM orders WHERE id IN (8, 7)",
    "UPDATE users SET email = 'new@x', password_hash = 'secret' WHERE id = 1",
]


@pytest.fixture
def prefixes(kafka_bootstrap: str) -> Iterator[dict[str, str]]:
    names = {fmt: unique_name(f"bw{fmt}") for fmt in ("json", "avro")}
    yield names
    for name in names.values():
        delete_topics_with_prefix(kafka_bootstrap, name)


def _expected(dsn: str, statement: str) -> dict[str, Any]:
    """Rows as the compacted topic should hold them: canonical key text -> row."""
    with_names = query(dsn, f"SELECT row_to_json(t)::text FROM ({statement}) t")
    rows = [json.loads(text) for (text,) in with_names]
    return {json.dumps({"id": row["id"]}): row for row in rows}


def test_topics_hold_the_published_columns_and_rows(
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
    slots = {fmt: unique_name(f"slot_{fmt}") for fmt in prefixes}
    options = {"prefix": "", "bootstrap": kafka_bootstrap, "registry": registry_url}
    for fmt, prefix in prefixes.items():
        args = worker_args(fresh_db, slots[fmt], **{**options, "prefix": prefix}, fmt=fmt)
        workers.append(WorkerProcess([*args, *SELECTION], tmp_path / f"{fmt}.log").start())
    for worker in workers:
        worker.wait_streaming(60)
    execute(fresh_db, *WORKLOAD)
    for slot in slots.values():
        wait_caught_up(fresh_db, slot, 60)

    users = _expected(fresh_db, "SELECT id, email FROM users")
    orders = _expected(fresh_db, "SELECT id, region, total FROM orders WHERE region = 'eu'")
    for fmt, decode in (("json", json.loads), ("avro", AvroDecoder(registry_url))):
        prefix = prefixes[fmt]
        assert compacted(reader.read(f"{prefix}.users", 300), decode) == users, fmt
        records = reader.read(f"{prefix}.orders", 200)
        assert compacted(records, decode) == orders, fmt
        streamed = [(r.op, decode(r.key)["id"]) for r in records if r.op != "r"]
        assert sorted(streamed) == sorted([("d", 2), ("d", 4), ("c", 1), ("c", 3), ("u", 6), ("c", 1001),
                                           ("d", 8)]), fmt  # fmt: skip
    value_schema = SchemaRegistryClient({"url": registry_url}).get_latest_version(
        f"{prefixes['avro']}.users-value"
    )
    fields = [f["name"] for f in json.loads(value_schema.schema.schema_str)["fields"]]
    assert fields == ["id", "email"], "the schema carries only the published columns"

    # A resumed slot keeps its selection: another filter is refused in one line.
    assert workers[0].stop() == 0
    args = worker_args(fresh_db, slots["json"], **{**options, "prefix": prefixes["json"]}, fmt="json")
    changed = [
        *args,
        "--exclude-columns",
        "users=password_hash,national_id",
        "--row-filter",
        "orders=total > 0",
    ]
    again = WorkerProcess(changed, tmp_path / "changed.log").start()
    workers.append(again)
    assert again.wait_exit(60) == 2
    (line,) = [ln for ln in again.log().splitlines() if "differs from what slot" in ln]
    assert "row filter of public.orders" in line and f"bottledwater slot drop -s {slots['json']}" in line


def test_selections_that_cannot_work_are_refused_at_start(
    fresh_db: str, kafka_bootstrap: str, registry_url: str, tmp_path: Path
) -> None:
    execute(fresh_db, *SCHEMA)
    args = worker_args(fresh_db, unique_name("slot"), prefix=unique_name("bw"), bootstrap=kafka_bootstrap,
                 registry=registry_url, fmt="json")  # fmt: skip

    def refusal(*options: str) -> str:
        worker = WorkerProcess([*args, *options], tmp_path / f"refused-{len(options)}.log").start()
        try:
            assert worker.wait_exit(60) == 2
        finally:
            worker.ensure_stopped()
        return worker.log()

    log = refusal("--exclude-columns", "users=id", "--row-filter", "users=email LIKE 'a%'")
    assert "column id of public.users is in its key or replica identity" in log
    assert "--row-filter for public.users uses column email, which is not in its replica identity" in log
    # An expression Postgres does not take as a row filter: its own reason, from a probe publication.
    log = refusal("--row-filter", "orders=total > (SELECT 1)")
    assert "--row-filter for public.orders is refused by Postgres: " in log
    assert not query(fresh_db, "SELECT 1 FROM pg_publication"), "nothing was created"
