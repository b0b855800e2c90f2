"""Sensors: the CDC worker's supervisor, the slot-lag pager, and the run-failure pager.

Their decisions are pure functions (`supervision.decide`, `slot_health.assess`, `incidents.step`);
these bodies only read the world, call them, and act: launch a run, post an alert, record an
observation. Each keeps what it must remember in its cursor, which Dagster stores only when the tick
succeeds, so an alert whose delivery failed is retried on the next tick.
"""

# No `from __future__ import annotations`: Dagster reads the config and resource types of op,
# asset and sensor parameters from their annotations at definition time.

import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import dagster as dg
import psycopg2

from cdc_worker.core.lsn import format_lsn
from orchestration.alerts import Alert, AlertAction, Link, Severity
from orchestration.incidents import IncidentState, Notify, step
from orchestration.jobs import CDC_WORKER_JOB, cdc_worker_job
from orchestration.resources import AlertingResource, KafkaResource, PostgresResource
from orchestration.slot_health import (
    LagThresholds,
    SlotHealth,
    SlotMemory,
    SlotObservation,
    assess,
    format_bytes,
    severity_of,
)
from orchestration.supervision import Action, RunState, SupervisionPolicy, WorkerRun, decide

log = logging.getLogger(__name__)

RECENT_RUNS = 20
CRASH_LOOP = "worker_crash_loop"
RUNBOOK = "docs/orchestration.md#runbook-a-lagging-or-lost-slot"
_RUN_STATES = {
    dg.DagsterRunStatus.SUCCESS: RunState.SUCCEEDED,
    dg.DagsterRunStatus.FAILURE: RunState.FAILED,
    dg.DagsterRunStatus.CANCELED: RunState.CANCELED,
}


@dataclass(frozen=True)
class SensorSettings:
    """What the sensors need from the code location's settings."""

    interval_s: int
    thresholds: LagThresholds
    policy: SupervisionPolicy
    default_status: dg.DefaultSensorStatus
    dagster_url: str
    slot_asset: dg.AssetKey
    topic_assets: Mapping[str, dg.AssetKey]


def _load_cursor(cursor: str | None) -> dict[str, Any]:
    if not cursor:
        return {}
    try:
        loaded = json.loads(cursor)
    except ValueError:
        return {}  # a cursor from an older version: start afresh rather than fail every tick
    return loaded if isinstance(loaded, dict) else {}


def _worker_runs(instance: dg.DagsterInstance) -> list[WorkerRun]:
    records = instance.get_run_records(filters=dg.RunsFilter(job_name=CDC_WORKER_JOB), limit=RECENT_RUNS)
    runs = []
    for record in records:  # newest first
        status = record.dagster_run.status
        runs.append(
            WorkerRun(
                run_id=record.dagster_run.run_id,
                state=_RUN_STATES.get(status, RunState.IN_PROGRESS),
                started=record.start_time is not None,
                created_at=record.create_timestamp.timestamp(),
                started_at=record.start_time,
                ended_at=record.end_time,
            )
        )
    return runs


def slot_metadata(observation: SlotObservation, health: SlotHealth) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "active": observation.active,
        "wal_status": observation.wal_status or "unknown",
        "retained_wal_bytes": observation.retained_wal_bytes,
        "retained_wal": format_bytes(observation.retained_wal_bytes),
        "confirmed_flush_lsn": (
            format_lsn(observation.confirmed_flush_lsn)
            if observation.confirmed_flush_lsn is not None
            else "-"
        ),
        "current_wal_lsn": format_lsn(observation.current_wal_lsn),
    }
    if health.lag_seconds is not None:
        metadata["lag_seconds"] = dg.MetadataValue.float(round(health.lag_seconds, 1))
    if health.throughput_bytes_per_s is not None:
        metadata["throughput_bytes_per_s"] = dg.MetadataValue.float(round(health.throughput_bytes_per_s, 1))
    return metadata


def _observe_slot(postgres: PostgresResource) -> tuple[SlotObservation | None, str | None]:
    try:
        return postgres.observe_slot(), None
    except psycopg2.Error as exc:
        return None, f"Postgres unreachable: {str(exc).strip().splitlines()[0] if str(exc).strip() else exc}"


def _topic_observations(kafka: KafkaResource, topics: Mapping[str, dg.AssetKey]) -> list[dg.AssetObservation]:
    if not topics:
        return []
    try:
        offsets = kafka.end_offsets(list(topics))
    except Exception as exc:  # observing topics is best effort; supervising is not
        log.warning("could not read topic offsets: %s", exc)
        return []
    return [
        dg.AssetObservation(asset_key=key, metadata={"messages_written": offsets[topic]})
        for topic, key in topics.items()
        if offsets.get(topic) is not None
    ]


def _crash_loop_alert(
    action: AlertAction, postgres: PostgresResource, reason: str, settings: SensorSettings
) -> Alert:
    return Alert(
        dedup_key=f"bottledwater/worker/{postgres.location()}/{postgres.slot}",
        action=action,
        summary=(
            f"CDC worker for slot {postgres.slot} is crash-looping: {reason}"
            if action is AlertAction.TRIGGER
            else f"CDC worker for slot {postgres.slot} is running again"
        ),
        severity=Severity.ERROR,
        source=postgres.location(),
        component="cdc_worker",
        timestamp=datetime.now(UTC),
        details={"slot": postgres.slot, "reason": reason},
        links=(Link("Worker runs", f"{settings.dagster_url}/jobs/{CDC_WORKER_JOB}"),),
    )


def build_supervisor(settings: SensorSettings) -> dg.SensorDefinition:
    @dg.sensor(
        name="cdc_worker_supervisor",
        job=cdc_worker_job,
        minimum_interval_seconds=settings.interval_s,
        default_status=settings.default_status,
        description="Keeps one cdc_worker run alive: launches one when there is none, relaunches a "
        "crashed one with exponential backoff, fails a run whose process vanished, and records the "
        "slot's lag and throughput as observations of replication_slot.",
    )
    def cdc_worker_supervisor(
        context: dg.SensorEvaluationContext,
        postgres: PostgresResource,
        kafka: KafkaResource,
        alerting: AlertingResource,
    ) -> dg.SensorResult:
        now = time.time()
        cursor = _load_cursor(context.cursor)
        memory = SlotMemory.from_json(cursor.get("slot"))
        observation, unreachable = _observe_slot(postgres)
        health = assess(observation, memory, settings.thresholds, now) if unreachable is None else None
        runs = _worker_runs(context.instance)
        decision = decide(
            runs,
            slot_active=None if observation is None else observation.active,
            slot_inactive_since=health.memory.inactive_since if health else None,
            now=now,
            policy=settings.policy,
        )
        context.log.info(f"{decision.action.value}: {decision.reason}")

        run_requests: list[dg.RunRequest] = []
        if decision.action is Action.LAUNCH:
            run_requests.append(
                dg.RunRequest(
                    # One relaunch per ended run, even if two ticks race; the first launch has no key.
                    run_key=f"after-{decision.run_id}" if decision.run_id else None,
                    tags={"bottledwater/launched_by": "cdc_worker_supervisor"},
                )
            )
        elif decision.action is Action.FAIL_STALE and decision.run_id:
            stale = context.instance.get_run_by_id(decision.run_id)
            if stale is not None:
                context.instance.report_run_failed(stale, message=decision.reason)

        incident = IncidentState.from_json(cursor.get("incident"))
        breaches: set[str] | None = None
        if decision.crash_loop:
            breaches = {CRASH_LOOP}
        elif decision.action is Action.PAUSED or (
            decision.action is Action.HEALTHY and observation is not None and observation.active
        ):
            breaches = set()
        if breaches is not None:
            transition = step(incident, breaches, now, settings.thresholds.cooldown_seconds)
            if transition.notify is not Notify.NOTHING:
                action = AlertAction.RESOLVE if transition.notify is Notify.RESOLVE else AlertAction.TRIGGER
                alerting.send(_crash_loop_alert(action, postgres, decision.reason, settings), context.log)
            incident = transition.state

        events: list[dg.AssetObservation] = []
        if observation is not None and health is not None:
            events.append(
                dg.AssetObservation(
                    asset_key=settings.slot_asset, metadata=slot_metadata(observation, health)
                )
            )
        events.extend(_topic_observations(kafka, settings.topic_assets))
        new_cursor = {"slot": (health.memory if health else memory).to_json(), "incident": incident.to_json()}
        return dg.SensorResult(
            run_requests=run_requests,
            asset_events=events,
            cursor=json.dumps(new_cursor),
            skip_reason=None if run_requests else decision.reason,
        )

    return cdc_worker_supervisor


def slot_alert(
    action: AlertAction,
    *,
    postgres: PostgresResource,
    observation: SlotObservation | None,
    health: SlotHealth,
    thresholds: LagThresholds,
    dagster_url: str,
) -> Alert:
    where = f"replication slot {postgres.slot} on {postgres.location()}"
    if action is AlertAction.RESOLVE:
        summary, severity = f"{where} is healthy again", Severity.INFO
    else:
        summary = f"{where} " + "; ".join(health.breaches.values())
        severity = severity_of(health.breaches)
    details: dict[str, str | int | float | bool | None] = {
        "slot": postgres.slot,
        "breaches": ", ".join(sorted(health.breaches)) or "none",
        "max_retained_wal_bytes": thresholds.max_retained_wal_bytes,
        "max_lag_seconds": thresholds.max_lag_seconds,
        "runbook": RUNBOOK,
    }
    if observation is not None:
        details |= {
            "active": observation.active,
            "wal_status": observation.wal_status,
            "retained_wal_bytes": observation.retained_wal_bytes,
            "retained_wal": format_bytes(observation.retained_wal_bytes),
            "confirmed_flush_lsn": (
                format_lsn(observation.confirmed_flush_lsn) if observation.confirmed_flush_lsn else None
            ),
        }
    if health.lag_seconds is not None:
        details["lag_seconds_at_least"] = round(health.lag_seconds, 1)
    return Alert(
        dedup_key=f"bottledwater/slot/{postgres.location()}/{postgres.slot}",
        action=action,
        summary=summary,
        severity=severity,
        source=postgres.location(),
        component="replication_slot",
        timestamp=datetime.now(UTC),
        details=details,
        links=(Link("replication_slot in Dagster", f"{dagster_url}/assets/replication_slot"),),
    )


def build_slot_lag_alert(settings: SensorSettings) -> dg.SensorDefinition:
    @dg.sensor(
        name="slot_lag_alert",
        minimum_interval_seconds=settings.interval_s,
        default_status=settings.default_status,
        description="Pages when the replication slot retains too much WAL, lags too long, has no worker "
        "connected past the grace period, or its wal_status is unreserved or lost; once per incident, "
        "again after the cooldown, and a resolve when it is healthy.",
    )
    def slot_lag_alert(
        context: dg.SensorEvaluationContext, postgres: PostgresResource, alerting: AlertingResource
    ) -> dg.SensorResult:
        now = time.time()
        cursor = _load_cursor(context.cursor)
        observation = postgres.observe_slot()  # an unreachable Postgres fails the tick, visibly
        health = assess(observation, SlotMemory.from_json(cursor.get("slot")), settings.thresholds, now)
        incident = IncidentState.from_json(cursor.get("incident"))
        transition = step(
            incident, [b.value for b in health.breaches], now, settings.thresholds.cooldown_seconds
        )
        if transition.notify is not Notify.NOTHING:
            action = AlertAction.RESOLVE if transition.notify is Notify.RESOLVE else AlertAction.TRIGGER
            alert = slot_alert(
                action,
                postgres=postgres,
                observation=observation,
                health=health,
                thresholds=settings.thresholds,
                dagster_url=settings.dagster_url,
            )
            alerting.send(alert, context.log)
        reason = "; ".join(health.breaches.values()) or "slot healthy"
        return dg.SensorResult(
            cursor=json.dumps({"slot": health.memory.to_json(), "incident": transition.state.to_json()}),
            skip_reason=f"{transition.notify.value}: {reason}",
        )

    return slot_lag_alert


def build_run_failure_alert(
    settings: SensorSettings, ignored_jobs: Sequence[str] = (CDC_WORKER_JOB,)
) -> dg.SensorDefinition:
    @dg.run_failure_sensor(
        name="run_failure_alert",
        default_status=settings.default_status,
        description="Posts an alert for every failed run (the worker's crashes are the supervisor's: it "
        "relaunches them and pages on a crash loop).",
    )
    def run_failure_alert(context: dg.RunFailureSensorContext, alerting: AlertingResource) -> None:
        run = context.dagster_run
        if run.job_name in ignored_jobs:
            return
        message = context.failure_event.message or "no message"
        alerting.send(
            Alert(
                dedup_key=f"bottledwater/run/{run.job_name}/{run.run_id}",
                action=AlertAction.TRIGGER,
                summary=f"Dagster run of {run.job_name} failed: {message}",
                severity=Severity.ERROR,
                source="dagster",
                component=run.job_name,
                timestamp=datetime.now(UTC),
                details={"job": run.job_name, "run_id": run.run_id},
                links=(Link("Run", f"{settings.dagster_url}/runs/{run.run_id}"),),
            ),
            context.log,
        )

    return run_failure_alert
