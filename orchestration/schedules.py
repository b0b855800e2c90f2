"""Schedules: the merge (every 5 minutes by default) and the Delta maintenance (daily)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import dagster as dg

if TYPE_CHECKING:
    from dagster._core.definitions.unresolved_asset_job_definition import UnresolvedAssetJobDefinition


def build_schedules(
    merge_job: UnresolvedAssetJobDefinition | None,
    maintenance_job: dg.JobDefinition | None,
    *,
    merge_cron: str,
    maintenance_cron: str,
    default_status: dg.DefaultScheduleStatus,
) -> list[dg.ScheduleDefinition]:
    """No schedule for a job that does not exist (no tables discovered yet)."""
    schedules = []
    if merge_job is not None:
        schedules.append(
            dg.ScheduleDefinition(
                name="merge_schedule",
                job=merge_job,
                cron_schedule=merge_cron,
                default_status=default_status,
                description=f"Merges the changelogs into Delta ({merge_cron}; BW_MERGE_CRON).",
            )
        )
    if maintenance_job is not None:
        schedules.append(
            dg.ScheduleDefinition(
                name="maintenance_schedule",
                job=maintenance_job,
                cron_schedule=maintenance_cron,
                default_status=default_status,
                description=f"OPTIMIZE and VACUUM of the Delta tables ({maintenance_cron}).",
            )
        )
    return schedules
