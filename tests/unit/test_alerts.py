"""Alert bodies for Slack incoming webhooks, PagerDuty Events API v2 and plain JSON."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from orchestration.policy.alerts import (
    PAGERDUTY_SUMMARY_MAX,
    Alert,
    AlertAction,
    Link,
    Severity,
    WebhookFormat,
    pagerduty_payload,
    render,
    slack_payload,
)

AT = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def make_alert(action: AlertAction = AlertAction.TRIGGER, **overrides: object) -> Alert:
    values: dict[str, object] = {
        "dedup_key": "bottledwater/slot_lag/bwdemo/bottledwater",
        "action": action,
        "summary": "slot bottledwater on bwdemo retains 2.0 GiB of WAL",
        "severity": Severity.CRITICAL,
        "source": "127.0.0.1:55432/bwdemo",
        "component": "replication_slot",
        "timestamp": AT,
        "details": {"retained_wal_bytes": 2147483648, "wal_status": "extended", "active": False},
        "links": (Link("Dagster", "http://127.0.0.1:3000/assets/replication_slot"),),
    }
    values.update(overrides)
    return Alert(**values)  # type: ignore[arg-type]


def test_pagerduty_trigger_has_the_events_v2_fields() -> None:
    body = pagerduty_payload(make_alert(), "R0UTING")
    assert body["routing_key"] == "R0UTING"
    assert body["event_action"] == "trigger"
    assert body["dedup_key"] == "bottledwater/slot_lag/bwdemo/bottledwater"
    payload = body["payload"]
    assert payload["severity"] == "critical"
    assert payload["source"] == "127.0.0.1:55432/bwdemo"
    assert payload["summary"].startswith("slot bottledwater")
    assert payload["timestamp"] == "2026-01-02T03:04:05+00:00"
    assert payload["custom_details"]["retained_wal_bytes"] == 2147483648
    assert body["links"] == [{"href": "http://127.0.0.1:3000/assets/replication_slot", "text": "Dagster"}]
    json.dumps(body)  # the body must be serialisable as is


def test_pagerduty_resolve_carries_only_what_the_api_needs() -> None:
    body = pagerduty_payload(make_alert(AlertAction.RESOLVE), "R0UTING")
    assert body == {
        "routing_key": "R0UTING",
        "event_action": "resolve",
        "dedup_key": "bottledwater/slot_lag/bwdemo/bottledwater",
    }


def test_pagerduty_summary_is_clipped_to_its_limit_and_a_routing_key_is_required() -> None:
    body = pagerduty_payload(make_alert(summary="x" * 5000), "k")
    assert len(body["payload"]["summary"]) == PAGERDUTY_SUMMARY_MAX
    with pytest.raises(ValueError, match="routing key"):
        pagerduty_payload(make_alert(), "")


def test_slack_message_has_a_fallback_text_and_every_detail() -> None:
    body = slack_payload(make_alert())
    assert body["text"].startswith(":rotating_light: CRITICAL: slot bottledwater")
    fields = [f["text"] for b in body["blocks"] if "fields" in b for f in b["fields"]]
    assert fields == ["*retained_wal_bytes*\n2147483648", "*wal_status*\nextended", "*active*\nFalse"]
    assert any(
        "<http://127.0.0.1:3000/assets/replication_slot|Dagster>" in json.dumps(b) for b in body["blocks"]
    )


def test_slack_resolve_says_resolved() -> None:
    assert slack_payload(make_alert(AlertAction.RESOLVE))["text"].startswith(":white_check_mark: RESOLVED:")


def test_slack_splits_details_into_sections_of_ten_fields() -> None:
    body = slack_payload(make_alert(details={f"k{i}": i for i in range(23)}))
    sizes = [len(b["fields"]) for b in body["blocks"] if "fields" in b]
    assert sizes == [10, 10, 3]


def test_render_picks_the_format_and_json_keeps_everything() -> None:
    alert = make_alert()
    assert render(alert, WebhookFormat.SLACK) == slack_payload(alert)
    assert render(alert, WebhookFormat.PAGERDUTY, "k")["routing_key"] == "k"
    plain = render(alert, WebhookFormat.JSON)
    assert plain["action"] == "trigger" and plain["details"]["active"] is False
    assert plain["dedup_key"] == alert.dedup_key


def test_an_alert_rejects_a_naive_timestamp_and_an_overlong_dedup_key() -> None:
    with pytest.raises(ValueError, match="timezone"):
        make_alert(timestamp=datetime(2026, 1, 1))
    with pytest.raises(ValueError, match="dedup_key"):
        make_alert(dedup_key="k" * 256)
