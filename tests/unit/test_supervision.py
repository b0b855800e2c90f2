"""The worker supervisor's decision: launch, leave alone, back off after crashes, respect a stop."""

from __future__ import annotations

from orchestration.policy.supervision import (
    Action,
    RunState,
    SupervisionPolicy,
    WorkerBreach,
    WorkerRun,
    backoff_seconds,
    consecutive_failures,
    decide,
)

POLICY = SupervisionPolicy(backoff_s=10, backoff_max_s=100, stale_grace_s=60, healthy_after_s=600)


def failed(run_id: str, started: float, ended: float) -> WorkerRun:
    return WorkerRun(run_id, RunState.FAILED, True, started, started, ended)


def test_backoff_doubles_and_is_capped() -> None:
    assert [backoff_seconds(n, 10, 100) for n in range(6)] == [0, 10, 20, 40, 80, 100]
    assert backoff_seconds(10_000, 10, 100) == 100


def test_no_run_launches_one() -> None:
    assert decide([], None, None, now=0, policy=POLICY).action is Action.LAUNCH


def test_a_run_in_progress_is_left_alone() -> None:
    run = WorkerRun("r1", RunState.IN_PROGRESS, True, 0, 1)
    assert decide([run], True, None, now=1000, policy=POLICY).action is Action.HEALTHY
    queued = WorkerRun("r2", RunState.IN_PROGRESS, False, 0)
    assert decide([queued], False, 0, now=1000, policy=POLICY).action is Action.HEALTHY


def test_a_started_run_without_a_connected_worker_past_the_grace_is_declared_dead_and_terminated() -> None:
    run = WorkerRun("r1", RunState.IN_PROGRESS, True, 0, 0)
    assert decide([run], False, 950, now=1000, policy=POLICY).action is Action.HEALTHY
    stale = decide([run], False, 900, now=1000, policy=POLICY)
    assert stale.action is Action.TERMINATE_STALE and stale.run_id == "r1"
    assert "dead or hung" in stale.reason
    # A run that only just started (snapshot phase, connecting) gets the grace period too.
    young = WorkerRun("r2", RunState.IN_PROGRESS, True, 970, 970)
    assert decide([young], False, 0, now=1000, policy=POLICY).action is Action.HEALTHY


def test_a_crash_is_relaunched_after_the_backoff() -> None:
    runs = [failed("r1", 0, 100)]
    waiting = decide(runs, False, 100, now=105, policy=POLICY)
    assert waiting.action is Action.WAIT and waiting.retry_at == 110
    assert decide(runs, False, 100, now=110, policy=POLICY).action is Action.LAUNCH


def test_repeated_crashes_back_off_longer_and_count_as_a_crash_loop() -> None:
    runs = [failed("r3", 140, 150), failed("r2", 120, 130), failed("r1", 100, 110)]
    assert consecutive_failures(runs, POLICY.healthy_after_s) == 3
    decision = decide(runs, False, 100, now=180, policy=POLICY)
    assert decision.action is Action.WAIT and decision.retry_at == 190  # 150 + 40
    assert decision.crash_loop


def test_a_run_that_stayed_up_long_resets_the_crash_count() -> None:
    runs = [failed("r3", 5000, 5010), failed("r2", 1000, 4000), failed("r1", 100, 110)]
    assert consecutive_failures(runs, POLICY.healthy_after_s) == 2
    success_between = [failed("r2", 200, 210), WorkerRun("r1", RunState.SUCCEEDED, True, 0, 0, 100)]
    assert consecutive_failures(success_between, POLICY.healthy_after_s) == 1


def test_an_operator_stop_pauses_supervision_and_a_clean_exit_relaunches() -> None:
    canceled = WorkerRun("r1", RunState.CANCELED, True, 0, 0, 10)
    assert decide([canceled], False, 10, now=1000, policy=POLICY).action is Action.PAUSED
    clean = WorkerRun("r1", RunState.SUCCEEDED, True, 0, 0, 10)
    assert decide([clean], False, 10, now=11, policy=POLICY).action is Action.LAUNCH


def test_runs_that_failed_before_starting_count_as_crashes() -> None:
    never_started = [WorkerRun(f"r{i}", RunState.FAILED, False, i, None, i) for i in range(3, 0, -1)]
    assert consecutive_failures(never_started, POLICY.healthy_after_s) == 3


def test_a_run_declared_dead_is_left_to_terminate_then_failed_if_it_does_not_end() -> None:
    declared = WorkerRun("r1", RunState.IN_PROGRESS, True, 0, 0, declared_dead_at=1000)
    terminating = decide([declared], False, 0, now=1030, policy=POLICY)
    assert terminating.action is Action.HEALTHY and "being terminated" in terminating.reason
    stuck = decide([declared], False, 0, now=1061, policy=POLICY)
    assert stuck.action is Action.FAIL_STALE and stuck.run_id == "r1"


def test_a_worker_that_exited_2_is_not_relaunched_and_pages_once_with_its_reason() -> None:
    reason = "startup check failed: slot bw has lost required WAL"
    needs = WorkerRun("r2", RunState.FAILED, True, 100, 100, 110, needs_person=reason)
    for now in (111, 1000, 100_000):  # long past any backoff
        decision = decide([needs, failed("r1", 0, 50)], False, 0, now=now, policy=POLICY)
        assert decision.action is Action.NEEDS_PERSON
        assert reason in decision.reason and "launch the cdc_worker job" in decision.reason
        assert decision.worker_breaches == {WorkerBreach.NEEDS_PERSON}
    # A person launched cdc_worker again: supervision resumes.
    relaunched = WorkerRun("r3", RunState.IN_PROGRESS, True, 2000, 2000)
    assert decide([relaunched, needs], True, None, now=2001, policy=POLICY).action is Action.HEALTHY


def test_the_status_tells_what_the_supervisor_is_doing() -> None:
    waiting = decide([failed("r1", 0, 100)], False, 100, now=105, policy=POLICY)
    assert waiting.status.startswith("backing off before the next relaunch (run r1 crashed")
    canceled = WorkerRun("r1", RunState.CANCELED, True, 0, 0, 10)
    assert decide([canceled], False, 10, now=1000, policy=POLICY).status.startswith("paused")
