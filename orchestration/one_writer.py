"""One writer per merge checkpoint: what refuses a merge while the continuous merge runs.

The continuous merge (orchestration/continuous_merge.py) holds the merge query's checkpoint for as
long as its run lasts; a second query on the same checkpoint (a Materialize of a Delta asset, the
scheduled merge, a reset deleting the tables under it) would race it for the same batches. So those
refuse in one line naming the run, and say what to do instead.
"""

from __future__ import annotations

import dagster as dg

CONTINUOUS_MERGE_JOB = "continuous_merge"
IN_PROGRESS = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
    dg.DagsterRunStatus.CANCELING,
]


def running_continuous_merge(instance: dg.DagsterInstance) -> str | None:
    """The id of a continuous_merge run in progress, None when there is none."""
    records = instance.get_run_records(
        filters=dg.RunsFilter(job_name=CONTINUOUS_MERGE_JOB, statuses=IN_PROGRESS), limit=1
    )
    return records[0].dagster_run.run_id if records else None


def refuse_while_merging(instance: dg.DagsterInstance, refusing: str, then: str) -> None:
    """A dg.Failure when the continuous merge runs: `refusing` what (`refusing to ...`), `then` what
    to do instead."""
    run_id = running_continuous_merge(instance)
    if run_id is not None:
        raise dg.Failure(description=f"{refusing} while the continuous merge runs (run {run_id}): {then}")
