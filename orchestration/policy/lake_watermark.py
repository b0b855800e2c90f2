"""The lake's common watermark as a page weighs it: how far a consistent reader of the lake is behind
the source, beside the slot's own lag. Pure: `orchestration.lake_freshness` observes the watermark
from the Delta logs.
"""

from __future__ import annotations

from dataclasses import dataclass

from cdc_worker.core.lsn import format_lsn
from cdc_worker.core.units import human_seconds
from orchestration.policy.alerts import DetailValue
from orchestration.policy.slot_health import format_bytes


@dataclass(frozen=True)
class LakeWatermark:
    """The newest position every table serves, and when the worker proved it (epoch seconds)."""

    position: int
    proven_at: float | None

    def lag_s(self, now: float) -> float | None:
        return None if self.proven_at is None else max(0.0, now - self.proven_at)


def page_details(
    lake: LakeWatermark | None, current_wal_lsn: int | None, now: float
) -> dict[str, DetailValue]:
    """What the slot page says of the lake, beside the slot's own lag."""
    if lake is None:
        return {"lake_watermark": "unknown: no common watermark (no merge yet, or a remote warehouse)"}
    lag = lake.lag_s(now)
    behind = None if current_wal_lsn is None else max(0, current_wal_lsn - lake.position)
    return {
        "lake_watermark": format_lsn(lake.position),
        "lake_behind_bytes": behind,
        "lake_behind": format_bytes(behind),
        "lake_lag_seconds": None if lag is None else round(lag, 1),
    }


def page_summary(lake: LakeWatermark | None, now: float) -> str | None:
    """The lake's lag in a few words, for the page's summary (None when unknown)."""
    lag = None if lake is None else lake.lag_s(now)
    return None if lag is None else f"the lake is complete up to {human_seconds(lag)} ago"
