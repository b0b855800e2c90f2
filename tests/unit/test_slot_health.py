"""Slot health: thresholds, wal_status, an inactive slot, a vanished slot, and the lag estimate."""

from __future__ import annotations

import json

from orchestration.policy.alerts import Severity
from orchestration.policy.slot_health import (
    MAX_SAMPLES,
    Breach,
    LagThresholds,
    SlotMemory,
    SlotObservation,
    WalSample,
    assess,
    estimate_lag_seconds,
    format_bytes,
    remember_sample,
    severity_of,
)

MIB = 1024**2
THRESHOLDS = LagThresholds(
    max_retained_wal_bytes=64 * MIB, max_lag_seconds=300, inactive_grace_seconds=60, cooldown_seconds=3600
)


def observe(
    now: float,
    *,
    confirmed: int,
    current: int,
    active: bool = True,
    wal_status: str = "reserved",
    restart: int | None = None,
) -> SlotObservation:
    restart_lsn = confirmed if restart is None else restart
    return SlotObservation(
        "bw", "db", active, wal_status, confirmed, restart_lsn, current, current - restart_lsn, now
    )


def test_a_slot_keeping_up_is_healthy() -> None:
    health = assess(observe(0, confirmed=1000, current=1000), SlotMemory(), THRESHOLDS, 0)
    assert health.breaches == {}
    assert health.lag_seconds == 0
    assert health.memory.seen


def test_retained_wal_over_the_threshold_is_a_breach_and_under_it_is_not() -> None:
    over = assess(observe(0, confirmed=0, current=65 * MIB), SlotMemory(), THRESHOLDS, 0)
    assert set(over.breaches) == {Breach.RETAINED_WAL}
    assert "65.0 MiB" in over.breaches[Breach.RETAINED_WAL]
    under = assess(observe(0, confirmed=0, current=63 * MIB), SlotMemory(), THRESHOLDS, 0)
    assert under.breaches == {}


def test_lag_seconds_is_the_age_of_the_first_sample_past_the_confirmed_position() -> None:
    samples = [WalSample(0, 100), WalSample(30, 200), WalSample(60, 300)]
    assert estimate_lag_seconds(samples, 150, now=100) == 70  # 200 was written by t=30
    assert estimate_lag_seconds(samples, 99, now=100) == 100
    assert estimate_lag_seconds(samples, 300, now=100) == 0


def test_a_stuck_slot_breaches_the_lag_threshold_as_ticks_go_by() -> None:
    memory = SlotMemory()
    said = []
    for now in (0, 120, 240, 360):
        health = assess(observe(now, confirmed=500, current=1000 + now), memory, THRESHOLDS, now)
        memory = health.memory
        said.append(Breach.LAG_SECONDS in health.breaches)
    assert said == [False, False, False, True]


def test_memory_drops_samples_the_slot_has_confirmed_and_stays_bounded() -> None:
    kept = remember_sample([WalSample(0, 10), WalSample(1, 20)], WalSample(2, 30), confirmed_lsn=15)
    assert kept == (WalSample(1, 20), WalSample(2, 30))
    samples: tuple[WalSample, ...] = ()
    for i in range(MAX_SAMPLES + 50):
        samples = remember_sample(samples, WalSample(i, 100 + i), confirmed_lsn=0)
    assert len(samples) == MAX_SAMPLES
    assert samples[0] == WalSample(0, 100)  # the oldest decides the lag; it is never dropped


def test_wal_status_unreserved_and_lost_are_critical() -> None:
    unreserved = assess(
        observe(0, confirmed=1, current=2, wal_status="unreserved"), SlotMemory(), THRESHOLDS, 0
    )
    assert set(unreserved.breaches) == {Breach.WAL_UNRESERVED}
    lost = assess(observe(0, confirmed=1, current=2, wal_status="lost"), SlotMemory(), THRESHOLDS, 0)
    assert set(lost.breaches) == {Breach.WAL_LOST}
    assert severity_of(lost.breaches) is Severity.CRITICAL
    assert severity_of({Breach.INACTIVE: "x"}) is Severity.ERROR


def test_an_inactive_slot_breaches_only_after_the_grace_period_and_clears_when_a_worker_connects() -> None:
    memory = SlotMemory()
    flags = []
    for now, active in ((0, False), (30, False), (61, False), (90, True), (120, False)):
        health = assess(observe(now, confirmed=5, current=5, active=active), memory, THRESHOLDS, now)
        memory = health.memory
        flags.append(Breach.INACTIVE in health.breaches)
    assert flags == [False, False, True, False, False]


def test_a_slot_that_vanished_is_a_breach_only_if_it_was_seen_before() -> None:
    assert assess(None, SlotMemory(), THRESHOLDS, 0).breaches == {}
    seen = assess(observe(0, confirmed=1, current=1), SlotMemory(), THRESHOLDS, 0).memory
    assert set(assess(None, seen, THRESHOLDS, 30).breaches) == {Breach.MISSING}


def test_throughput_is_confirmed_bytes_per_second_between_ticks() -> None:
    first = assess(observe(0, confirmed=1000, current=1000), SlotMemory(), THRESHOLDS, 0)
    assert first.throughput_bytes_per_s is None
    second = assess(observe(10, confirmed=6000, current=6000), first.memory, THRESHOLDS, 10)
    assert second.throughput_bytes_per_s == 500


def test_memory_survives_a_json_round_trip_through_the_cursor() -> None:
    memory = assess(observe(5, confirmed=1, current=9, active=False), SlotMemory(), THRESHOLDS, 5).memory
    assert SlotMemory.from_json(json.loads(json.dumps(memory.to_json()))) == memory


def test_a_lost_slot_reads_unknown_retained_wal_and_its_lag_behind_the_current_position() -> None:
    lost = SlotObservation("bw", "db", False, "lost", 10 * MIB, None, 53 * MIB, None, 0)
    assert lost.lag_bytes == 43 * MIB
    health = assess(lost, SlotMemory(), THRESHOLDS, 0)
    assert "43.0 MiB behind the current WAL position" in health.breaches[Breach.WAL_LOST]
    assert format_bytes(lost.retained_wal_bytes) == "unknown"
    assert format_bytes(50_000) == "48.8 KiB"  # 50 KB is not 0


def test_a_slot_recreated_after_a_loss_awaits_a_worker_before_it_is_healthy() -> None:
    memory = assess(observe(0, confirmed=5, current=5, active=True), SlotMemory(), THRESHOLDS, 0).memory
    assert memory.worker_seen
    lost = assess(
        observe(10, confirmed=5, current=9, active=False, wal_status="lost"), memory, THRESHOLDS, 10
    )
    assert not lost.memory.worker_seen
    # The runbook dropped and recreated it; no worker yet: no breach, but not healthy either.
    fresh = assess(observe(20, confirmed=9, current=9, active=False), lost.memory, THRESHOLDS, 20)
    assert fresh.breaches == {} and fresh.awaiting_worker
    connected = assess(observe(30, confirmed=9, current=9, active=True), fresh.memory, THRESHOLDS, 30)
    assert connected.breaches == {} and not connected.awaiting_worker
