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
    lake: LakeWatermark | None,
    current_wal_lsn: int | None,
    now: float,
    changelog: LakeWatermark | None = None,
) -> dict[str, DetailValue]:
    """What the slot page says of the lake, beside the slot's own lag: the mirrors' common watermark
    and, on a warehouse that keeps one, the changelog's position (what reads through it serve)."""
    details: dict[str, DetailValue] = (
        {"lake_watermark": "unknown: no common watermark (no merge yet, or a remote warehouse)"}
        if lake is None
        else _position("lake", lake, current_wal_lsn, now)
    )
    if changelog is not None:
        details |= _position("changelog", changelog, current_wal_lsn, now)
    return details


def _position(
    name: str, at: LakeWatermark, current_wal_lsn: int | None, now: float
) -> dict[str, DetailValue]:
    lag = at.lag_s(now)
    behind = None if current_wal_lsn is None else max(0, current_wal_lsn - at.position)
    return {
        f"{name}_watermark": format_lsn(at.position),
        f"{name}_behind_bytes": behind,
        f"{name}_behind": format_bytes(behind),
        f"{name}_lag_seconds": None if lag is None else round(lag, 1),
    }


def page_summary(
    lake: LakeWatermark | None, now: float, changelog: LakeWatermark | None = None
) -> str | None:
    """The lake's lag in a few words, for the page's summary (None when unknown): through its
    changelog when it keeps one, then its mirrors'."""
    said = []
    fresh = None if changelog is None else changelog.lag_s(now)
    if fresh is not None:
        said.append(f"the lake's changelog is complete up to {human_seconds(fresh)} ago")
    lag = None if lake is None else lake.lag_s(now)
    if lag is not None:
        whose = "its mirrors are" if fresh is not None else "the lake is"
        said.append(f"{whose} complete up to {human_seconds(lag)} ago")
    return "; ".join(said) or None
