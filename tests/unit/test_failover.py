"""Failover slots: the start-up choice of `--failover-slot` on each kind of server, the warning when
the primary does not hold changes back for its standbys, and the lost-slot line (pure decisions)."""

from __future__ import annotations

import pytest

from cdc_worker.shell.postgres.failover import (
    FailoverFacts,
    StandbySlot,
    choose_failover,
    missing_slot_problem,
)

PG16 = FailoverFacts(160004, "", 0)
PG17_ALONE = FailoverFacts(170002, "", 0)
PG17_SYNCED = FailoverFacts(170002, "bw_standby", 1)
PG17_UNGUARDED = FailoverFacts(170002, "", 1)


@pytest.mark.parametrize(
    ("setting", "facts", "enabled"),
    [
        ("auto", PG16, False),
        ("auto", PG17_ALONE, False),
        ("auto", PG17_SYNCED, True),
        ("auto", PG17_UNGUARDED, True),
        ("on", PG17_ALONE, True),
        ("off", PG17_SYNCED, False),
        ("off", PG16, False),
    ],
)
def test_the_choice_and_its_one_line(setting: str, facts: FailoverFacts, enabled: bool) -> None:
    choice = choose_failover(setting, facts)
    assert choice.enabled is enabled and choice.problem is None
    assert choice.line.startswith(f"failover slot: {'on' if enabled else 'off'}") and "\n" not in choice.line


def test_on_before_17_is_a_start_up_problem_naming_the_version() -> None:
    choice = choose_failover("on", PG16)
    assert not choice.enabled
    assert choice.problem is not None and "Postgres 17" in choice.problem and "is 16" in choice.problem


def test_a_failover_slot_without_synchronized_standby_slots_warns_of_the_risk() -> None:
    warning = choose_failover("auto", PG17_UNGUARDED).warning
    assert warning is not None and "\n" not in warning
    assert "synchronized_standby_slots" in warning and "new primary does not" in warning
    assert choose_failover("auto", PG17_SYNCED).warning is None
    assert choose_failover("off", PG17_UNGUARDED).warning is None


def test_a_slot_missing_after_a_done_snapshot_is_lost_and_points_to_the_runbook() -> None:
    problem = missing_slot_problem("bw", "done", "done")
    assert (
        problem is not None
        and "rebuild --confirm bw" in problem
        and "Rebuilding after a lost slot" in problem
    )
    assert missing_slot_problem("bw", None, "done") is None  # never snapshotted: a first start
    assert missing_slot_problem("bw", "pending", "done") is None  # an interrupted snapshot starts over


def test_sync_ready_means_synced_and_no_longer_temporary() -> None:
    assert StandbySlot(True, True, False).sync_ready
    assert not StandbySlot(True, True, True).sync_ready  # a promotion now would drop it
    assert not StandbySlot(False, False, False).sync_ready
