"""The schedules launch a run unless one of the same job is still queued or running."""

from __future__ import annotations

import dagster as dg
from dagster._core.storage.dagster_run import DagsterRun

from orchestration.schedules import build_schedules


def test_a_tick_is_skipped_while_a_run_of_the_job_is_in_progress() -> None:
    @dg.op
    def noop() -> None: ...

    @dg.job(name="maintenance")
    def maintenance() -> None:
        noop()

    [schedule] = build_schedules(
        None, maintenance, merge_cron="*/5 * * * *", maintenance_cron="0 3 * * *",
        default_status=dg.DefaultScheduleStatus.STOPPED,
    )  # fmt: skip
    assert schedule.cron_schedule == "0 3 * * *"
    with dg.instance_for_test() as instance:
        with dg.build_schedule_context(instance=instance) as context:
            assert len(schedule.evaluate_tick(context).run_requests or []) == 1
        instance.add_run(DagsterRun(job_name="maintenance", run_id="r1", status=dg.DagsterRunStatus.STARTED))
        with dg.build_schedule_context(instance=instance) as context:
            tick = schedule.evaluate_tick(context)
        assert not tick.run_requests
        assert tick.skip_message == "maintenance run r1 is still started"
