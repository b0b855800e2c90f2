"""The real graph through Dagster on the stack: replication_slot and snapshot_export, the cdc_worker
job streaming live changes, the merge into Delta, and the quality checks on what it wrote."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import dagster as dg
import psycopg2
import pytest

from cdc_worker.core.lsn import format_lsn
from orchestration import assets, changelog_asset, checks, jobs, lake_freshness
from orchestration.definitions import build_resources
from orchestration.discovery import CapturedTable, discover_tables
from orchestration.settings import load_settings
from tests.integration.conftest import unique_name
from tests.integration.orchestration_harness import delete_topics_with_prefix, pipeline_env, wait_for

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

SCHEMA = """
CREATE SCHEMA inventory;
CREATE TABLE people (id int PRIMARY KEY, name text, score numeric(10, 2), born date);
CREATE TABLE inventory.products (sku text PRIMARY KEY, title text NOT NULL, tags text[]);
INSERT INTO people SELECT g, 'person ' || g, g * 1.5, date '2000-01-01' + g FROM generate_series(1, 50) g;
INSERT INTO inventory.products VALUES ('BW-1', 'Bottle', '{glass}'), ('CAP-1', 'Cap', NULL);
"""
CHANGES = """
INSERT INTO people VALUES (51, 'late', 9.99, NULL);
UPDATE people SET name = 'renamed', score = NULL WHERE id = 7;
DELETE FROM people WHERE id IN (3, 4);
UPDATE people SET id = 1000 WHERE id = 10;
UPDATE inventory.products SET tags = '{glass,reusable}' WHERE sku = 'BW-1';
DELETE FROM inventory.products WHERE sku = 'CAP-1';
INSERT INTO inventory.products VALUES ('BW-2', 'Small bottle', '{}');
"""
CATCH_UP_TIMEOUT_S = 120
# The worker publishes progress each second while its position moves: let one go out after a catch-up.
PROGRESS_WAIT_S = 3.0


@dataclass
class Pipeline:
    dsn: str
    name: str
    warehouse: Path
    resources: dict[str, Any]
    tables: tuple[CapturedTable, ...]
    instance: dg.DagsterInstance

    def delta_assets(self) -> dg.AssetsDefinition:
        return assets.build_delta_assets(self.tables, self.name, changelog=True)

    def quality(self) -> dg.AssetChecksDefinition:
        keyed = {k: bool(t.key_columns) for k, t in assets.delta_keys(self.tables, self.name).items()}
        return checks.build_quality_checks(keyed, freshness_limit_s=3600)

    def changelog_checks(self) -> dg.AssetChecksDefinition:
        names = [f"{k.path[1]}.{k.path[2]}" for k in assets.delta_keys(self.tables, self.name)]
        return changelog_asset.build_changelog_checks(names, freshness_limit_s=3600)


@pytest.fixture
def pipeline(
    *,
    spark: SparkSession,  # the shared session: the Spark resource's getOrCreate returns it
    fresh_db: str,
    kafka_bootstrap: str,
    registry_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Pipeline]:
    name = unique_name("orch")
    with psycopg2.connect(fresh_db) as conn, conn.cursor() as cur:
        cur.execute(SCHEMA)
    conn.close()
    env = {
        **pipeline_env(fresh_db, name, kafka_bootstrap, registry_url),
        "BW_WAREHOUSE": str(tmp_path / "lake"),
        # The lake's changelog on: the merge job's one more asset and its checks are exercised too
        # (without it the mirrors are merged by the same code, less the changelog's commit).
        "BW_CHANGELOG": "on",
    }
    for variable, value in env.items():
        monkeypatch.setenv(variable, value)
    settings = load_settings(os.environ)
    instance = dg.DagsterInstance.ephemeral()
    try:
        resources = build_resources(settings)
        result = dg.materialize(
            [assets.replication_slot, assets.snapshot_export], resources=resources, instance=instance
        )
        assert result.success
        # The publication exists now, so the tables are discovered as the code location would.
        discovery = discover_tables(fresh_db, name, name)
        assert discovery.problem is None, discovery.problem
        yield Pipeline(fresh_db, name, tmp_path / "lake", resources, discovery.tables, instance)
    finally:
        instance.dispose()
        delete_topics_with_prefix(kafka_bootstrap, name)


def delta_keys(pipeline: Pipeline) -> list[dg.AssetKey]:
    return sorted(assets.delta_keys(pipeline.tables, pipeline.name), key=str)


def merge_and_check(pipeline: Pipeline) -> dg.ExecuteInProcessResult:
    result = dg.materialize(
        [pipeline.delta_assets(), pipeline.quality(), pipeline.changelog_checks()],
        resources=pipeline.resources,
        instance=pipeline.instance,
        raise_on_error=False,
    )
    assert result.success, [e.message for e in result.all_events if e.is_failure]
    return result


def _metadata(event: dg.DagsterEvent) -> dict[str, Any]:
    """A materialization's metadata as plain values."""
    materialization = event.step_materialization_data.materialization
    return {k: v.value for k, v in materialization.metadata.items()}


def check_results(result: dg.ExecuteInProcessResult) -> dict[str, dg.AssetCheckEvaluation]:
    return {f"{e.asset_key.to_user_string()}:{e.check_name}": e for e in result.get_asset_check_evaluations()}


def postgres_rows(dsn: str, query: str, params: tuple[Any, ...] = ()) -> set[tuple[Any, ...]]:
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        cur.execute(query, params)
        rows = {tuple(_hashable(v) for v in r) for r in cur.fetchall()}
    conn.close()
    return rows


def delta_rows(spark: SparkSession, path: Path, columns: list[str]) -> set[tuple[Any, ...]]:
    frame = spark.read.format("delta").load(str(path)).select(*columns)
    return {tuple(_hashable(v) for v in row) for row in frame.collect()}


def _hashable(value: Any) -> Any:
    """Arrays (lists on both sides) as tuples, so that rows can go in sets."""
    return tuple(value) if isinstance(value, list) else value


def caught_up(dsn: str, slot: str, target_lsn: str) -> bool:
    rows = postgres_rows(
        dsn,
        "SELECT confirmed_flush_lsn >= %s::pg_lsn FROM pg_replication_slots WHERE slot_name = %s",
        (target_lsn, slot),
    )
    return rows == {(True,)}


def worker_children() -> list[int]:
    """The `bottledwater` processes this test process started (through the cdc_worker job)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes()
        except OSError:
            continue
        # An argument that is the `bottledwater` executable itself: the Spark JVM, also a child,
        # merely mentions the name in its settings.
        arguments = [Path(arg.decode(errors="replace")).name for arg in cmdline.split(b"\0")[:2]]
        if int(fields[1]) == os.getpid() and "bottledwater" in arguments:
            found.append(int(stat.parent.name))
    return found


def test_slot_snapshot_worker_and_merge_through_dagster_leave_delta_equal_to_postgres(
    spark: SparkSession, pipeline: Pipeline
) -> None:
    slot_events = pipeline.instance.get_latest_materialization_event(assets.REPLICATION_SLOT)
    assert slot_events is not None and slot_events.asset_materialization is not None
    slot_metadata = slot_events.asset_materialization.metadata
    assert slot_metadata["created_by_this_run"].value is True
    assert slot_metadata["snapshot"].value == "done"
    assert {"confirmed_flush_lsn", "retained_wal_bytes", "wal_status", "active"} <= set(slot_metadata)

    # Live changes after the snapshot, streamed by the cdc_worker job itself.
    with psycopg2.connect(pipeline.dsn) as conn, conn.cursor() as cur:
        cur.execute(CHANGES)
        cur.execute("SELECT pg_current_wal_lsn()::text")
        target = cur.fetchone()[0]
    conn.close()
    outcome: dict[str, dg.ExecuteInProcessResult] = {}
    runner = threading.Thread(
        target=lambda: outcome.setdefault(
            "run",
            jobs.cdc_worker_job.execute_in_process(resources=pipeline.resources, instance=pipeline.instance),
        )
    )
    runner.start()
    try:
        wait_for(
            lambda: caught_up(pipeline.dsn, pipeline.name, target),
            "the worker to catch up",
            CATCH_UP_TIMEOUT_S,
        )
        time.sleep(PROGRESS_WAIT_S)  # a progress event past the changes, for the merge to prove
    finally:
        for pid in worker_children():
            os.kill(pid, signal.SIGTERM)  # the worker flushes, acknowledges and exits 0
        runner.join(timeout=120)
    assert outcome["run"].success
    worker_log = [r.user_message for r in pipeline.instance.all_logs(outcome["run"].run_id)]
    assert any("streaming slot" in m for m in worker_log), "the worker's log lines belong in the run"

    result = merge_and_check(pipeline)
    materialized = {e.asset_key.to_user_string(): e for e in result.get_asset_materialization_events()}
    assert set(materialized) == {"delta/public/people", "delta/inventory/products", "delta/changelog"}
    evaluations = check_results(result)
    # The lake's changelog: its position (what reads through it serve), as the slot page reads it
    # from its Delta log, and every mirror merged with it, so none trails it.
    logged = lake_freshness.observe_changelog(str(pipeline.warehouse / "_bw_state" / "changelog"))
    assert logged is not None and logged.proven_at is not None, "the changelog proves no position"
    changelog_metadata = _metadata(materialized["delta/changelog"])
    assert changelog_metadata["position"] == format_lsn(logged.position), changelog_metadata
    assert changelog_metadata["mirrors_behind_s"] == {"public.people": 0.0, "inventory.products": 0.0}
    for check in ("freshness", "mirrors_behind"):
        evaluation = evaluations[f"delta/changelog:{check}"]
        assert evaluation.passed, (check, evaluation.description)
    assert _metadata(materialized["delta/public/people"])["behind_changelog_s"] == 0.0
    for check in ("key_uniqueness", "non_null_keys", "schema_drift", "reconciliation", "freshness"):
        for table in ("delta/public/people", "delta/inventory/products"):
            evaluation = evaluations[f"{table}:{check}"]
            assert evaluation.passed, (table, check, evaluation.description)
    # The freshness of each table is the lake's: its common watermark, which the slot page reads from
    # the Delta logs without Spark and the merge's observation through Spark.
    lake = lake_freshness.observe(
        {
            f"{k.path[1]}.{k.path[2]}": str(pipeline.warehouse.joinpath(*k.path[1:]))
            for k in delta_keys(pipeline)
        }
    )
    assert lake is not None and lake.proven_at is not None, "no common watermark after the merge"
    for table in ("delta/public/people", "delta/inventory/products"):
        metadata = evaluations[f"{table}:freshness"].metadata
        assert metadata["common_watermark"].value == lake.position, (table, metadata)
        assert "common watermark" in str(evaluations[f"{table}:freshness"].description)
    observed = [
        e.asset_observation_data.asset_observation.metadata
        for e in result.all_events
        if e.event_type_value == "ASSET_OBSERVATION"
    ]
    assert observed and all(m["common_watermark"].value == lake.position for m in observed), observed

    # Maintenance compacts and vacuums (retention 0, forced: nothing reads these tables) and must
    # leave the data as it was; it reports per table what it did.
    maintained = jobs.maintenance_job(delta_keys(pipeline)).execute_in_process(
        run_config={"ops": {"maintain_delta_tables": {"config": {"vacuum_hours": 0, "force": True}}}},
        resources=pipeline.resources,
        instance=pipeline.instance,
    )
    assert maintained.success
    observed = {
        e.asset_observation_data.asset_observation.asset_key.to_user_string()
        for e in maintained.all_events
        if e.event_type_value == "ASSET_OBSERVATION"
    }
    assert observed == {"delta/public/people", "delta/inventory/products"}

    people = postgres_rows(pipeline.dsn, "SELECT id, name, score, born FROM people")
    assert (
        delta_rows(spark, pipeline.warehouse / "public" / "people", ["id", "name", "score", "born"]) == people
    )
    assert (1000, "person 10", Decimal("15.00"), date(2000, 1, 11)) in people  # the key change
    products = postgres_rows(pipeline.dsn, "SELECT sku, title, tags FROM inventory.products")
    assert ("BW-1", "Bottle", ("glass", "reusable")) in products
    lake = delta_rows(spark, pipeline.warehouse / "inventory" / "products", ["sku", "title", "tags"])
    assert lake == products


def test_a_planted_duplicate_fails_the_key_uniqueness_check(spark: SparkSession, pipeline: Pipeline) -> None:
    merge_and_check(pipeline)
    path = str(pipeline.warehouse / "public" / "people")
    spark.read.format("delta").load(path).where("id = 1").write.format("delta").mode("append").save(path)

    people = dg.AssetKey(["delta", "public", "people"])
    result = dg.materialize(
        [pipeline.delta_assets(), pipeline.quality()],
        selection=dg.AssetSelection.checks(dg.AssetCheckKey(people, "key_uniqueness")),
        resources=pipeline.resources,
        instance=pipeline.instance,
    )
    evaluations = check_results(result)
    assert set(evaluations) == {"delta/public/people:key_uniqueness"}
    evaluation = evaluations["delta/public/people:key_uniqueness"]
    assert not evaluation.passed
    assert evaluation.severity is dg.AssetCheckSeverity.ERROR
    assert evaluation.metadata["duplicate_keys"].value == 1
    assert "1 key(s)" in (evaluation.description or "")
