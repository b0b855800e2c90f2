"""The slot-lag pager against a real slot made to lag, posting to a real local webhook receiver."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager

import dagster as dg
import psycopg2
import psycopg2.extras
import pytest
from psycopg2 import sql

from orchestration.assets import REPLICATION_SLOT
from orchestration.policy.links import UiLinks
from orchestration.policy.slot_health import LagThresholds
from orchestration.policy.supervision import SupervisionPolicy
from orchestration.resources import AlertingResource, PostgresResource
from orchestration.sensors import SensorSettings, build_slot_lag_alert
from tests.integration.conftest import unique_name
from tests.integration.orchestration_harness import wait_for, webhook_receiver

MIB = 1024**2
THRESHOLD = 16 * MIB
ROUTING_KEY = "test-routing-key"


def settings() -> SensorSettings:
    return SensorSettings(
        interval_s=30,
        # Only the WAL threshold can fire here: the slot is inactive on purpose, and a test must not
        # wait minutes for the lag in seconds to build up.
        thresholds=LagThresholds(
            max_retained_wal_bytes=THRESHOLD,
            max_lag_seconds=3600,
            inactive_grace_seconds=3600,
            cooldown_seconds=3600,
        ),
        policy=SupervisionPolicy(),
        default_status=dg.DefaultSensorStatus.STOPPED,
        links=UiLinks("http://127.0.0.1:3000"),
        slot_asset=REPLICATION_SLOT,
        topic_assets={},
        delta_paths={"public.never_merged": "/nonexistent/lake/public/never_merged"},
    )


def tick(sensor: dg.SensorDefinition, resources: dict[str, object], cursor: str | None) -> str | None:
    instance = dg.DagsterInstance.ephemeral()
    with dg.build_sensor_context(cursor=cursor, resources=resources, instance=instance) as context:
        result = sensor(context)
    assert isinstance(result, dg.SensorResult)
    return result.cursor


def retained_bytes(cur: psycopg2.extensions.cursor, slot: str) -> int:
    cur.execute(
        "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint FROM pg_replication_slots "
        "WHERE slot_name = %s",
        (slot,),
    )
    row = cur.fetchone()
    assert row is not None
    return int(row[0])


def slot_active(cur: psycopg2.extensions.cursor, slot: str) -> bool:
    cur.execute("SELECT active FROM pg_replication_slots WHERE slot_name = %s", (slot,))
    row = cur.fetchone()
    return bool(row and row[0])


@contextmanager
def streaming_consumer(dsn: str, slot: str) -> Iterator[None]:
    """A worker's replication connection streaming `slot` (publication of the same name)."""
    repl = psycopg2.connect(dsn, connection_factory=psycopg2.extras.LogicalReplicationConnection)
    try:
        repl.cursor().start_replication(
            slot_name=slot, decode=False, options={"proto_version": "1", "publication_names": slot}
        )
        yield
    finally:
        repl.close()


@pytest.mark.parametrize("webhook_format", ["pagerduty", "slack"])
def test_a_lagging_slot_pages_once_and_resolves_after_it_recovers(fresh_db: str, webhook_format: str) -> None:
    slot = unique_name("lag")
    conn = psycopg2.connect(fresh_db)
    conn.autocommit = True
    cur = conn.cursor()
    cur.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    with webhook_receiver() as receiver:
        resources = {
            "postgres": PostgresResource(dsn=fresh_db, slot=slot),
            "alerting": AlertingResource(
                webhook_url=receiver.url, webhook_format=webhook_format, pagerduty_routing_key=ROUTING_KEY
            ),
        }
        sensor = build_slot_lag_alert(settings())

        cursor = tick(sensor, resources, None)
        assert receiver.received() == [], "a fresh slot must not page"

        # Nobody consumes the slot while ~20 MiB of WAL is written: it must hold all of it.
        table = sql.Identifier(unique_name("t"))
        cur.execute(sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, pad text)").format(table))
        cur.execute(
            sql.SQL("INSERT INTO {} SELECT g, repeat('x', 1000) FROM generate_series(1, 20000) g").format(
                table
            )
        )
        assert retained_bytes(cur, slot) > THRESHOLD

        cursor = tick(sensor, resources, cursor)
        cursor = tick(sensor, resources, cursor)  # the same incident: no second page
        sent = receiver.received()
        assert len(sent) == 1, sent

        # A consumer confirms everything; a checkpoint logs the running transactions, which lets the
        # slot's restart_lsn move on too. A transaction open elsewhere on the server holds it back,
        # so this is retried until it has ended.
        def recover() -> bool:
            cur.execute("SELECT pg_replication_slot_advance(%s, pg_current_wal_lsn())", (slot,))
            cur.execute("CHECKPOINT")
            cur.execute("SELECT pg_replication_slot_advance(%s, pg_current_wal_lsn())", (slot,))
            return retained_bytes(cur, slot) < THRESHOLD

        # A publication for the worker below, made before the slot moves past it.
        cur.execute(sql.SQL("CREATE PUBLICATION {} FOR TABLE {}").format(sql.Identifier(slot), table))
        wait_for(recover, "the slot to release its WAL", timeout=120)

        # Nothing is retained any more, but a slot nobody streams is not healthy: still open.
        cursor = tick(sensor, resources, cursor)
        assert len(receiver.received()) == 1
        # A worker connects: the incident resolves.
        with streaming_consumer(fresh_db, slot):
            wait_for(lambda: slot_active(cur, slot), "the consumer to hold the slot", timeout=60)
            tick(sensor, resources, cursor)
        sent = receiver.received()
        assert len(sent) == 2, sent
    conn.close()

    trigger, resolve = sent
    if webhook_format == "pagerduty":
        assert trigger["routing_key"] == ROUTING_KEY
        assert trigger["event_action"] == "trigger"
        assert trigger["payload"]["severity"] == "error"
        assert trigger["payload"]["custom_details"]["breaches"] == "retained_wal_bytes"
        assert trigger["payload"]["custom_details"]["retained_wal_bytes"] > THRESHOLD
        # Beside the slot's lag, the lake's: no table merged yet, so none known.
        assert trigger["payload"]["custom_details"]["lake_watermark"].startswith("unknown")
        assert slot in trigger["payload"]["summary"]
        assert resolve == {
            "routing_key": ROUTING_KEY,
            "event_action": "resolve",
            "dedup_key": trigger["dedup_key"],
        }
    else:
        assert trigger["text"].startswith(":red_circle: ERROR: replication slot " + slot)
        assert "retains" in trigger["text"]
        assert resolve["text"].startswith(":white_check_mark: RESOLVED: replication slot " + slot)
    json.dumps(sent)  # what was received was JSON and stays JSON


def test_an_unreachable_webhook_fails_the_tick_and_the_alert_is_sent_on_the_next(fresh_db: str) -> None:
    slot = unique_name("lag")
    with psycopg2.connect(fresh_db) as conn, conn.cursor() as cur:
        cur.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    thresholds = LagThresholds(max_retained_wal_bytes=0, max_lag_seconds=3600, inactive_grace_seconds=3600)
    sensor = build_slot_lag_alert(
        SensorSettings(
            30,
            thresholds,
            SupervisionPolicy(),
            dg.DefaultSensorStatus.STOPPED,
            UiLinks("http://x"),
            REPLICATION_SLOT,
            {},
        )
    )
    with webhook_receiver() as receiver:
        dead_url = receiver.url
    # The receiver is gone: the POST fails, the tick fails, and the cursor (incident state) stays put.
    resources = {
        "postgres": PostgresResource(dsn=fresh_db, slot=slot),
        "alerting": AlertingResource(webhook_url=dead_url, timeout_s=2),
    }
    with pytest.raises(Exception, match="unreachable"):
        tick(sensor, resources, None)
    with webhook_receiver() as receiver:
        resources["alerting"] = AlertingResource(webhook_url=receiver.url)
        tick(sensor, resources, None)
        assert [b["action"] for b in receiver.received()] == ["trigger"]
