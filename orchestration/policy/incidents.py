"""The incident state machine behind every alerting sensor. Pure: time comes in as an argument.

An incident opens when a check first finds a breach and stays open until a check finds none. The
on-call engineer hears about it:

- once when it opens (TRIGGER);
- at once again when a new kind of breach joins it (ESCALATE: a lagging slot whose WAL is now
  `lost` is a different emergency from a slow one);
- again after `cooldown_s` while it stays open (REPEAT), so a forgotten incident is not silent;
- once when it closes (RESOLVE), and only once the check can vouch for health: a check that finds
  no breach but is not `settled` yet (a slot recreated by the runbook that no worker has connected
  to) keeps an open incident open.

The sensor persists `IncidentState` in its cursor (`to_json`/`from_json`) and only after the
notification was delivered, so a webhook that is down is retried on the next tick, not lost.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any


class Notify(enum.StrEnum):
    NOTHING = "nothing"
    TRIGGER = "trigger"
    ESCALATE = "escalate"
    REPEAT = "repeat"
    RESOLVE = "resolve"


@dataclass(frozen=True)
class IncidentState:
    """`reasons` are the breach codes the on-call engineer was last told about."""

    open: bool = False
    opened_at: float | None = None
    last_notified_at: float | None = None
    reasons: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "open": self.open,
            "opened_at": self.opened_at,
            "last_notified_at": self.last_notified_at,
            "reasons": list(self.reasons),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> IncidentState:
        if not data:
            return cls()
        return cls(
            open=bool(data.get("open", False)),
            opened_at=_opt_float(data.get("opened_at")),
            last_notified_at=_opt_float(data.get("last_notified_at")),
            reasons=tuple(str(r) for r in data.get("reasons", ())),
        )


def _opt_float(value: Any) -> float | None:
    return None if value is None else float(value)


@dataclass(frozen=True)
class Transition:
    state: IncidentState
    notify: Notify


def step(
    state: IncidentState, breaches: Iterable[str], now: float, cooldown_s: float, *, settled: bool = True
) -> Transition:
    """The next state and what to tell the on-call engineer, given this check's breach codes."""
    if cooldown_s <= 0:
        raise ValueError(f"cooldown_s must be positive, got {cooldown_s}")
    current = tuple(sorted(set(breaches)))
    if not current:
        if state.open and settled:
            return Transition(IncidentState(), Notify.RESOLVE)
        return Transition(state, Notify.NOTHING)
    if not state.open:
        return Transition(IncidentState(True, now, now, current), Notify.TRIGGER)
    if not set(current) <= set(state.reasons):
        merged = tuple(sorted(set(current) | set(state.reasons)))
        return Transition(IncidentState(True, state.opened_at, now, merged), Notify.ESCALATE)
    last = state.last_notified_at if state.last_notified_at is not None else now
    if now - last >= cooldown_s:
        return Transition(IncidentState(True, state.opened_at, now, current), Notify.REPEAT)
    return Transition(state, Notify.NOTHING)
