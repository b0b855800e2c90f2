"""Assets: the replication slot, the snapshot export, one external asset per Kafka topic, and one
Delta table per captured table (see `delta_assets`, materialized by the merge job).

Lineage as the UI draws it:
replication_slot -> snapshot_export -> kafka/<topic> (and kafka/<control topic>) -> delta/<schema>/<table>.
"""

# No `from __future__ import annotations`: Dagster reads the config and resource types of op,
# asset and sensor parameters from their annotations at definition time.

from collections.abc import Iterator, Sequence
from datetime import timedelta
from typing import Any

import dagster as dg
from pydantic import Field

from cdc_worker.config import ConfigError
from cdc_worker.core.lsn import format_lsn
from cdc_worker.shell.postgres import slot as slot_admin
from kafka_contract.topics import control_topic_name
from orchestration import resnapshot
from orchestration.changelog_asset import CHANGELOG_ASSET, changelog_spec, changelog_status
from orchestration.changelog_asset import materialization as changelog_materialization
from orchestration.discovery import CapturedTable
from orchestration.one_writer import refuse_while_merging
from orchestration.policy.slot_health import format_bytes
from orchestration.resources import (
    DeltaWarehouseResource,
    KafkaResource,
    PostgresResource,
    SchemaRegistryResource,
    SparkResource,
)
from orchestration.worker_config import WorkerStartFailed, start_until_streaming, worker_config
from spark_jobs.lake.mirror_versions import lake_watermark
from spark_jobs.merge import KafkaSource, run_merge
from spark_jobs.merge_options import MergeOptions
from spark_jobs.merging import commit_report, ddl
from spark_jobs.rules import layout

REPLICATION_SLOT = dg.AssetKey("replication_slot")
SNAPSHOT_EXPORT = dg.AssetKey("snapshot_export")
CDC_GROUP = "cdc"
KAFKA_GROUP = "kafka"
DELTA_GROUP = "delta"


def topic_key(topic: str) -> dg.AssetKey:
    return dg.AssetKey(["kafka", topic])


SNAPSHOT_ENGINE_HELP = (
    "Only when the slot is created: who reads its snapshot, `worker` (the worker's own processes) or "
    "`spark` (Spark tasks, one per ctid range, under the worker's --spark-master; the worker's "
    "--snapshot-engine)."
)


class SlotConfig(dg.Config):
    skip_snapshot: bool = Field(
        default=False,
        description="Only when the slot is created: stream from now on without publishing existing rows "
        "(the worker's -x). Leave false unless the topics already hold the tables.",
    )
    snapshot_engine: str = Field(default="worker", description=SNAPSHOT_ENGINE_HELP)


def _slot_metadata(postgres: PostgresResource) -> dict[str, Any]:
    observation = postgres.observe_slot()
    with postgres.connect() as conn:
        snapshot = slot_admin.snapshot_state(conn, postgres.publication_name, postgres.slot)
    if observation is None:
        return {"exists": False, "snapshot": snapshot or "none"}
    lsn = observation.confirmed_flush_lsn
    return {
        "exists": True,
        "active": observation.active,
        "wal_status": observation.wal_status or "unknown",
        "confirmed_flush_lsn": format_lsn(lsn) if lsn is not None else "-",
        "retained_wal_bytes": observation.retained_wal_bytes,
        "retained_wal": format_bytes(observation.retained_wal_bytes),
        "behind": format_bytes(observation.lag_bytes),
        "snapshot": snapshot or "not recorded",
        "database": observation.database,
    }


def _start_worker(
    postgres: PostgresResource,
    kafka: KafkaResource,
    schema_registry: SchemaRegistryResource,
    *,
    skip_snapshot: bool,
    snapshot_engine: str,
) -> int:
    overrides = {"skip_snapshot": skip_snapshot, "snapshot_engine": snapshot_engine}
    try:
        config = worker_config(postgres, kafka, schema_registry, overrides=overrides)
        return start_until_streaming(config)
    except (WorkerStartFailed, ConfigError) as exc:
        raise dg.Failure(description=str(exc)) from exc


@dg.asset(
    key=REPLICATION_SLOT,
    group_name=CDC_GROUP,
    kinds={"postgres"},
    description="The logical replication slot and the publications of the captured tables. "
    "Materializing it runs the worker's startup when no worker holds the slot: checks, publications "
    "synced to the selected tables, and a slot created together with its consistent snapshot when "
    "it is new. A slot left behind holds WAL and fills the disk: drop it with the drop_slot job.",
)
def replication_slot(
    context: dg.AssetExecutionContext,
    config: SlotConfig,
    postgres: PostgresResource,
    kafka: KafkaResource,
    schema_registry: SchemaRegistryResource,
) -> dg.MaterializeResult:
    before = postgres.observe_slot()
    with postgres.connect() as conn:
        pending = slot_admin.snapshot_state(conn, postgres.publication_name, postgres.slot)
    # A slot whose snapshot never completed is dropped and created afresh by the worker's startup.
    created = before is None or pending == slot_admin.SNAPSHOT_PENDING
    start_lsn: int | None = None
    if before is not None and before.active:
        context.log.info(f"slot {postgres.slot} is held by a running worker: reporting it only")
    else:
        start_lsn = _start_worker(
            postgres,
            kafka,
            schema_registry,
            skip_snapshot=config.skip_snapshot,
            snapshot_engine=config.snapshot_engine,
        )
        verb = "created" if created else "resumed"
        context.log.info(f"slot {postgres.slot} {verb}; the stream starts at {format_lsn(start_lsn)}")
    metadata = _slot_metadata(postgres)
    metadata["created_by_this_run"] = created
    if created and start_lsn is not None:
        metadata["snapshot_lsn"] = format_lsn(start_lsn)
        metadata["snapshot_taken"] = not config.skip_snapshot
    return dg.MaterializeResult(metadata=metadata)


class SnapshotConfig(dg.Config):
    tables: list[str] = Field(
        default_factory=list,
        description="For a slot that already streams: schema.table globs to re-snapshot while "
        "streaming continues; empty: every captured table.",
    )
    snapshot_engine: str = Field(default="worker", description=SNAPSHOT_ENGINE_HELP)
    progress_timeout_s: float = Field(
        default=600.0,
        description="Fail when the worker reports no progress of the re-snapshot for this long (the "
        "request stays in the WAL and still runs when a worker streams the slot).",
    )


def _snapshot_taken_in_this_run(context: dg.AssetExecutionContext) -> str | None:
    """The snapshot LSN when this run's replication_slot step created the slot with its snapshot."""
    event = context.instance.get_latest_materialization_event(REPLICATION_SLOT)
    if event is None or event.run_id != context.run.run_id or event.asset_materialization is None:
        return None
    metadata = event.asset_materialization.metadata
    taken = metadata.get("snapshot_taken")
    lsn = metadata.get("snapshot_lsn")
    if taken is None or taken.value is not True or lsn is None:
        return None
    return str(lsn.value)


@dg.asset(
    key=SNAPSHOT_EXPORT,
    deps=[REPLICATION_SLOT],
    group_name=CDC_GROUP,
    kinds={"postgres", "kafka"},
    description="A consistent snapshot of the selected tables in Kafka (op r, every row at the slot's "
    "consistent LSN). For a new slot it is taken with the slot, in one session, as consistency "
    "requires; progress is in the run log.",
)
def snapshot_export(
    context: dg.AssetExecutionContext,
    config: SnapshotConfig,
    postgres: PostgresResource,
    kafka: KafkaResource,
    schema_registry: SchemaRegistryResource,
) -> dg.MaterializeResult:
    lsn = _snapshot_taken_in_this_run(context)
    if lsn is not None:
        context.log.info(f"the snapshot was taken with the new slot in this run, at {lsn}")
        return dg.MaterializeResult(metadata={"snapshot_lsn": lsn, "mode": "with the new slot"})
    observation = postgres.observe_slot()
    with postgres.connect() as conn:
        state = slot_admin.snapshot_state(conn, postgres.publication_name, postgres.slot)
    if observation is None or state == slot_admin.SNAPSHOT_PENDING:
        if observation is not None and observation.active:
            raise dg.Failure(description=f"slot {postgres.slot} is taking its first snapshot right now")
        start_lsn = _start_worker(
            postgres, kafka, schema_registry, skip_snapshot=False, snapshot_engine=config.snapshot_engine
        )
        return dg.MaterializeResult(metadata={"snapshot_lsn": format_lsn(start_lsn), "mode": "new slot"})
    return _resnapshot(context, config, postgres, kafka, schema_registry, active=observation.active)


def _resnapshot(
    context: dg.AssetExecutionContext,
    config: SnapshotConfig,
    postgres: PostgresResource,
    kafka: KafkaResource,
    schema_registry: SchemaRegistryResource,
    *,
    active: bool,
) -> dg.MaterializeResult:
    """The slot streams already: the worker re-reads the tables in chunks between watermarks while
    it goes on streaming, so that no topic ends on a row older than the newest change."""
    try:
        tables = resnapshot.choose_tables(postgres, config.tables)
        names = ", ".join(t.qualified_name for t in tables)
        if not active:
            context.log.warning(
                f"no worker streams slot {postgres.slot} now: the re-snapshot of {names} runs when one "
                "does (the cdc_worker_supervisor sensor starts it)"
            )
        context.log.info(f"asking the worker of slot {postgres.slot} to re-snapshot {names}")
        outcome = resnapshot.run_resnapshot(
            postgres,
            kafka,
            schema_registry,
            tables,
            progress_timeout_s=config.progress_timeout_s,
            log=context.log.info,
        )
    except resnapshot.ResnapshotFailed as exc:
        raise dg.Failure(description=str(exc)) from exc
    if outcome.failed:
        raise dg.Failure(
            description="re-snapshot failed for "
            + "; ".join(f"{t.name}: {t.reason}" for t in outcome.failed),
            metadata={"request_id": outcome.request_id},
        )
    return dg.MaterializeResult(
        metadata={
            "mode": "re-snapshot while streaming",
            "request_id": outcome.request_id,
            "request_lsn": format_lsn(outcome.request_lsn),
            "tables": ", ".join(outcome.tables),
            "rows": sum(t.rows for t in outcome.tables.values()),
            **{f"rows {name}": t.rows for name, t in outcome.tables.items()},
        }
    )


def topic_specs(tables: Sequence[CapturedTable], topic_prefix: str | None) -> list[dg.AssetSpec]:
    """External assets: the worker writes the topics, Dagster only shows and observes them."""
    feeds = [REPLICATION_SLOT, SNAPSHOT_EXPORT]
    specs = [
        dg.AssetSpec(
            key=topic_key(t.topic),
            deps=feeds,
            group_name=KAFKA_GROUP,
            kinds={"kafka"},
            description=f"Changelog of {t.qualified_name}: keyed by ({', '.join(t.key_columns) or 'none'}), "
            "snapshot rows then every committed change, tombstones for deletes.",
            metadata={"topic": t.topic, "table": t.qualified_name, "key_columns": ", ".join(t.key_columns)},
        )
        for t in tables
    ]
    control = control_topic_name(topic_prefix)
    specs.append(
        dg.AssetSpec(
            key=topic_key(control),
            deps=feeds,
            group_name=KAFKA_GROUP,
            kinds={"kafka"},
            description="Control events (TRUNCATE) with their LSN, keyed by table.",
            metadata={"topic": control},
        )
    )
    return specs


def table_location(table: CapturedTable, topic_prefix: str | None) -> layout.TableLocation:
    """Where the merge keeps the table: the safe names of its topic (spark_jobs.rules.layout)."""
    return layout.location_for_topic(table.topic, topic_prefix)


def delta_key(location: layout.TableLocation) -> dg.AssetKey:
    return dg.AssetKey(["delta", location.schema, location.table])


def delta_keys(tables: Sequence[CapturedTable], topic_prefix: str | None) -> dict[dg.AssetKey, CapturedTable]:
    return {delta_key(table_location(t, topic_prefix)): t for t in tables}


def _behind(lags: dict[str, Any], key: dg.AssetKey) -> dict[str, Any]:
    """A mirror's lag behind the changelog as its materialization's metadata (none when unknown)."""
    lag = lags.get(f"{key.path[1]}.{key.path[2]}")
    return {} if lag is None else {"behind_changelog_s": lag}


def freshness_policy(freshness_limit_s: float | None) -> dg.FreshnessPolicy | None:
    """Dagster's own freshness of a Delta asset: materialized within the limit (a warning at half of
    it). Never shorter than twice the continuous merge's report of an idle mirror (`commit_report`),
    which would otherwise turn a table with no changes stale between two reports."""
    if freshness_limit_s is None:
        return None
    fail = max(freshness_limit_s, 2 * commit_report.IDLE_WINDOW_S)
    return dg.FreshnessPolicy.time_window(
        fail_window=timedelta(seconds=fail), warn_window=timedelta(seconds=fail / 2)
    )


def build_delta_assets(
    tables: Sequence[CapturedTable],
    topic_prefix: str | None,
    *,
    changelog: bool = False,
    freshness_limit_s: float | None = None,
) -> dg.AssetsDefinition:
    """One Delta asset per captured table, all merged by one op so that a run starts one Spark
    session; any subset can be materialized (can_subset). With the lake's `changelog`, it is one more
    asset of the op, between the topics and the mirrors. `freshness_limit_s`: each asset's
    `freshness_policy`."""
    control = topic_key(control_topic_name(topic_prefix))
    by_key = delta_keys(tables, topic_prefix)
    upstream = [CHANGELOG_ASSET] if changelog else []
    policy = freshness_policy(freshness_limit_s)
    specs = [
        dg.AssetSpec(
            key=key,
            deps=[topic_key(t.topic), control, *upstream],
            group_name=DELTA_GROUP,
            kinds={"delta", "spark"},
            description=f"Delta mirror of {t.qualified_name}: its columns plus _bw_lsn, _bw_seq, _bw_op "
            "and _bw_commit_ts, merged exactly once in LSN order from the topic.",
            metadata={"table": t.qualified_name, "topic": t.topic, "key_columns": ", ".join(t.key_columns)},
            freshness_policy=policy,
        )
        for key, t in by_key.items()
    ]
    if changelog:
        topics = [*(topic_key(t.topic) for t in tables), control]
        specs.append(changelog_spec(topics, DELTA_GROUP, freshness_policy=policy))
    names = [f"{k.path[1]}.{k.path[2]}" for k in by_key]

    @dg.multi_asset(
        name="merge_changelogs",
        specs=specs,
        can_subset=True,
        op_tags={"bottledwater/spark": "merge"},
        description="Merges each selected table's Kafka changelog into its Delta table "
        "(spark_jobs.merge, trigger availableNow: what is in Kafka now, then stop).",
    )
    def merge_changelogs(
        context: dg.AssetExecutionContext,
        *,
        spark: SparkResource,
        kafka: KafkaResource,
        schema_registry: SchemaRegistryResource,
        warehouse: DeltaWarehouseResource,
        postgres: PostgresResource,
    ) -> Iterator[dg.MaterializeResult]:
        # One writer per checkpoint: the running query merges these tables and reports them itself.
        refuse_while_merging(
            context.instance,
            "refusing to merge the Delta assets",
            "it merges them every few seconds and reports their materializations itself. To merge by "
            "hand, stop the continuous_merge_supervisor sensor and terminate that run first",
        )
        options = MergeOptions(
            warehouse=warehouse.root,
            output_format=kafka.message_format,
            schema_registry=schema_registry.url,
            topic_prefix=kafka.topic_prefix,
            # JSON messages carry no types: the merge reads them from the Postgres catalog.
            postgres=postgres.dsn if kafka.message_format == "json" else None,
            changelog=warehouse.changelog,
            mirror_budget_s=warehouse.mirror_budget_s if warehouse.changelog else None,
            mirror_features=warehouse.features(),
        )
        source = KafkaSource(kafka.bootstrap_servers, options=kafka.spark_options())
        # One query for every table of the pipeline, whatever the selection: the query's checkpoint
        # is shared, and a table left out of it would restart from its first offset when it returns.
        # The selection decides which materializations are reported.
        runs = {
            run.topic: run
            for run in run_merge(
                spark.spark_session,
                options,
                source,
                warehouse.checkpoints(),
                topics=sorted(t.topic for t in by_key.values()),
            )
        }
        failed: list[str] = []
        status = changelog_status(spark.spark_session, warehouse.root, names) if changelog else {}
        if CHANGELOG_ASSET in context.selected_asset_keys:
            yield changelog_materialization(status)
        behind = status.get("mirrors_behind_s") or {}
        for key in sorted(context.selected_asset_keys - {CHANGELOG_ASSET}, key=lambda k: k.to_user_string()):
            table = by_key[key]
            run = runs.get(table.topic)
            if run is None or run.error:
                # Parked (docs/lakehouse.md): the other tables merged; the next run replays it.
                error = "its topic does not exist yet" if run is None else run.error
                context.log.error(f"merging {table.topic} into {key.to_user_string()} failed: {error}")
                failed.append(table.qualified_name)
                continue
            added = sorted({c for b in run.batches for c in b.added_columns})
            yield dg.MaterializeResult(
                asset_key=key,
                metadata={
                    "path": run.path,
                    "batches": len(run.batches),
                    "messages": run.messages,
                    "changes_merged": sum(b.changes for b in run.batches),
                    "added_columns": ", ".join(added) or "none",
                    # Merged behind the changelog (BW_MIRROR_BUDGET_SECONDS): its records wait there.
                    **({"deferred": True} if run.deferred else {}),
                    **_behind(behind, key),
                    # --capture-ddl: the table's DDL log (drops, renames, type changes).
                    **ddl.history_metadata(
                        spark.spark_session, warehouse.root, table_location(table, kafka.topic_prefix)
                    ),
                },
            )
        # The lake's common watermark over every Delta asset (docs/lakehouse.md), on each of them.
        common = lake_watermark(spark.spark_session, warehouse.root, names)
        for key in context.selected_asset_keys - {CHANGELOG_ASSET}:
            context.log_event(
                dg.AssetObservation(
                    asset_key=key, metadata={k: v for k, v in common.items() if v is not None}
                )
            )
        if failed:
            raise dg.Failure(description=f"the merge failed for {', '.join(failed)}: see the errors above")

    return merge_changelogs
