"""Is a replication slot a danger to its database? Pure: the sensors feed it what they observed.

A logical slot holds every WAL segment from its `restart_lsn` on. If the worker stops, or cannot keep
up, the WAL grows until the disk fills (and Postgres stops) or, with `max_slot_wal_keep_size`, until
Postgres invalidates the slot (`wal_status = lost`) and the stream can never resume without a new
snapshot. These checks page someone well before either.

Lag in seconds is not something Postgres reports for an inactive slot, so it is estimated from
samples of `pg_current_wal_lsn()` the sensor keeps between ticks: the oldest WAL the slot has not
confirmed was written no later than the first sample that was already past the confirmed position,
so `now - that sample's time` is a lower bound of the true lag. It never over-reports, and is as
sharp as the sensor's interval.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cdc_worker.core.units import human_bytes
from orchestration.policy.alerts import Severity

GIB = 1024**3
MAX_SAMPLES = 720


class Breach(enum.StrEnum):
    """Breach codes: the incident state machine compares sets of these."""

    RETAINED_WAL = "retained_wal_bytes"
    LAG_SECONDS = "lag_seconds"
    WAL_UNRESERVED = "wal_status_unreserved"
    WAL_LOST = "wal_status_lost"
    INACTIVE = "inactive"
    MISSING = "missing"


# wal_status values from pg_replication_slots (Postgres 13+).
WAL_STATUS_UNRESERVED = "unreserved"
WAL_STATUS_LOST = "lost"


@dataclass(frozen=True)
class SlotObservation:
    """One reading of pg_replication_slots for one slot, next to the server's WAL position."""

    slot_name: str
    database: str
    active: bool
    wal_status: str | None
    confirmed_flush_lsn: int | None
    restart_lsn: int | None
    current_wal_lsn: int
    # current LSN - restart_lsn; None when Postgres no longer knows the restart_lsn (a lost slot):
    # then nothing can be said about what it retains, and certainly not "0 B".
    retained_wal_bytes: int | None
    observed_at: float

    @property
    def lag_bytes(self) -> int | None:
        """How far the slot is behind the current WAL position (current LSN - confirmed_flush_lsn):
        what a lost slot missed, where its retained WAL is unknown."""
        behind = self.confirmed_flush_lsn if self.confirmed_flush_lsn is not None else self.restart_lsn
        return None if behind is None else max(0, self.current_wal_lsn - behind)


@dataclass(frozen=True)
class LagThresholds:
    """When a slot pages someone. Every value is documented in docs/orchestration.md.

    - `max_retained_wal_bytes` (int, default 1 GiB): WAL held by the slot (current LSN - restart_lsn).
    - `max_lag_seconds` (float, default 300): age of the oldest change the slot has not confirmed.
    - `inactive_grace_seconds` (float, default 120): how long no worker may be connected; a restart
      of the worker by its supervisor takes well under this.
    - `cooldown_seconds` (float, default 3600): how often an open incident is re-sent.
    """

    max_retained_wal_bytes: int = GIB
    max_lag_seconds: float = 300.0
    inactive_grace_seconds: float = 120.0
    cooldown_seconds: float = 3600.0

    def __post_init__(self) -> None:
        for name in ("max_retained_wal_bytes", "max_lag_seconds", "inactive_grace_seconds"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative, got {getattr(self, name)}")
        if self.cooldown_seconds <= 0:
            raise ValueError(f"cooldown_seconds must be positive, got {self.cooldown_seconds}")


@dataclass(frozen=True)
class WalSample:
    at: float
    wal_lsn: int


@dataclass(frozen=True)
class SlotMemory:
    """What the lag sensor remembers between ticks (kept in its cursor)."""

    samples: tuple[WalSample, ...] = ()
    inactive_since: float | None = None
    seen: bool = False
    last_confirmed_lsn: int | None = None
    last_observed_at: float | None = None
    # A worker has been connected to this slot since it was (re)created: until then, a slot whose
    # every check passes is not yet healthy, only waiting (a slot recreated by the runbook streams
    # nothing until a worker connects).
    worker_seen: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "samples": [[s.at, s.wal_lsn] for s in self.samples],
            "inactive_since": self.inactive_since,
            "seen": self.seen,
            "last_confirmed_lsn": self.last_confirmed_lsn,
            "last_observed_at": self.last_observed_at,
            "worker_seen": self.worker_seen,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> SlotMemory:
        if not data:
            return cls()
        return cls(
            samples=tuple(WalSample(float(at), int(lsn)) for at, lsn in data.get("samples", ())),
            inactive_since=data.get("inactive_since"),
            seen=bool(data.get("seen", False)),
            last_confirmed_lsn=data.get("last_confirmed_lsn"),
            last_observed_at=data.get("last_observed_at"),
            worker_seen=bool(data.get("worker_seen", False)),
        )


@dataclass(frozen=True)
class SlotHealth:
    """The verdict for one tick: breaches with a sentence each, and the figures behind them."""

    breaches: Mapping[Breach, str]
    lag_seconds: float | None
    retained_wal_bytes: int | None
    throughput_bytes_per_s: float | None
    memory: SlotMemory

    @property
    def awaiting_worker(self) -> bool:
        """No breach, but no worker has connected yet since the slot was (re)created: not healthy
        yet, so an open incident stays open until a worker connects or the grace runs out."""
        return not self.breaches and not self.memory.worker_seen


def estimate_lag_seconds(samples: Sequence[WalSample], confirmed_lsn: int, now: float) -> float:
    """Lower bound of the age of the oldest WAL past `confirmed_lsn` (see the module docstring)."""
    for sample in samples:
        if sample.wal_lsn > confirmed_lsn:
            return max(0.0, now - sample.at)
    return 0.0


def remember_sample(
    samples: Sequence[WalSample], sample: WalSample, confirmed_lsn: int
) -> tuple[WalSample, ...]:
    """Keep only what a later estimate can need: samples past the confirmed position, bounded.

    When over `MAX_SAMPLES`, the second-oldest is dropped: the oldest decides the lag now, and losing
    a middle one only makes a later estimate a looser lower bound, never a false alarm.
    """
    kept = [s for s in samples if s.wal_lsn > confirmed_lsn]
    kept.append(sample)
    while len(kept) > MAX_SAMPLES:
        del kept[1]
    return tuple(kept)


def format_bytes(n: int | None) -> str:
    """Human units; `None` (a lost slot's retained WAL) reads "unknown", never "0 B"."""
    return "unknown" if n is None else human_bytes(n)


def assess(
    observation: SlotObservation | None,
    memory: SlotMemory,
    thresholds: LagThresholds,
    now: float,
) -> SlotHealth:
    """Breaches of one slot at `now`, and what to remember for the next tick."""
    if observation is None:
        breaches: dict[Breach, str] = {}
        if memory.seen:
            # A slot that existed and vanished was dropped or never re-created: the stream's
            # position is gone and the tables need a new snapshot.
            breaches[Breach.MISSING] = "the replication slot no longer exists"
        return SlotHealth(breaches, None, None, None, SlotMemory(seen=memory.seen))
    lost = observation.wal_status == WAL_STATUS_LOST

    confirmed = observation.confirmed_flush_lsn
    confirmed_or_restart = confirmed if confirmed is not None else (observation.restart_lsn or 0)
    samples = remember_sample(
        memory.samples, WalSample(now, observation.current_wal_lsn), confirmed_or_restart
    )
    lag_s = estimate_lag_seconds(samples, confirmed_or_restart, now)
    if observation.active:
        inactive_since = None
    else:
        inactive_since = memory.inactive_since if memory.inactive_since is not None else now

    throughput: float | None = None
    if (
        confirmed is not None
        and memory.last_confirmed_lsn is not None
        and memory.last_observed_at is not None
        and now > memory.last_observed_at
    ):
        throughput = max(0, confirmed - memory.last_confirmed_lsn) / (now - memory.last_observed_at)

    breaches = {}
    retained = observation.retained_wal_bytes
    if retained is not None and retained > thresholds.max_retained_wal_bytes:
        breaches[Breach.RETAINED_WAL] = (
            f"retains {format_bytes(observation.retained_wal_bytes)} of WAL "
            f"(threshold {format_bytes(thresholds.max_retained_wal_bytes)})"
        )
    if lag_s > thresholds.max_lag_seconds:
        breaches[Breach.LAG_SECONDS] = (
            f"is at least {lag_s:.0f} s behind (threshold {thresholds.max_lag_seconds:.0f} s)"
        )
    if lost:
        behind = observation.lag_bytes
        breaches[Breach.WAL_LOST] = (
            "has lost required WAL (wal_status=lost)"
            + ("" if behind is None else f", {format_bytes(behind)} behind the current WAL position")
            + ": it can no longer stream; rebuild it (drop the slot, new snapshot)"
        )
    elif observation.wal_status == WAL_STATUS_UNRESERVED:
        breaches[Breach.WAL_UNRESERVED] = (
            "is past max_slot_wal_keep_size (wal_status=unreserved): Postgres will invalidate it "
            "at the next checkpoint"
        )
    if inactive_since is not None and now - inactive_since > thresholds.inactive_grace_seconds:
        breaches[Breach.INACTIVE] = f"has had no worker connected for {now - inactive_since:.0f} s"

    new_memory = SlotMemory(
        samples=samples,
        inactive_since=inactive_since,
        seen=True,
        last_confirmed_lsn=confirmed,
        last_observed_at=now,
        # A lost slot can never be streamed again: the slot that replaces it starts unproven.
        worker_seen=not lost and (memory.worker_seen or observation.active),
    )
    return SlotHealth(breaches, lag_s, observation.retained_wal_bytes, throughput, new_memory)


def severity_of(breaches: Mapping[Breach, str]) -> Severity:
    """Critical when the stream is lost or about to be; an error otherwise."""
    critical = {Breach.WAL_LOST, Breach.WAL_UNRESERVED, Breach.MISSING}
    return Severity.CRITICAL if critical & set(breaches) else Severity.ERROR
