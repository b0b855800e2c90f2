"""Jobs: the long-running CDC worker, dropping the slot, and (see `build_jobs`) merge and maintenance.

Op bodies only translate resources into the worker's or Spark's own interface and report back.
"""

# No `from __future__ import annotations`: Dagster reads the config and resource types of op,
# asset and sensor parameters from their annotations at definition time.

import shutil
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import dagster as dg
from pydantic import Field

from cdc_worker.shell.postgres import slot as slot_admin
from orchestration.one_writer import IN_PROGRESS, refuse_while_merging
from orchestration.policy.links import CDC_WORKER_JOB
from orchestration.resources import (
    DeltaWarehouseResource,
    KafkaResource,
    PostgresResource,
    SchemaRegistryResource,
    SparkResource,
)
from orchestration.worker_config import worker_environment
from orchestration.worker_process import (
    EXIT_NEEDS_PERSON,
    LogLevel,
    WorkerLine,
    last_error,
    run_worker,
    worker_command,
)
from spark_jobs import maintenance, options
from spark_jobs.merging.parked import parked_path
from spark_jobs.merging.query_checkpoint import query_checkpoint
from spark_jobs.rules import layout
from spark_jobs.rules.object_storage import log_store_keys, single_writer

if TYPE_CHECKING:
    # What define_asset_job returns; Dagster does not export the name.
    from dagster._core.definitions.unresolved_asset_job_definition import UnresolvedAssetJobDefinition

WORKER_TAG = "bottledwater/worker"
SPARK_TAG = "bottledwater/spark"
TAIL_LINES = 20
PAGE_LINES = 5
TAG_VALUE_MAX = 2000
# Run tags the worker's run leaves for the supervisor and its pages (tags, unlike step metadata, come
# with the run records the supervisor reads every tick).
NEEDS_PERSON_TAG = "bottledwater/needs_person"  # the worker's reason, when it exited 2
LAST_LINES_TAG = "bottledwater/last_lines"  # its last log lines, when it failed
DECLARED_DEAD_TAG = "bottledwater/declared_dead_at"  # when the supervisor declared the run dead


class WorkerRunConfig(dg.Config):
    extra_args: list[str] = Field(
        default_factory=list,
        description="Extra `bottledwater` flags, e.g. ['--skip-snapshot'] or ['--on-error', 'log']. "
        "Connection settings come from the resources.",
    )


@dg.op(description="Runs `bottledwater` until it stops; its log lines become this run's events.")
def run_cdc_worker(
    context: dg.OpExecutionContext,
    config: WorkerRunConfig,
    postgres: PostgresResource,
    kafka: KafkaResource,
    schema_registry: SchemaRegistryResource,
) -> None:
    tail: list[WorkerLine] = []

    def forward(line: WorkerLine) -> None:
        tail.append(line)
        del tail[:-TAIL_LINES]
        log = {
            LogLevel.DEBUG: context.log.debug,
            LogLevel.INFO: context.log.info,
            LogLevel.WARNING: context.log.warning,
            LogLevel.ERROR: context.log.error,
        }[line.level]
        log(line.text)

    command = worker_command(config.extra_args)
    code = run_worker(
        command,
        worker_environment(postgres, kafka, schema_registry),
        forward,
        on_start=lambda pid: context.log.info(f"bottledwater started (pid {pid}) for slot {postgres.slot}"),
    )
    if code != 0:
        how = f"was killed by signal {-code}" if code < 0 else f"exited with status {code}"
        reason = last_error(tail)
        tags = {LAST_LINES_TAG: "\n".join(line.text for line in tail[-PAGE_LINES:])[-TAG_VALUE_MAX:]}
        if code == EXIT_NEEDS_PERSON:
            tags[NEEDS_PERSON_TAG] = reason[:TAG_VALUE_MAX]
            then = (
                "it needs a person, so the supervisor does not relaunch it: fix that, then launch cdc_worker"
            )
        else:
            then = "the supervisor sensor relaunches it after a backoff"
        context.instance.add_run_tags(context.run_id, tags)
        raise dg.Failure(
            description=f"bottledwater {how}: {reason}; {then}",
            metadata={
                "exit_code": code,
                "last_lines": dg.MetadataValue.text("\n".join(t.text for t in tail)),
            },
        )
    context.log.info("bottledwater stopped cleanly")


@dg.job(
    name=CDC_WORKER_JOB,
    description="The CDC worker: snapshot on first start, then streams WAL changes to Kafka until "
    "stopped. Kept alive by the cdc_worker_supervisor sensor; terminating the run stops it cleanly.",
    executor_def=dg.in_process_executor,  # the worker's lifetime is the run process's
    tags={WORKER_TAG: "1"},
)
def cdc_worker_job() -> None:
    run_cdc_worker()


class DropSlotConfig(dg.Config):
    confirm: str = Field(description="Type the slot's name. Anything else, or nothing, refuses to drop.")
    drop_publications: bool = Field(
        default=False, description="Also drop the publication (and its _inserts companion)."
    )


@dg.op(description="Drops the replication slot: its WAL is released, and its stream position is lost.")
def drop_replication_slot(
    context: dg.OpExecutionContext, config: DropSlotConfig, postgres: PostgresResource
) -> None:
    if config.confirm != postgres.slot:
        raise dg.Failure(
            description=f"refusing to drop slot {postgres.slot!r}: set confirm: {postgres.slot} in the "
            f"run config (got {config.confirm!r}). Dropping it loses the stream's position; the next "
            "worker start takes a new snapshot."
        )
    running = context.instance.get_runs(
        filters=dg.RunsFilter(job_name=CDC_WORKER_JOB, statuses=IN_PROGRESS), limit=1
    )
    if running:
        raise dg.Failure(
            description=f"refusing to drop slot {postgres.slot!r} while worker run {running[0].run_id} is in "
            "progress: stop the cdc_worker_supervisor sensor, terminate that run, then retry"
        )
    with postgres.connect() as conn:
        try:
            dropped = slot_admin.drop_slot(conn, postgres.slot)
        except slot_admin.SlotError as exc:
            raise dg.Failure(description=str(exc)) from exc
        if slot_admin.publication_state(conn, postgres.publication_name).exists:
            # Forget the dropped slot's snapshot record, as `bottledwater slot drop` does.
            slot_admin.record_snapshot_state(conn, postgres.publication_name, postgres.slot, None)
        context.log.info(f"slot {postgres.slot} {'dropped' if dropped else 'did not exist'}")
        if config.drop_publications:
            for name in (postgres.publication_name, postgres.publication_name + slot_admin.INSERTS_SUFFIX):
                if slot_admin.drop_publication(conn, name):
                    context.log.info(f"publication {name} dropped")


@dg.job(
    name="drop_slot",
    description="Drops the replication slot (and optionally the publications). Refuses unless the run "
    "config confirms the slot's name and no worker run is in progress.",
    executor_def=dg.in_process_executor,
)
def drop_slot_job() -> None:
    drop_replication_slot()


def merge_job(
    delta_asset_keys: Sequence[dg.AssetKey], merge_checks: Sequence[dg.AssetCheckKey]
) -> "UnresolvedAssetJobDefinition":
    """Materializes the Delta assets, then runs their merge-time quality checks."""
    return dg.define_asset_job(
        name="merge",
        selection=dg.AssetSelection.assets(*delta_asset_keys).without_checks()
        | dg.AssetSelection.checks(*merge_checks),
        description="Merges each table's Kafka changelog into its Delta table, then checks key "
        "uniqueness, non-null keys, freshness and schema drift.",
        tags={SPARK_TAG: "merge"},
        executor_def=dg.in_process_executor,  # one Spark session for every table of the run
    )


def reconcile_job(reconciliation_checks: Sequence[dg.AssetCheckKey]) -> "UnresolvedAssetJobDefinition":
    return dg.define_asset_job(
        name="reconcile",
        selection=dg.AssetSelection.checks(*reconciliation_checks),
        description="Compares every Delta table with Postgres (row count and checksum). Run it when the "
        "source is quiet: changes in flight differ legitimately.",
        tags={SPARK_TAG: "reconcile"},
        executor_def=dg.in_process_executor,
    )


class MaintenanceConfig(dg.Config):
    zorder: bool = Field(default=True, description="Z-order by the key while compacting (OPTIMIZE).")
    vacuum: bool = Field(default=True, description="VACUUM after OPTIMIZE.")
    vacuum_hours: float = Field(
        default=options.DEFAULT_VACUUM_HOURS,
        description="VACUUM retention; under 168 h only with force (a reader may still need the files).",
    )
    force: bool = Field(default=False, description="Allow a VACUUM retention under 168 hours.")
    tombstone_hours: float = Field(
        default=options.DEFAULT_TOMBSTONE_HOURS, description="How long the merge keeps deleted keys."
    )
    enable_deletion_vectors: bool = Field(
        default=False,
        description="Turn deletion vectors on for tables created without them (Delta reader 3 / writer 7).",
    )
    changelog_days: float = Field(
        default=options.DEFAULT_CHANGELOG_DAYS,
        description="Days the lake's changelog keeps a batch's rows (never a parked table's).",
    )


def maintenance_job(delta_asset_keys: Sequence[dg.AssetKey]) -> dg.JobDefinition:
    """OPTIMIZE and VACUUM of this pipeline's Delta tables; reports what it did as observations."""
    safe_names = {".".join(key.path[1:]): key for key in delta_asset_keys}

    @dg.op(description="spark_jobs.maintenance.maintain on each Delta table of the pipeline.")
    def maintain_delta_tables(
        context: dg.OpExecutionContext,
        config: MaintenanceConfig,
        spark: SparkResource,
        warehouse: DeltaWarehouseResource,
    ) -> None:
        session = spark.spark_session
        conf = {k: str(v) for k in log_store_keys(warehouse.root) if (v := session.conf.get(k, None))}
        if single_writer(warehouse.root, conf):
            # The bottledwater/spark tag queues this behind a scheduled merge; the continuous merge
            # is untagged, and two writers of one S3 table can lose a commit.
            refuse_while_merging(
                context.instance,
                f"refusing to maintain {warehouse.root}",
                "Delta on S3 without its DynamoDB log store takes one writer per table. Stop the "
                "continuous_merge_supervisor sensor, terminate that run, launch maintenance, then start "
                "the sensor again (docs/lakehouse.md, 'On object storage')",
            )
        results = maintenance.maintain(
            session,
            warehouse.root,
            tables=sorted(safe_names),
            zorder=config.zorder,
            vacuum_hours=config.vacuum_hours if config.vacuum else None,
            force=config.force,
            tombstone_retention=timedelta(hours=config.tombstone_hours),
            deletion_vectors=config.enable_deletion_vectors,
        )
        by_path = {warehouse.table_path(*key.path[1:]): key for key in delta_asset_keys}
        for result in results:
            metrics = result.optimize_metrics
            context.log_event(
                dg.AssetObservation(
                    asset_key=by_path[result.path],
                    metadata={
                        "files_removed": int(metrics.get("numFilesRemoved", 0)),
                        "files_added": int(metrics.get("numFilesAdded", 0)),
                        "vacuumed": result.vacuumed,
                        "tombstones_pruned": result.tombstones_pruned,
                        "deletion_vectors_purged": result.deletion_vectors_purged,
                    },
                )
            )
        context.log.info(f"maintained {len(results)} Delta table(s)")
        kept = maintenance.maintain_changelog(
            spark.spark_session,
            warehouse.root,
            timedelta(days=config.changelog_days),
            vacuum_hours=config.vacuum_hours if config.vacuum else None,
            force=config.force,
        )
        if kept is not None:
            context.log.info(
                f"the changelog: {kept.trimmed} rows past {config.changelog_days:g} days trimmed"
            )

    @dg.job(
        name="maintenance",
        description="OPTIMIZE (Z-ordered by the key) and VACUUM of the Delta tables, and pruning of the "
        "merge's old tombstones and of the lake's changelog past its retention.",
        executor_def=dg.in_process_executor,
        tags={SPARK_TAG: "maintenance"},
    )
    def maintenance_job_def() -> None:
        maintain_delta_tables()

    return maintenance_job_def


class ResetDeltaConfig(dg.Config):
    confirm: str = Field(description="Type the slot's name. Anything else, or nothing, refuses to reset.")


def delta_table_paths(warehouse: DeltaWarehouseResource, schema: str, table: str) -> list[str]:
    """Everything the merge keeps for one table: the mirror, its history table, its recent tombstones
    and its streaming checkpoint (which holds Kafka offsets of topics that a rebuild deletes)."""
    location = layout.TableLocation("", schema, table)
    return [
        location.path(warehouse.root),
        location.history_path(warehouse.root),
        location.tombstones_path(warehouse.root),
        location.checkpoint(warehouse.checkpoints()),
    ]


def _is_local(path: str) -> bool:
    return urlsplit(path).scheme in ("", "file")


def _delete_path(path: str, spark: SparkResource) -> bool:
    """Delete a directory tree, local or on any filesystem Spark's Hadoop client reaches (s3a://, ...)."""
    if _is_local(path):
        local = Path(urlsplit(path).path if path.startswith("file:") else path)
        if not local.exists():
            return False
        shutil.rmtree(local)
        return True
    session = spark.spark_session
    jvm = session.sparkContext._jvm
    hadoop_path = jvm.org.apache.hadoop.fs.Path(path)
    filesystem = hadoop_path.getFileSystem(session.sparkContext._jsc.hadoopConfiguration())
    return bool(filesystem.exists(hadoop_path) and filesystem.delete(hadoop_path, True))


def reset_delta_job(delta_asset_keys: Sequence[dg.AssetKey]) -> dg.JobDefinition:
    """Deletes the pipeline's Delta tables, the lake's changelog and the merge's checkpoints: step
    three of the rebuild after a lost slot (docs/orchestration.md), after `bottledwater rebuild`
    deleted the topics. The changelog goes whole: its records are the deleted topics', whose offsets
    the recreated topics start over at, and every table of the pipeline is reset with it. The next
    merge recreates every table, and the changelog, from the new snapshot. Refuses while the
    continuous merge runs (it writes what this deletes)."""

    @dg.op(
        description="Deletes each Delta table of the pipeline, with its history, tombstones and checkpoint, "
        "and the lake's changelog."
    )
    def reset_delta_tables(
        context: dg.OpExecutionContext,
        config: ResetDeltaConfig,
        postgres: PostgresResource,
        warehouse: DeltaWarehouseResource,
        spark: SparkResource,
    ) -> None:
        if config.confirm != postgres.slot:
            raise dg.Failure(
                description=f"refusing to reset the Delta tables of slot {postgres.slot!r}: set confirm: "
                f"{postgres.slot} in the run config (got {config.confirm!r}). Their rows are gone until the "
                "next merge rebuilds them from the topics."
            )
        refuse_while_merging(
            context.instance,
            "refusing to reset the Delta tables",
            "stop the continuous_merge_supervisor sensor, terminate that run, then launch reset_delta again "
            "(docs/orchestration.md, 'Rebuilding after a lost slot')",
        )
        deleted = 0
        for key in delta_asset_keys:
            schema, table = key.path[1], key.path[2]
            removed = [
                path for path in delta_table_paths(warehouse, schema, table) if _delete_path(path, spark)
            ]
            deleted += bool(removed)
            context.log.info(
                f"{schema}.{table}: deleted {', '.join(removed) if removed else 'nothing (none there)'}"
            )
            context.log_event(
                dg.AssetObservation(asset_key=key, metadata={"reset": True, "paths_deleted": len(removed)})
            )
        # The one merge query's checkpoint (its topic ledger with it), its parked slices and the
        # changelog hold offsets of the deleted topics, which the recreated ones start over at; the
        # idle marks and the queries' proof files name versions of the deleted tables.
        shared_state = (
            query_checkpoint(warehouse.checkpoints()),
            parked_path(warehouse.root),
            layout.changelog_path(warehouse.root),
            layout.idle_marks_path(warehouse.root),
            layout.proofs_path(warehouse.root),
        )
        for shared in shared_state:
            if _delete_path(shared, spark):
                context.log.info(f"deleted {shared}")
        context.log.info(
            f"reset {deleted} Delta table(s) and the changelog; the next merge rebuilds them from the topics "
            "(launch merge, wait for merge_schedule, or start continuous_merge_supervisor again)"
        )

    @dg.job(
        name="reset_delta",
        description="Deletes the Delta tables, the changelog and the merge checkpoints (rebuild after a "
        "lost slot). Refuses unless the run config confirms the slot's name, and while the continuous "
        "merge runs; waits for a running merge.",
        executor_def=dg.in_process_executor,
        tags={SPARK_TAG: "reset"},  # the instance runs one Spark-tagged run at a time: never under a merge
    )
    def reset_delta_job_def() -> None:
        reset_delta_tables()

    return reset_delta_job_def
