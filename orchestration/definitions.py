"""The Dagster code location: assembles resources, assets, checks, jobs, sensors and schedules.

Only assembly happens here; every body lives in `cdc_worker` or `spark_jobs` (through the other
modules of this package). `defs` is built when Dagster loads the code location, not at import: that
is when the settings are read from the environment (orchestration/settings.py) and the captured
tables are discovered from the publication (orchestration/discovery.py, the one documented piece of
I/O at load, which fails soft).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

import dagster as dg

from orchestration import assets, changelog_asset, checks, continuous_merge, jobs, schedules, sensors
from orchestration.discovery import CapturedTable, discover_tables
from orchestration.policy.links import UiLinks
from orchestration.policy.supervision import SupervisionPolicy
from orchestration.resources import (
    AlertingResource,
    DeltaWarehouseResource,
    KafkaResource,
    PostgresResource,
    SchemaRegistryResource,
    SparkResource,
)
from orchestration.settings import Automation, LocationSettings, MergeMode, load_settings
from spark_jobs.rules import layout

if TYPE_CHECKING:
    from dagster._core.definitions.unresolved_asset_job_definition import UnresolvedAssetJobDefinition

log = logging.getLogger(__name__)


def _secret(settings: LocationSettings, variable: str, value: str | None) -> str | None:
    """An EnvVar when the value came from a set variable, so the UI shows its name, not its value."""
    if value is not None and variable in settings.secret_env:
        return dg.EnvVar(variable)
    return value


def build_resources(settings: LocationSettings) -> dict[str, dg.ConfigurableResource]:
    alerting = settings.alerting
    return {
        "postgres": PostgresResource(
            dsn=_secret(settings, "BOTTLEDWATER_POSTGRES", settings.postgres_dsn) or settings.postgres_dsn,
            slot=settings.slot,
            publication=settings.publication,
            tables=list(settings.tables),
        ),
        "kafka": KafkaResource(
            bootstrap_servers=settings.broker,
            topic_prefix=settings.topic_prefix,
            message_format=settings.output_format,
        ),
        "schema_registry": SchemaRegistryResource(
            url=_secret(settings, "BOTTLEDWATER_SCHEMA_REGISTRY", settings.schema_registry)
        ),
        # BW_SPARK_CONF stays in the environment: the resource reads it when a session starts.
        "spark": SparkResource(
            master=settings.spark.master,
            driver_memory=settings.spark.driver_memory,
            shuffle_partitions=settings.spark.shuffle_partitions,
            jars=settings.spark.jars,
            packages=",".join(settings.spark.packages),
        ),
        "warehouse": DeltaWarehouseResource(
            root=settings.warehouse,
            changelog=settings.changelog,
            mirror_budget_s=settings.mirror_budget_s,
            mirror_features=settings.mirror_features,
        ),
        "alerting": AlertingResource(
            webhook_url=_secret(settings, "BW_ALERT_WEBHOOK_URL", alerting.webhook_url),
            webhook_format=alerting.webhook_format.value,
            pagerduty_routing_key=_secret(
                settings, "BW_PAGERDUTY_ROUTING_KEY", alerting.pagerduty_routing_key
            ),
        ),
    }


def build_definitions(settings: LocationSettings, tables: Sequence[CapturedTable]) -> dg.Definitions:
    running = settings.automation is Automation.RUNNING
    continuous_on = running and settings.merge_mode is MergeMode.CONTINUOUS
    topic_specs = assets.topic_specs(tables, settings.topic_prefix)
    sensor_settings = sensors.SensorSettings(
        interval_s=settings.sensor_interval_s,
        thresholds=settings.thresholds,
        policy=SupervisionPolicy(
            backoff_s=settings.worker_backoff_s,
            backoff_max_s=settings.worker_backoff_max_s,
            stale_grace_s=settings.thresholds.inactive_grace_seconds,
        ),
        default_status=dg.DefaultSensorStatus.RUNNING if running else dg.DefaultSensorStatus.STOPPED,
        links=UiLinks(settings.dagster_url, settings.runbook_url),
        slot_asset=assets.REPLICATION_SLOT,
        topic_assets={str(spec.metadata["topic"]): spec.key for spec in topic_specs},
        delta_paths={
            f"{schema}.{table}": layout.TableLocation("", schema, table).path(settings.warehouse)
            for schema, table in continuous_merge.delta_locations(tables, settings.topic_prefix).values()
        },
        changelog_path=layout.changelog_path(settings.warehouse) if settings.changelog else None,
    )
    table_assets: list[dg.AssetsDefinition] = []
    quality_checks: list[dg.AssetChecksDefinition] = []
    table_jobs: list[dg.JobDefinition | UnresolvedAssetJobDefinition] = []
    merge = None
    maintain = None
    merge_sensors: list[dg.SensorDefinition] = []
    if tables:
        keyed = {
            key: bool(t.key_columns) for key, t in assets.delta_keys(tables, settings.topic_prefix).items()
        }
        table_assets.append(
            assets.build_delta_assets(
                tables,
                settings.topic_prefix,
                changelog=settings.changelog,
                freshness_limit_s=settings.freshness_limit_s,
            )
        )
        quality_checks.append(checks.build_quality_checks(keyed, settings.freshness_limit_s))
        merged, merge_checks = list(keyed), checks.check_keys(keyed, checks.MERGE_CHECKS)
        if settings.changelog:
            # The lake's changelog: one more asset of the merge, with its own two checks.
            names = [f"{k.path[1]}.{k.path[2]}" for k in keyed]
            changelog_checks = changelog_asset.build_changelog_checks(names, settings.freshness_limit_s)
            quality_checks.append(changelog_checks)
            merged.append(changelog_asset.CHANGELOG_ASSET)
            merge_checks += list(changelog_checks.check_keys)
        merge = jobs.merge_job(merged, merge_checks)
        maintain = jobs.maintenance_job(list(keyed))
        table_jobs += [merge, maintain, jobs.reset_delta_job(list(keyed))]
        reconciliation = checks.check_keys(keyed, [checks.RECONCILIATION])
        if reconciliation:
            table_jobs.append(jobs.reconcile_job(reconciliation))
        continuous = continuous_merge.build_continuous_merge_job([t.topic for t in tables])
        table_jobs.append(continuous)
        merge_sensors.append(
            continuous_merge.build_continuous_merge_supervisor(
                continuous,
                continuous_merge.delta_locations(tables, settings.topic_prefix),
                settings.sensor_interval_s,
                default_status=(
                    dg.DefaultSensorStatus.RUNNING if continuous_on else dg.DefaultSensorStatus.STOPPED
                ),
            )
        )
    return dg.Definitions(
        assets=[assets.replication_slot, assets.snapshot_export, *topic_specs, *table_assets],
        asset_checks=quality_checks,
        jobs=[jobs.cdc_worker_job, jobs.drop_slot_job, *table_jobs],
        sensors=[
            sensors.build_supervisor(sensor_settings),
            sensors.build_slot_lag_alert(sensor_settings),
            sensors.build_run_failure_alert(sensor_settings),
            *merge_sensors,
        ],
        schedules=schedules.build_schedules(
            merge,
            maintain,
            merge_cron=settings.merge_cron,
            maintenance_cron=settings.maintenance_cron,
            default_status=dg.DefaultScheduleStatus.RUNNING if running else dg.DefaultScheduleStatus.STOPPED,
            # One writer per checkpoint: the schedule is off while the continuous merge runs.
            merge_status=dg.DefaultScheduleStatus.STOPPED if continuous_on else None,
        ),
        resources=build_resources(settings),
    )


@dg.definitions
def defs() -> dg.Definitions:
    settings = load_settings(os.environ)
    discovery = discover_tables(settings.postgres_dsn, settings.publication, settings.topic_prefix)
    if discovery.problem:
        log.warning("bottledwater: %s", discovery.problem)
    else:
        log.info("bottledwater: %d table(s) in publication %s", len(discovery.tables), settings.publication)
    return build_definitions(settings, discovery.tables)
