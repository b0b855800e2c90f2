"""The incident state machine: once per incident, escalations at once, repeats after the cooldown."""

from __future__ import annotations

import json

import pytest

from orchestration.policy.incidents import IncidentState, Notify, step

COOLDOWN = 600.0


def run(ticks: list[tuple[float, set[str]]]) -> list[Notify]:
    state = IncidentState()
    said = []
    for now, breaches in ticks:
        transition = step(state, breaches, now, COOLDOWN)
        state = transition.state
        said.append(transition.notify)
    return said


def test_healthy_ticks_say_nothing() -> None:
    assert run([(0, set()), (30, set()), (60, set())]) == [Notify.NOTHING] * 3


def test_an_incident_fires_once_then_resolves_once() -> None:
    said = run([(0, set()), (30, {"lag_seconds"}), (60, {"lag_seconds"}), (90, set()), (120, set())])
    assert said == [Notify.NOTHING, Notify.TRIGGER, Notify.NOTHING, Notify.RESOLVE, Notify.NOTHING]


def test_an_open_incident_repeats_after_the_cooldown_and_not_before() -> None:
    ticks = [
        (0.0, {"inactive"}),
        (COOLDOWN - 1, {"inactive"}),
        (COOLDOWN, {"inactive"}),
        (COOLDOWN + 30, {"inactive"}),
        (2 * COOLDOWN, {"inactive"}),
    ]
    assert run(ticks) == [Notify.TRIGGER, Notify.NOTHING, Notify.REPEAT, Notify.NOTHING, Notify.REPEAT]


def test_a_new_kind_of_breach_escalates_at_once() -> None:
    said = run(
        [
            (0, {"retained_wal_bytes"}),
            (30, {"retained_wal_bytes", "wal_status_lost"}),
            (60, {"wal_status_lost"}),
            (90, {"retained_wal_bytes", "wal_status_lost"}),
        ]
    )
    # Dropping back to a breach already reported is not news; coming back to it is not either.
    assert said == [Notify.TRIGGER, Notify.ESCALATE, Notify.NOTHING, Notify.NOTHING]


def test_a_second_incident_after_a_resolve_triggers_again() -> None:
    said = run([(0, {"inactive"}), (30, set()), (60, {"inactive"})])
    assert said == [Notify.TRIGGER, Notify.RESOLVE, Notify.TRIGGER]


def test_the_state_survives_a_json_round_trip_through_the_cursor() -> None:
    state = step(IncidentState(), {"lag_seconds", "inactive"}, 12.5, COOLDOWN).state
    restored = IncidentState.from_json(json.loads(json.dumps(state.to_json())))
    assert restored == state
    assert step(restored, {"lag_seconds"}, 20.0, COOLDOWN).notify is Notify.NOTHING
    assert IncidentState.from_json(None) == IncidentState()


def test_a_cooldown_must_be_positive() -> None:
    with pytest.raises(ValueError, match="cooldown_s"):
        step(IncidentState(), {"x"}, 0.0, 0.0)


def test_an_unsettled_check_keeps_an_open_incident_open_until_it_settles() -> None:
    opened = step(IncidentState(), {"wal_status_lost"}, 0, COOLDOWN).state
    waiting = step(opened, set(), 30, COOLDOWN, settled=False)
    assert waiting.notify is Notify.NOTHING and waiting.state.open
    assert step(waiting.state, set(), 60, COOLDOWN, settled=True).notify is Notify.RESOLVE
    # Nothing open: an unsettled healthy check opens nothing either.
    assert step(IncidentState(), set(), 0, COOLDOWN, settled=False).notify is Notify.NOTHING
