"""The code location's settings: defaults, parsing, and a clear error per bad variable."""

from __future__ import annotations

import pytest

from orchestration.policy.alerts import WebhookFormat
from orchestration.settings import (
    STACK_POSTGRES,
    Automation,
    SettingsError,
    infer_webhook_format,
    load_settings,
    parse_size,
)


def test_defaults_point_at_the_stack_and_alert_in_the_log_only() -> None:
    settings = load_settings({})
    assert settings.postgres_dsn == STACK_POSTGRES
    assert (settings.slot, settings.publication) == ("bottledwater", "bottledwater")
    assert settings.alerting.webhook_url is None
    assert settings.merge_cron == "*/5 * * * *" and settings.maintenance_cron == "0 3 * * *"
    assert settings.automation is Automation.RUNNING
    assert settings.secret_env == frozenset()
    assert not settings.changelog
    assert load_settings({"BW_CHANGELOG": "on"}).changelog
    assert settings.mirror_budget_s is None
    assert load_settings({"BW_CHANGELOG": "on", "BW_MIRROR_BUDGET_SECONDS": "5"}).mirror_budget_s == 5.0
    with pytest.raises(SettingsError, match="set BW_CHANGELOG=on"):
        load_settings({"BW_MIRROR_BUDGET_SECONDS": "5"})


def test_variables_are_read_and_secrets_are_remembered_by_name() -> None:
    settings = load_settings(
        {
            "BOTTLEDWATER_POSTGRES": "postgresql://u:pw@db/app",
            "BOTTLEDWATER_SLOT": "orders_slot",
            "BOTTLEDWATER_TABLES": "public.orders, inventory.*",
            "BOTTLEDWATER_OUTPUT_FORMAT": "JSON",
            "BW_MERGE_CRON": "*/10  * * * *",
            "BW_SLOT_MAX_RETAINED_WAL": "512MiB",
            "BW_SLOT_MAX_LAG_SECONDS": "90",
            "BW_ALERT_WEBHOOK_URL": "https://hooks.slack.com/services/T/B/X",
            "BW_AUTOMATION": "stopped",
        }
    )
    assert settings.publication == "orders_slot"  # follows the slot unless set
    assert settings.tables == ("public.orders", "inventory.*")
    assert settings.output_format == "json"
    assert settings.merge_cron == "*/10 * * * *"
    assert settings.thresholds.max_retained_wal_bytes == 512 * 1024**2
    assert settings.thresholds.max_lag_seconds == 90
    assert settings.alerting.webhook_format is WebhookFormat.SLACK
    assert settings.automation is Automation.STOPPED
    assert settings.secret_env == {"BOTTLEDWATER_POSTGRES", "BW_ALERT_WEBHOOK_URL"}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1073741824", 1024**3),
        ("1GiB", 1024**3),
        ("2GB", 2 * 1000**3),
        ("1.5 MiB", 1572864),
        ("10kb", 10_000),
    ],
)
def test_sizes(text: str, expected: int) -> None:
    assert parse_size(text, "X") == expected


@pytest.mark.parametrize(
    ("env", "variable"),
    [
        ({"BW_SLOT_MAX_RETAINED_WAL": "lots"}, "BW_SLOT_MAX_RETAINED_WAL"),
        ({"BW_SLOT_MAX_LAG_SECONDS": "-1"}, "BW_SLOT_MAX_LAG_SECONDS"),
        ({"BW_MERGE_CRON": "every five minutes"}, "BW_MERGE_CRON"),
        ({"BW_MAINTENANCE_CRON": "0 3 * *"}, "BW_MAINTENANCE_CRON"),
        ({"BOTTLEDWATER_SLOT": "Bad-Slot"}, "BOTTLEDWATER_SLOT"),
        ({"BOTTLEDWATER_OUTPUT_FORMAT": "xml"}, "BOTTLEDWATER_OUTPUT_FORMAT"),
        ({"BW_ALERT_WEBHOOK_FORMAT": "teams"}, "BW_ALERT_WEBHOOK_FORMAT"),
        ({"BW_ALERT_WEBHOOK_URL": "ftp://x"}, "BW_ALERT_WEBHOOK_URL"),
        ({"BW_ALERT_WEBHOOK_URL": "https://events.pagerduty.com/v2/enqueue"}, "BW_PAGERDUTY_ROUTING_KEY"),
        ({"BW_ALERT_COOLDOWN_SECONDS": "0"}, "BW_ALERT_COOLDOWN_SECONDS"),
        (
            {"BW_WORKER_BACKOFF_SECONDS": "60", "BW_WORKER_BACKOFF_MAX_SECONDS": "5"},
            "BW_WORKER_BACKOFF_MAX_SECONDS",
        ),
        ({"BW_AUTOMATION": "sometimes"}, "BW_AUTOMATION"),
        ({"BW_SENSOR_INTERVAL_SECONDS": "0"}, "BW_SENSOR_INTERVAL_SECONDS"),
        ({"BW_CHANGELOG": "yes please"}, "BW_CHANGELOG"),
    ],
)
def test_a_bad_variable_is_named_in_the_error(env: dict[str, str], variable: str) -> None:
    with pytest.raises(SettingsError, match=variable):
        load_settings(env)


def test_the_webhook_format_follows_the_url_unless_set() -> None:
    assert infer_webhook_format("https://events.pagerduty.com/v2/enqueue") is WebhookFormat.PAGERDUTY
    assert infer_webhook_format("https://hooks.slack.com/services/a") is WebhookFormat.SLACK
    assert infer_webhook_format("http://127.0.0.1:9999/hook") is WebhookFormat.JSON
    pd = load_settings(
        {"BW_ALERT_WEBHOOK_URL": "https://events.pagerduty.com/v2/enqueue", "BW_PAGERDUTY_ROUTING_KEY": "abc"}
    )
    assert (
        pd.alerting.webhook_format is WebhookFormat.PAGERDUTY and pd.alerting.pagerduty_routing_key == "abc"
    )
    forced = load_settings(
        {"BW_ALERT_WEBHOOK_URL": "https://hooks.slack.com/x", "BW_ALERT_WEBHOOK_FORMAT": "json"}
    )
    assert forced.alerting.webhook_format is WebhookFormat.JSON


def test_links_are_absolute_urls_and_the_runbook_defaults_to_the_rendered_docs() -> None:
    settings = load_settings({"BW_DAGSTER_URL": "http://127.0.0.1:3123/"})
    assert settings.dagster_url == "http://127.0.0.1:3123"
    assert settings.runbook_url.startswith("https://") and settings.runbook_url.endswith(
        "docs/orchestration.md"
    )
    custom = load_settings({"BW_RUNBOOK_URL": "https://wiki.example/bw/runbook#old"})
    assert custom.runbook_url == "https://wiki.example/bw/runbook"
    with pytest.raises(SettingsError, match="BW_RUNBOOK_URL='docs/orchestration.md': expected an absolute"):
        load_settings({"BW_RUNBOOK_URL": "docs/orchestration.md"})
