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
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import dagster as dg
import psycopg2

from cdc_worker.core.lsn import format_lsn
from orchestration import lake_freshness
from orchestration.jobs import (
    DECLARED_DEAD_TAG,
    LAST_LINES_TAG,
    NEEDS_PERSON_TAG,
    cdc_worker_job,
)
from orchestration.policy.alerts import AlertAction
from orchestration.policy.incidents import IncidentState, Notify, step
from orchestration.policy.links import CDC_WORKER_JOB, UiLinks
from orchestration.policy.pages import run_failure_page, slot_page, worker_page
from orchestration.policy.slot_health import (
    LagThresholds,
    SlotHealth,
    SlotMemory,
    SlotObservation,
    assess,
    format_bytes,
)
from orchestration.policy.supervision import (
    Action,
    Decision,
    RunState,
    SupervisionPolicy,
    WorkerBreach,
    WorkerRun,
    decide,
)
from orchestration.resources import AlertingResource, KafkaResource, PostgresResource

log = logging.getLogger(__name__)

RECENT_RUNS = 20
_WORKER_BREACHES = frozenset(b.value for b in WorkerBreach)
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
    links: UiLinks
    slot_asset: dg.AssetKey
    topic_assets: Mapping[str, dg.AssetKey]
    # Each Delta mirror (schema.table -> path): the slot page names the lake's common watermark too.
    delta_paths: Mapping[str, str] = field(default_factory=dict)
    # The lake's changelog, when the warehouse keeps one: the page names its position as well.
    changelog_path: str | None = None


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
        run = record.dagster_run
        declared_dead = run.tags.get(DECLARED_DEAD_TAG)
        state = _RUN_STATES.get(run.status, RunState.IN_PROGRESS)
        if state is RunState.CANCELED and declared_dead is not None:
            state = RunState.FAILED  # terminated by the supervisor, not by an operator: a crash
        runs.append(
            WorkerRun(
                run_id=run.run_id,
                state=state,
                started=record.start_time is not None,
                created_at=record.create_timestamp.timestamp(),
                started_at=record.start_time,
                ended_at=record.end_time,
                needs_person=run.tags.get(NEEDS_PERSON_TAG),
                declared_dead_at=float(declared_dead) if declared_dead else None,
                last_lines=run.tags.get(LAST_LINES_TAG, ""),
            )
        )
    return runs


def _supervisor_decision(
    instance: dg.DagsterInstance,
    observation: SlotObservation | None,
    health: SlotHealth | None,
    now: float,
    policy: SupervisionPolicy,
) -> tuple[Decision, list[WorkerRun]]:
    runs = _worker_runs(instance)
    decision = decide(
        runs,
        slot_active=None if observation is None else observation.active,
        slot_inactive_since=health.memory.inactive_since if health else None,
        now=now,
        policy=policy,
    )
    return decision, runs


def _declare_dead(context: dg.SensorEvaluationContext, decision: Decision, now: float) -> None:
    """Terminate what is declared dead: tag the run (so that its CANCELED end counts as a crash,
    not as an operator's stop), ask its run process to stop the worker (SIGTERM, SIGCONT for a
    frozen one, SIGKILL after a minute), and mark it failed only when no run process answers."""
    instance = context.instance
    run = instance.get_run_by_id(decision.run_id) if decision.run_id else None
    if run is None or run.is_finished:
        return
    if decision.action is Action.TERMINATE_STALE:
        instance.add_run_tags(run.run_id, {DECLARED_DEAD_TAG: f"{now:.3f}"})
        try:
            terminated = instance.run_launcher.terminate(run.run_id)
        except Exception as exc:  # an unreachable code server: the run process is gone with it
            context.log.warning(f"could not ask run {run.run_id} to terminate: {exc}")
            terminated = False
        if terminated:
            context.log.info(f"asked run {run.run_id} to terminate: {decision.reason}")
            return
    fresh = instance.get_run_by_id(run.run_id)
    if fresh is not None and not fresh.is_finished:
        instance.report_run_failed(fresh, message=decision.reason)


def slot_metadata(observation: SlotObservation, health: SlotHealth) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "active": observation.active,
        "wal_status": observation.wal_status or "unknown",
        "retained_wal": format_bytes(observation.retained_wal_bytes),
        "behind": format_bytes(observation.lag_bytes),
        "confirmed_flush_lsn": (
            format_lsn(observation.confirmed_flush_lsn)
            if observation.confirmed_flush_lsn is not None
            else "-"
        ),
        "current_wal_lsn": format_lsn(observation.current_wal_lsn),
    }
    # A lost slot's retained WAL is unknown: no number rather than a 0 the charts would believe.
    if observation.retained_wal_bytes is not None:
        metadata["retained_wal_bytes"] = observation.retained_wal_bytes
    if observation.lag_bytes is not None:
        metadata["behind_bytes"] = observation.lag_bytes
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
        decision, runs = _supervisor_decision(context.instance, observation, health, now, settings.policy)
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
        elif decision.action in (Action.TERMINATE_STALE, Action.FAIL_STALE):
            _declare_dead(context, decision, now)

        incident = IncidentState.from_json(cursor.get("incident"))
        breaches: set[str] | None = None
        if decision.worker_breaches:
            breaches = set(decision.worker_breaches)
        elif decision.action is Action.PAUSED or (
            decision.action is Action.HEALTHY and observation is not None and observation.active
        ):
            breaches = set()
        if breaches is not None:
            transition = step(incident, breaches, now, settings.thresholds.cooldown_seconds)
            if transition.notify is not Notify.NOTHING:
                action = AlertAction.RESOLVE if transition.notify is Notify.RESOLVE else AlertAction.TRIGGER
                newest = next((r for r in runs if r.run_id == decision.run_id), None)
                page = worker_page(
                    action,
                    slot=postgres.slot,
                    location=postgres.location(),
                    decision=decision,
                    breaches=sorted(decision.worker_breaches)
                    or [WorkerBreach(r) for r in incident.reasons if r in _WORKER_BREACHES],
                    last_lines=newest.last_lines if newest else "",
                    links=settings.links,
                    timestamp=datetime.now(UTC),
                )
                alerting.send(page, context.log)
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
            incident,
            [b.value for b in health.breaches],
            now,
            settings.thresholds.cooldown_seconds,
            settled=not health.awaiting_worker,
        )
        if transition.notify is not Notify.NOTHING:
            action = AlertAction.RESOLVE if transition.notify is Notify.RESOLVE else AlertAction.TRIGGER
            supervisor, _ = _supervisor_decision(context.instance, observation, health, now, settings.policy)
            page = slot_page(
                action,
                slot=postgres.slot,
                location=postgres.location(),
                observation=observation,
                health=health,
                thresholds=settings.thresholds,
                supervisor=supervisor,
                links=settings.links,
                now=now,
                timestamp=datetime.now(UTC),
                lake=lake_freshness.observe(settings.delta_paths),
                changelog=(
                    None
                    if settings.changelog_path is None
                    else lake_freshness.observe_changelog(settings.changelog_path)
                ),
            )
            alerting.send(page, context.log)
        reason = "; ".join(health.breaches.values()) or (
            "waiting for a worker to connect to the slot" if health.awaiting_worker else "slot healthy"
        )
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
        minimum_interval_seconds=settings.interval_s,
        default_status=settings.default_status,
        description="Posts an alert for every failed run (the worker's crashes are the supervisor's: it "
        "relaunches them and pages on a crash loop).",
    )
    def run_failure_alert(context: dg.RunFailureSensorContext, alerting: AlertingResource) -> None:
        run = context.dagster_run
        if run.job_name in ignored_jobs:
            return
        step_errors = [
            event.step_failure_data.error.message
            for event in context.get_step_failure_events()
            if event.step_failure_data is not None and event.step_failure_data.error is not None
        ]
        page = run_failure_page(
            job_name=run.job_name,
            run_id=run.run_id,
            step_errors=step_errors,
            run_message=context.failure_event.message,
            links=settings.links,
            timestamp=datetime.now(UTC),
        )
        alerting.send(page, context.log)

    return run_failure_alert
