"""Schedules: the merge (every 5 minutes by default) and the Delta maintenance (daily).

A tick is skipped while a run of the same job is still queued or running: one merge at a time is
all a Spark-bound machine can do, and runs piling up in the queue would only delay each other.
"""

from typing import TYPE_CHECKING

import dagster as dg

from orchestration.one_writer import IN_PROGRESS

if TYPE_CHECKING:
    from dagster._core.definitions.unresolved_asset_job_definition import UnresolvedAssetJobDefinition


def _one_at_a_time(
    name: str,
    job: "UnresolvedAssetJobDefinition | dg.JobDefinition",
    cron: str,
    default_status: dg.DefaultScheduleStatus,
    description: str,
) -> dg.ScheduleDefinition:
    @dg.schedule(
        name=name, cron_schedule=cron, job=job, default_status=default_status, description=description
    )
    def schedule(context: dg.ScheduleEvaluationContext) -> dg.RunRequest | dg.SkipReason:
        busy = context.instance.get_runs(
            filters=dg.RunsFilter(job_name=job.name, statuses=IN_PROGRESS), limit=1
        )
        if busy:
            return dg.SkipReason(f"{job.name} run {busy[0].run_id} is still {busy[0].status.value.lower()}")
        return dg.RunRequest()

    return schedule


def build_schedules(
    merge_job: "UnresolvedAssetJobDefinition | None",
    maintenance_job: dg.JobDefinition | None,
    *,
    merge_cron: str,
    maintenance_cron: str,
    default_status: dg.DefaultScheduleStatus,
    merge_status: dg.DefaultScheduleStatus | None = None,
) -> list[dg.ScheduleDefinition]:
    """No schedule for a job that does not exist (no tables discovered yet). `merge_status`: the
    merge schedule's own default state when it differs (off while the continuous merge runs)."""
    schedules = []
    if merge_job is not None:
        schedules.append(
            _one_at_a_time(
                "merge_schedule",
                merge_job,
                merge_cron,
                merge_status or default_status,
                f"Merges the changelogs into Delta ({merge_cron}; BW_MERGE_CRON).",
            )
        )
    if maintenance_job is not None:
        schedules.append(
            _one_at_a_time(
                "maintenance_schedule",
                maintenance_job,
                maintenance_cron,
                default_status,
                f"OPTIMIZE and VACUUM of the Delta tables ({maintenance_cron}; BW_MAINTENANCE_CRON).",
            )
        )
    return schedules
