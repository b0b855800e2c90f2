"""What the CDC worker supervisor should do this tick. Pure: runs and the slot come in as data.

The worker is one long Dagster run of the `cdc_worker` job. The supervisor keeps exactly one alive:

- a run in progress is left alone, unless it has been STARTED for longer than the grace period
  while its slot has no connected client: its worker died or hung without Dagster noticing (a
  frozen process, a killed run worker, a lost host). The supervisor declares it dead and terminates
  it (what is declared dead must not come back and stream, or write a second failure into the
  run); a run still not ended a grace period after that is marked failed. Either way it counts as a
  crash, and the relaunch follows;
- no run at all, or a run that ended cleanly: launch one;
- a crash (FAILURE): relaunch after an exponential backoff (`base * 2**(n-1)`, capped), where `n`
  counts consecutive crashes; a run that stayed up for `healthy_after_s` resets the count;
- a run an operator terminated (CANCELED) pauses supervision: stopping the worker from the UI must
  not be undone ten seconds later. Launching `cdc_worker` by hand resumes it;
- a worker that exited 2 ("needs a person", docs/worker.md: a lost slot, a revoked privilege, bad
  configuration) is not relaunched: the same start would fail the same way. The supervisor pages
  once with the worker's own reason and resumes when a person launches `cdc_worker`.
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
    # The worker's own one-line reason when it exited 2 ("needs a person"); None otherwise.
    needs_person: str | None = None
    # When the supervisor declared this run dead and asked for it to be terminated.
    declared_dead_at: float | None = None
    # The worker's last log lines when it failed, for the page.
    last_lines: str = ""


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
    NEEDS_PERSON = "needs_person"
    TERMINATE_STALE = "terminate_stale"
    FAIL_STALE = "fail_stale"


class WorkerBreach(enum.StrEnum):
    """What the worker incident is about; the incident state machine compares sets of these."""

    CRASH_LOOP = "worker_crash_loop"
    NEEDS_PERSON = "worker_needs_person"


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

    @property
    def worker_breaches(self) -> set[WorkerBreach]:
        if self.action is Action.NEEDS_PERSON:
            return {WorkerBreach.NEEDS_PERSON}
        return {WorkerBreach.CRASH_LOOP} if self.crash_loop else set()

    @property
    def status(self) -> str:
        """What the supervisor is doing, in the words of a page."""
        return {
            Action.HEALTHY: "a worker run is in progress",
            Action.LAUNCH: "relaunching the worker now",
            Action.WAIT: "backing off before the next relaunch",
            Action.PAUSED: "paused: an operator terminated the worker run",
            Action.NEEDS_PERSON: "stopped relaunching: the worker needs a person",
            Action.TERMINATE_STALE: "declaring the worker run dead and terminating it",
            Action.FAIL_STALE: "marking the worker run failed",
        }[self.action] + f" ({self.reason})"


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
        if run.declared_dead_at is not None:
            if now - run.declared_dead_at > policy.stale_grace_s:
                return Decision(
                    Action.FAIL_STALE,
                    f"run {run.run_id} was declared dead {now - run.declared_dead_at:.0f} s ago and has "
                    "not ended: its run process is gone or hung",
                    run_id=run.run_id,
                )
            return Decision(
                Action.HEALTHY,
                f"run {run.run_id} was declared dead and is being terminated",
                run_id=run.run_id,
            )
        if (
            run.started
            and slot_active is False
            and inactive_for > policy.stale_grace_s
            and running_for > policy.stale_grace_s
        ):
            return Decision(
                Action.TERMINATE_STALE,
                f"run {run.run_id} is STARTED but no worker has been connected to the slot for "
                f"{inactive_for:.0f} s: its worker is dead or hung",
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
    if newest.state is RunState.FAILED and newest.needs_person is not None:
        return Decision(
            Action.NEEDS_PERSON,
            f"run {newest.run_id} exited 2 (needs a person): {newest.needs_person}; fix that, then "
            "launch the cdc_worker job",
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
