"""What each page says: what happened, what the supervisor is doing about it, what to do, and links
that open. Pure: the sensors pass in what they observed and decided.

Three pages:

- the slot page (`slot_lag_alert`): the slot's state first (is a worker connected?), every breach,
  how far behind it is, what the supervisor is doing, the worker's last run, the runbook section;
- the worker page (`cdc_worker_supervisor`): a crash loop, or a worker that exited 2 and needs a
  person, with the worker's own reason and last log lines;
- the run-failure page (`run_failure_alert`): the failed step's own error, not Dagster's generic
  "Steps failed".
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from cdc_worker.core.lsn import format_lsn
from cdc_worker.core.units import human_seconds
from orchestration.policy import lake_watermark
from orchestration.policy.alerts import Alert, AlertAction, DetailValue, Link, Severity
from orchestration.policy.lake_watermark import LakeWatermark
from orchestration.policy.links import CDC_WORKER_JOB, Runbook, UiLinks
from orchestration.policy.slot_health import (
    Breach,
    LagThresholds,
    SlotHealth,
    SlotObservation,
    format_bytes,
    severity_of,
)
from orchestration.policy.supervision import Action, Decision, WorkerBreach

SLOT_ASSET = "replication_slot"
FIRST_ERROR_MAX = 500


def _slot_runbook(breaches: Sequence[Breach]) -> Runbook:
    if {Breach.WAL_LOST, Breach.MISSING} & set(breaches):
        return Runbook.REBUILD
    return Runbook.SLOT


def _connection(observation: SlotObservation | None, health: SlotHealth, now: float) -> str:
    if observation is None:
        return "the slot does not exist"
    if observation.active:
        return "a worker is connected"
    since = health.memory.inactive_since
    return "no worker connected" + ("" if since is None else f" for {human_seconds(now - since)}")


def slot_page(
    action: AlertAction,
    *,
    slot: str,
    location: str,
    observation: SlotObservation | None,
    health: SlotHealth,
    thresholds: LagThresholds,
    supervisor: Decision | None,
    links: UiLinks,
    now: float,
    timestamp: datetime,
    lake: LakeWatermark | None = None,
    changelog: LakeWatermark | None = None,
) -> Alert:
    """`lake`: the lake's common watermark, named beside the slot's lag (`lake_freshness`);
    `changelog`: the position its changelog proves, on a warehouse that keeps one."""
    where = f"replication slot {slot} on {location}"
    connection = _connection(observation, health, now)
    if action is AlertAction.RESOLVE:
        summary, severity = f"{where} is healthy again: {connection}", Severity.INFO
    else:
        said = [connection] + [
            text for breach, text in health.breaches.items() if breach is not Breach.INACTIVE
        ]
        said += [s for s in (lake_watermark.page_summary(lake, now, changelog),) if s]
        summary = f"{where}: " + "; ".join(said)
        severity = severity_of(health.breaches)
    runbook = _slot_runbook(list(health.breaches))
    details: dict[str, DetailValue] = {
        "slot": slot,
        "worker": connection,
        "breaches": ", ".join(sorted(health.breaches)) or "none",
        "supervisor": supervisor.status if supervisor else "unknown",
        "what_to_do": _slot_advice(health, supervisor),
        "max_retained_wal_bytes": thresholds.max_retained_wal_bytes,
        "max_lag_seconds": thresholds.max_lag_seconds,
        "runbook": links.runbook(runbook),
    }
    if observation is not None:
        details |= {
            "active": observation.active,
            "wal_status": observation.wal_status,
            "retained_wal_bytes": observation.retained_wal_bytes,
            "retained_wal": format_bytes(observation.retained_wal_bytes),
            "behind_bytes": observation.lag_bytes,
            "behind": format_bytes(observation.lag_bytes),
            "current_wal_lsn": format_lsn(observation.current_wal_lsn),
            "confirmed_flush_lsn": (
                format_lsn(observation.confirmed_flush_lsn)
                if observation.confirmed_flush_lsn is not None
                else None
            ),
        }
    if health.lag_seconds is not None:
        details["lag_seconds_at_least"] = round(health.lag_seconds, 1)
    details |= lake_watermark.page_details(
        lake, observation.current_wal_lsn if observation else None, now, changelog
    )
    slot_link = Link("replication_slot in Dagster", links.asset(SLOT_ASSET))
    run_id = supervisor.run_id if supervisor is not None else None
    page_links = (slot_link, *_worker_links(links, run_id, runbook))
    return Alert(
        dedup_key=f"bottledwater/slot/{location}/{slot}",
        action=action,
        summary=summary,
        severity=severity,
        source=location,
        component="replication_slot",
        timestamp=timestamp,
        details=details,
        links=page_links,
    )


def _worker_links(links: UiLinks, run_id: str | None, runbook: Runbook) -> tuple[Link, ...]:
    """The worker's last run (when there is one), its job's runs, and the runbook."""
    last_run = (Link("The worker's last run", links.run(run_id)),) if run_id else ()
    return (
        *last_run,
        Link("cdc_worker runs", links.job(CDC_WORKER_JOB)),
        Link("Runbook", links.runbook(runbook)),
    )


def _slot_advice(health: SlotHealth, supervisor: Decision | None) -> str:
    breaches = set(health.breaches)
    if Breach.WAL_LOST in breaches or Breach.MISSING in breaches:
        return (
            "the stream cannot resume: rebuild (bottledwater rebuild, the reset_delta job, then launch "
            "cdc_worker), as the runbook says"
        )
    if supervisor is not None and supervisor.action is Action.NEEDS_PERSON:
        return "the worker exited 2 and is not relaunched: fix its reason, then launch cdc_worker"
    if supervisor is not None and supervisor.action is Action.PAUSED:
        return "supervision is paused: launch cdc_worker to start streaming again"
    if Breach.WAL_UNRESERVED in breaches:
        return "get a worker streaming now, or the slot is invalidated at the next checkpoint"
    if Breach.INACTIVE in breaches:
        return "look at the worker's last run: why does it not stay connected?"
    return "the worker is connected but slow: look at its run log and at Kafka"


def worker_page(
    action: AlertAction,
    *,
    slot: str,
    location: str,
    decision: Decision,
    breaches: Sequence[WorkerBreach],
    last_lines: str,
    links: UiLinks,
    timestamp: datetime,
) -> Alert:
    """The worker incident: it crash-loops, or it exited 2 and waits for a person."""
    needs_person = WorkerBreach.NEEDS_PERSON in breaches
    runbook = Runbook.NEEDS_PERSON if needs_person else Runbook.WORKER_DOWN
    if action is AlertAction.RESOLVE:
        summary, severity = f"CDC worker for slot {slot} is running again", Severity.INFO
    elif needs_person:
        summary, severity = (
            f"CDC worker for slot {slot} stopped and needs a person: {decision.reason}",
            Severity.ERROR,
        )
    else:
        summary = f"CDC worker for slot {slot} is crash-looping: {decision.reason}"
        severity = Severity.ERROR
    details: dict[str, DetailValue] = {
        "slot": slot,
        "supervisor": decision.status,
        "consecutive_failures": decision.consecutive_failures,
        "runbook": links.runbook(runbook),
    }
    if last_lines and action is AlertAction.TRIGGER:
        details["last_lines"] = last_lines
    page_links = _worker_links(links, decision.run_id, runbook)
    return Alert(
        dedup_key=f"bottledwater/worker/{location}/{slot}",
        action=action,
        summary=summary,
        severity=severity,
        source=location,
        component="cdc_worker",
        timestamp=timestamp,
        details=details,
        links=page_links,
    )


def run_failure_page(
    *,
    job_name: str,
    run_id: str,
    step_errors: Sequence[str],
    run_message: str | None,
    links: UiLinks,
    timestamp: datetime,
) -> Alert:
    """The step's own error leads: Dagster's run message only says that steps failed."""
    first = next((e.strip() for e in step_errors if e.strip()), None)
    reason = (first or run_message or "no message").splitlines()[0][:FIRST_ERROR_MAX]
    details: dict[str, DetailValue] = {
        "job": job_name,
        "run_id": run_id,
        "runbook": links.runbook(Runbook.RUN_FAILED),
    }
    if len(step_errors) > 1:
        details["more_failed_steps"] = len(step_errors) - 1
    return Alert(
        dedup_key=f"bottledwater/run/{job_name}/{run_id}",
        action=AlertAction.TRIGGER,
        summary=f"Dagster run of {job_name} failed: {reason}",
        severity=Severity.ERROR,
        source="dagster",
        component=job_name,
        timestamp=timestamp,
        details=details,
        links=(
            Link("Run", links.run(run_id)),
            Link(f"{job_name} runs", links.job(job_name)),
            Link("Runbook", links.runbook(Runbook.RUN_FAILED)),
        ),
    )
