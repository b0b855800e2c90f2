"""On-call notifications: one JSON POST per alert to a webhook, or the log alone when none is set."""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
from typing import Protocol

import dagster as dg
from pydantic import Field

from orchestration.policy.alerts import Alert, WebhookFormat, render

log = logging.getLogger(__name__)
DEFAULT_TIMEOUT_S = 10.0


class LogSink(Protocol):
    """A stdlib logger or Dagster's `context.log`."""

    def info(self, msg: str) -> object: ...

    def warning(self, msg: str) -> object: ...


class AlertDeliveryError(RuntimeError):
    """The webhook refused or could not be reached; the sensor retries on its next tick."""


class AlertingResource(dg.ConfigurableResource):
    """A Slack incoming webhook, the PagerDuty Events API v2, or any endpoint taking JSON.

    Unset `webhook_url`: every alert is written to the log (and so to the sensor's tick log) only;
    that is the default for development and the demo.
    """

    webhook_url: str | None = Field(default=None, description="Webhook URL (secret); unset: log only.")
    webhook_format: str = Field(default="json", description="slack, pagerduty or json.")
    pagerduty_routing_key: str | None = Field(
        default=None, description="PagerDuty Events v2 integration key (secret)."
    )
    timeout_s: float = Field(default=DEFAULT_TIMEOUT_S, description="HTTP timeout per POST.")

    def send(self, alert: Alert, logger: LogSink | None = None) -> bool:
        """POST `alert`; True when delivered, False when only logged. Raises AlertDeliveryError."""
        out: LogSink = logger or log
        line = f"[{alert.action.value}] {alert.severity.value}: {alert.summary} ({alert.dedup_key})"
        if not self.webhook_url:
            out.warning(f"alert (no webhook configured, log only) {line}")
            return False
        body = render(alert, WebhookFormat(self.webhook_format), self.pagerduty_routing_key)
        request = urllib.request.Request(
            self.webhook_url,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json", "User-Agent": "bottledwater-dagster"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                response.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read()[:500].decode(errors="replace")
            raise AlertDeliveryError(f"webhook answered HTTP {exc.code} to {line}: {detail}") from exc
        except (urllib.error.URLError, OSError) as exc:
            raise AlertDeliveryError(f"webhook unreachable for {line}: {exc}") from exc
        out.info(f"alert sent {line}")
        return True
