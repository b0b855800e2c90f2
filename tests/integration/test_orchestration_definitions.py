"""The code location as Dagster loads it: per-table assets discovered from a real publication, and a
load that still succeeds, with a clear message, when Postgres cannot be reached."""

from __future__ import annotations

import logging

import dagster as dg
import psycopg2
import pytest

from orchestration.definitions import defs
from tests.integration.conftest import unique_name

UNREACHABLE = "postgresql://postgres@127.0.0.1:1/nowhere"


def load(monkeypatch: pytest.MonkeyPatch, **env: str) -> dg.Definitions:
    for variable in (
        "BOTTLEDWATER_TOPIC_PREFIX",
        "BOTTLEDWATER_PUBLICATION",
        "BW_ALERT_WEBHOOK_URL",
        "BW_CHANGELOG",
    ):
        monkeypatch.delenv(variable, raising=False)
    for variable, value in env.items():
        monkeypatch.setenv(variable, value)
    loaded = defs()
    loaded.get_repository_def()  # resolves every job, sensor and schedule, as the loader does
    return loaded


def keys(loaded: dg.Definitions) -> set[str]:
    return {k.to_user_string() for k in loaded.resolve_all_asset_keys()}


def test_the_tables_of_the_publication_become_topic_and_delta_assets(
    fresh_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    slot = unique_name("defs")
    with psycopg2.connect(fresh_db) as conn, conn.cursor() as cur:
        cur.execute(
            'CREATE SCHEMA "Sales"; CREATE TABLE "Sales"."Order Lines" (id int PRIMARY KEY, qty int); '
            "CREATE TABLE people (id int PRIMARY KEY); CREATE TABLE notes (body text); "
            "CREATE TABLE not_captured (id int PRIMARY KEY); "
            f'CREATE PUBLICATION {slot} FOR TABLE "Sales"."Order Lines", people; '
            f"CREATE PUBLICATION {slot}_inserts FOR TABLE notes WITH (publish = 'insert, truncate')"
        )
    conn.close()
    loaded = load(monkeypatch, BOTTLEDWATER_POSTGRES=fresh_db, BOTTLEDWATER_SLOT=slot, BW_CHANGELOG="off")
    assert keys(loaded) == {
        "replication_slot",
        "snapshot_export",
        "kafka/bottledwater.control",
        "kafka/Sales.Order_20_Lines",
        "kafka/people",
        "kafka/notes",
        "delta/Sales/Order_20_Lines",
        "delta/public/people",
        "delta/public/notes",
    }
    assert {j.name for j in loaded.resolve_all_job_defs()} >= {
        "cdc_worker", "drop_slot", "merge", "maintenance", "reconcile"
    }  # fmt: skip
    assert {s.name for s in loaded.schedules or []} == {"merge_schedule", "maintenance_schedule"}
    assert {s.name for s in loaded.sensors or []} == {
        "cdc_worker_supervisor",
        "slot_lag_alert",
        "run_failure_alert",
        "continuous_merge_supervisor",
    }
    checks = {k.to_user_string() for k in loaded.get_repository_def().asset_checks_defs_by_key}
    # The unkeyed table has no key to check and cannot reconcile (its deletes are not captured).
    assert "delta/public/notes:freshness" in checks
    assert "delta/public/notes:key_uniqueness" not in checks
    assert "delta/public/people:reconciliation" in checks
    assert not {k for k in keys(loaded) if "changelog" in k}

    # With the lake's changelog (the default): one more Delta asset, upstream of every mirror, merged
    # and checked by the merge job.
    kept = load(monkeypatch, BOTTLEDWATER_POSTGRES=fresh_db, BOTTLEDWATER_SLOT=slot)
    assert keys(kept) == keys(loaded) | {"delta/changelog"}
    graph = kept.resolve_asset_graph()
    assert (
        dg.AssetKey(["delta", "changelog"])
        in graph.get(dg.AssetKey(["delta", "public", "people"])).parent_keys
    )
    merge = kept.resolve_job_def("merge")
    assert dg.AssetKey(["delta", "changelog"]) in merge.asset_layer.selected_asset_keys
    checks = {k.to_user_string() for k in kept.get_repository_def().asset_checks_defs_by_key}
    assert {"delta/changelog:freshness", "delta/changelog:mirrors_behind"} <= checks


def test_an_unreachable_postgres_still_loads_with_a_message(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="orchestration.definitions"):
        loaded = load(monkeypatch, BOTTLEDWATER_POSTGRES=UNREACHABLE)
    assert keys(loaded) == {"replication_slot", "snapshot_export", "kafka/bottledwater.control"}
    assert {j.name for j in loaded.resolve_all_job_defs()} >= {"cdc_worker", "drop_slot"}
    assert "merge" not in {j.name for j in loaded.resolve_all_job_defs()}
    assert any("Postgres is not reachable" in r.getMessage() for r in caplog.records)


def test_a_bad_setting_fails_the_load_and_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="BW_MERGE_CRON"):
        load(monkeypatch, BOTTLEDWATER_POSTGRES=UNREACHABLE, BW_MERGE_CRON="every five minutes")
