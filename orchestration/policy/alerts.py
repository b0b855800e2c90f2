"""What an alert says, and the JSON body each kind of webhook expects. Pure: nothing is sent here.

One `Alert` renders to three bodies:

- `slack`: a Slack incoming webhook message (`text` as the notification fallback, plus blocks);
- `pagerduty`: a PagerDuty Events API v2 event (POST to https://events.pagerduty.com/v2/enqueue);
  `dedup_key` ties the resolve to the trigger that opened the incident;
- `json`: the alert itself as plain JSON, for anything else (Opsgenie via a rule, a chat bot, a test).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

DetailValue = str | int | float | bool | None

# Limits documented by the receivers; a longer body is rejected, not truncated, by them.
PAGERDUTY_SUMMARY_MAX = 1024
PAGERDUTY_DEDUP_KEY_MAX = 255
SLACK_TEXT_MAX = 3000
SLACK_FIELDS_PER_SECTION = 10
CLIENT_NAME = "Bottled Water (Dagster)"


class Severity(enum.StrEnum):
    """PagerDuty's four severities; Slack shows them as an emoji."""

    CRITICAL = "critical"
    ERROR = "error"
    WARNING = "warning"
    INFO = "info"


class AlertAction(enum.StrEnum):
    TRIGGER = "trigger"
    RESOLVE = "resolve"


class WebhookFormat(enum.StrEnum):
    SLACK = "slack"
    PAGERDUTY = "pagerduty"
    JSON = "json"


SEVERITY_EMOJI = {
    Severity.CRITICAL: ":rotating_light:",
    Severity.ERROR: ":red_circle:",
    Severity.WARNING: ":warning:",
    Severity.INFO: ":information_source:",
}
RESOLVED_EMOJI = ":white_check_mark:"


@dataclass(frozen=True)
class Link:
    text: str
    href: str


@dataclass(frozen=True)
class Alert:
    """One notification about one incident.

    `dedup_key` is stable for the life of an incident (for example
    `bottledwater/slot_lag/bwdemo/bottledwater`): PagerDuty folds repeated triggers with the same key
    into one incident and closes it on the resolve with that key.
    """

    dedup_key: str
    action: AlertAction
    summary: str
    severity: Severity
    source: str
    component: str
    timestamp: datetime
    details: Mapping[str, DetailValue] = field(default_factory=dict)
    links: Sequence[Link] = ()
    group: str = "bottledwater"
    event_class: str = "cdc"

    def __post_init__(self) -> None:
        if not self.dedup_key or len(self.dedup_key) > PAGERDUTY_DEDUP_KEY_MAX:
            raise ValueError(
                f"alert dedup_key must be 1..{PAGERDUTY_DEDUP_KEY_MAX} characters, got {len(self.dedup_key)}"
            )
        if self.timestamp.tzinfo is None:
            raise ValueError("alert timestamp must be timezone-aware (receivers read it as UTC otherwise)")


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _detail_text(value: DetailValue) -> str:
    return "-" if value is None else str(value)


def slack_payload(alert: Alert) -> dict[str, Any]:
    """A Slack incoming-webhook message: `text` is what notifications and old clients show."""
    if alert.action is AlertAction.RESOLVE:
        headline = f"{RESOLVED_EMOJI} RESOLVED: {alert.summary}"
    else:
        headline = f"{SEVERITY_EMOJI[alert.severity]} {alert.severity.upper()}: {alert.summary}"
    headline = _clip(headline, SLACK_TEXT_MAX)
    blocks: list[dict[str, Any]] = [
        {"type": "section", "text": {"type": "mrkdwn", "text": headline}},
        {
            "type": "context",
            "elements": [
                {
                    "type": "mrkdwn",
                    "text": f"{alert.source} · {alert.component} · {alert.timestamp.isoformat()}"
                    f" · `{alert.dedup_key}`",
                }
            ],
        },
    ]
    fields = [
        {"type": "mrkdwn", "text": _clip(f"*{key}*\n{_detail_text(value)}", 2000)}
        for key, value in alert.details.items()
    ]
    for start in range(0, len(fields), SLACK_FIELDS_PER_SECTION):
        blocks.append({"type": "section", "fields": fields[start : start + SLACK_FIELDS_PER_SECTION]})
    if alert.links:
        links = " · ".join(f"<{link.href}|{link.text}>" for link in alert.links)
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": links}})
    return {"text": headline, "blocks": blocks}


def pagerduty_payload(alert: Alert, routing_key: str) -> dict[str, Any]:
    """An Events API v2 event. A resolve needs only the routing key, the action and the dedup key."""
    if not routing_key:
        raise ValueError("a PagerDuty event needs the integration's routing key (BW_PAGERDUTY_ROUTING_KEY)")
    event: dict[str, Any] = {
        "routing_key": routing_key,
        "event_action": alert.action.value,
        "dedup_key": alert.dedup_key,
    }
    if alert.action is AlertAction.RESOLVE:
        return event
    event["payload"] = {
        "summary": _clip(alert.summary, PAGERDUTY_SUMMARY_MAX),
        "source": alert.source,
        "severity": alert.severity.value,
        "timestamp": alert.timestamp.isoformat(),
        "component": alert.component,
        "group": alert.group,
        "class": alert.event_class,
        "custom_details": dict(alert.details),
    }
    event["client"] = CLIENT_NAME
    if alert.links:
        event["links"] = [{"href": link.href, "text": link.text} for link in alert.links]
    return event


def json_payload(alert: Alert) -> dict[str, Any]:
    return {
        "dedup_key": alert.dedup_key,
        "action": alert.action.value,
        "summary": alert.summary,
        "severity": alert.severity.value,
        "source": alert.source,
        "component": alert.component,
        "group": alert.group,
        "class": alert.event_class,
        "timestamp": alert.timestamp.isoformat(),
        "details": dict(alert.details),
        "links": [{"href": link.href, "text": link.text} for link in alert.links],
    }


def render(alert: Alert, fmt: WebhookFormat, routing_key: str | None = None) -> dict[str, Any]:
    """The body to POST for `fmt`."""
    if fmt is WebhookFormat.SLACK:
        return slack_payload(alert)
    if fmt is WebhookFormat.PAGERDUTY:
        return pagerduty_payload(alert, routing_key or "")
    return json_payload(alert)
