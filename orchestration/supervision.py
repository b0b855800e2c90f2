"""What the CDC worker supervisor should do this tick. Pure: runs and the slot come in as data.

The worker is one long Dagster run of the `cdc_worker` job. The supervisor keeps exactly one alive:

- a run in progress is left alone, unless it has been STARTED for longer than the grace period
  while its slot has no connected client: its process died without Dagster noticing (a killed run
  worker, a lost host), so the supervisor marks it failed and the next tick relaunches;
- no run at all, or a run that ended cleanly: launch one;
- a crash (FAILURE): relaunch after an exponential backoff (`base * 2**(n-1)`, capped), where `n`
  counts consecutive crashes; a run that stayed up for `healthy_after_s` resets the count;
- a run an operator terminated (CANCELED) pauses supervision: stopping the worker from the UI must
  not be undone ten seconds later. Launching `cdc_worker` by hand resumes it.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

MAX_DOUBLINGS = 30
CRASH_LOOP_FAILURES = 3


class RunState(enum.StrEnum):
    """Dagster run statuses as the supervisor groups them."""

    IN_PROGRESS = "in_progress"  # QUEUED, NOT_STARTED, STARTING, STARTED, CANCELING
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELED = "canceled"


@dataclass(frozen=True)
class WorkerRun:
    run_id: str
    state: RunState
    started: bool  # the run reached STARTED (its process is executing the worker)
    created_at: float
    started_at: float | None = None
    ended_at: float | None = None


@dataclass(frozen=True)
class SupervisionPolicy:
    backoff_s: float = 10.0
    backoff_max_s: float = 600.0
    stale_grace_s: float = 120.0
    healthy_after_s: float = 600.0


class Action(enum.StrEnum):
    HEALTHY = "healthy"
    LAUNCH = "launch"
    WAIT = "wait"
    PAUSED = "paused"
    FAIL_STALE = "fail_stale"


@dataclass(frozen=True)
class Decision:
    action: Action
    reason: str
    consecutive_failures: int = 0
    retry_at: float | None = None
    run_id: str | None = None

    @property
    def crash_loop(self) -> bool:
        return self.consecutive_failures >= CRASH_LOOP_FAILURES


def backoff_seconds(consecutive_failures: int, base_s: float, max_s: float) -> float:
    """Delay before relaunching a worker that crashed `consecutive_failures` times in a row."""
    if consecutive_failures <= 0:
        return 0.0
    # The exponent is capped so that a long crash loop cannot overflow the float.
    doublings = min(consecutive_failures - 1, MAX_DOUBLINGS)
    return float(min(max_s, base_s * 2**doublings))


def consecutive_failures(finished_newest_first: Sequence[WorkerRun], healthy_after_s: float) -> int:
    count = 0
    for run in finished_newest_first:
        if run.state is not RunState.FAILED:
            break
        count += 1
        # A run that failed before it started (launch error) lived no time at all.
        lived = 0.0 if run.started_at is None or run.ended_at is None else run.ended_at - run.started_at
        if lived >= healthy_after_s:
            break
    return count


def decide(
    runs_newest_first: Sequence[WorkerRun],
    slot_active: bool | None,
    slot_inactive_since: float | None,
    now: float,
    policy: SupervisionPolicy,
) -> Decision:
    """`slot_active` None: the slot does not exist (yet); the worker creates it on its first start."""
    in_progress = [r for r in runs_newest_first if r.state is RunState.IN_PROGRESS]
    if in_progress:
        run = in_progress[0]
        inactive_for = now - slot_inactive_since if slot_inactive_since is not None else 0.0
        running_for = now - run.started_at if run.started_at is not None else 0.0
        if (
            run.started
            and slot_active is False
            and inactive_for > policy.stale_grace_s
            and running_for > policy.stale_grace_s
        ):
            return Decision(
                Action.FAIL_STALE,
                f"run {run.run_id} is STARTED but no worker has been connected to the slot for "
                f"{inactive_for:.0f} s: its process is gone",
                run_id=run.run_id,
            )
        return Decision(Action.HEALTHY, f"worker run {run.run_id} is in progress", run_id=run.run_id)

    finished = [r for r in runs_newest_first if r.state is not RunState.IN_PROGRESS]
    if not finished:
        return Decision(Action.LAUNCH, "no worker run yet")
    newest = finished[0]
    if newest.state is RunState.CANCELED:
        return Decision(
            Action.PAUSED,
            f"run {newest.run_id} was terminated by an operator; launch the cdc_worker job to resume",
            run_id=newest.run_id,
        )
    if newest.state is RunState.SUCCEEDED:
        return Decision(Action.LAUNCH, f"run {newest.run_id} ended cleanly", run_id=newest.run_id)
    failures = consecutive_failures(finished, policy.healthy_after_s)
    delay = backoff_seconds(failures, policy.backoff_s, policy.backoff_max_s)
    retry_at = (newest.ended_at if newest.ended_at is not None else now) + delay
    if now >= retry_at:
        return Decision(
            Action.LAUNCH,
            f"run {newest.run_id} crashed ({failures} in a row); relaunching after {delay:.0f} s backoff",
            failures,
            retry_at,
            newest.run_id,
        )
    return Decision(
        Action.WAIT,
        f"run {newest.run_id} crashed ({failures} in a row); relaunch in {retry_at - now:.0f} s",
        failures,
        retry_at,
        newest.run_id,
    )
