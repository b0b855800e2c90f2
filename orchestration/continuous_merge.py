"""The continuous merge: `spark_jobs.merge --continuous` as a long-running Dagster run, kept alive by a
supervisor sensor the way the CDC worker is.

The merge runs in a child process (its own JVM), so terminating the run stops it with SIGTERM, at a
micro-batch boundary, and a run process that dies takes it along (`die_with_parent`). Each of its
batches commits to Delta with the batch's txnAppId/txnVersion, so a relaunch resumes from the
checkpoints exactly where the commits left off. It replaces the scheduled `merge` job for the
tables it covers: one writer per checkpoint, so `merge_schedule` is off while
`continuous_merge_supervisor` is on (BW_MERGE_MODE, docs/orchestration.md), and a Materialize of a
Delta asset refuses while a run of it is in progress (`one_writer`).

What it commits reaches Dagster as materializations of the changelog and of each mirror: the merge
logs a `commit_report` line (at most one per asset per window) and the op turns each entry into an
AssetMaterialization of this run, with the Delta version, the position and the lag as metadata.
The sensor also observes each Delta asset's last commit from the table's Delta log.
"""

# No `from __future__ import annotations`: Dagster reads the config and resource types of the op's
# parameters at definition time, as in jobs.py.
import json
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dagster as dg
from pydantic import Field

from cdc_worker.core.lsn import format_lsn
from orchestration import one_writer
from orchestration.assets import delta_keys, table_location
from orchestration.changelog_asset import CHANGELOG_ASSET
from orchestration.discovery import CapturedTable
from orchestration.jobs import NEEDS_PERSON_TAG, TAG_VALUE_MAX
from orchestration.policy.supervision import backoff_seconds
from orchestration.resources import (
    DeltaWarehouseResource,
    KafkaResource,
    PostgresResource,
    SchemaRegistryResource,
    SparkResource,
)
from orchestration.worker_process import LogLevel, WorkerLine, die_with_parent, last_error, run_worker
from spark_jobs import options
from spark_jobs.connections import dsn
from spark_jobs.errors import EXIT_CONFIGURATION, EXIT_DATA
from spark_jobs.merging import commit_report
from spark_jobs.options import KAFKA_OPTIONS_ENV, SPARK_CONF_ENV
from spark_jobs.rules import layout

CONTINUOUS_MERGE_JOB = one_writer.CONTINUOUS_MERGE_JOB
RECENT_RUNS = 20
TAIL_LINES = 200
ACTIVE = frozenset(one_writer.IN_PROGRESS)
# A run that lasted this long was healthy: the failures before it no longer lengthen the backoff.
HEALTHY_AFTER_S = 600.0
# A configuration the merge cannot start with, or data it cannot go on with (spark_jobs.errors).
NEEDS_PERSON_EXITS = frozenset({EXIT_CONFIGURATION, EXIT_DATA})
BACKOFF_BASE_S = 10.0
BACKOFF_MAX_S = 600.0


class ContinuousMergeConfig(dg.Config):
    topics: list[str] = Field(
        default_factory=list, description="Table topics to merge (default: all the pipeline's)."
    )
    trigger_interval: float = Field(
        default=options.DEFAULT_TRIGGER_INTERVAL_S, description="Seconds between micro-batches."
    )


def merge_command(
    topics: Sequence[str],
    trigger_interval: float,
    *,
    kafka: KafkaResource,
    warehouse: DeltaWarehouseResource,
    spark: SparkResource,
) -> list[str]:
    """`python -m spark_jobs.merge --continuous ...` with this interpreter and the `spark` resource's
    settings as the shared Spark flags; the registry, the Postgres DSN and the resource's
    environment Spark settings (BW_SPARK_CONF) come through the environment (`merge_environment`),
    so none shows in a process list."""
    command = [
        sys.executable, "-m", "spark_jobs.merge", "--continuous", "--trigger-interval", str(trigger_interval),
        "-b", kafka.bootstrap_servers, "-f", kafka.message_format,
        "--warehouse", warehouse.root, "--checkpoints", warehouse.checkpoints(),
        "--master", spark.master, "--driver-memory", spark.driver_memory,
        "--shuffle-partitions", str(spark.shuffle_partitions),
    ]  # fmt: skip
    if spark.jars is not None:  # else the merge's own default: the stack's jars, as the resource's
        command += ["--jars", spark.jars]
    # Always given, even empty: an inherited BW_SPARK_PACKAGES must not add to the resource's.
    command += ["--packages", spark.packages]
    for key, value in spark.spark_config.items():
        command += ["--conf", f"{key}={value}"]
    if kafka.topic_prefix:
        command += ["-p", kafka.topic_prefix]
    if warehouse.changelog:
        budget = options.BUDGET_OFF if warehouse.mirror_budget_s is None else str(warehouse.mirror_budget_s)
        command += ["--changelog", "--mirror-budget", budget]
    else:
        command.append("--no-changelog")
    command += ["--mirror-features", warehouse.features()]
    for topic in topics:
        command += ["--topic", topic]
    return die_with_parent(command)


def merge_environment(
    schema_registry_url: str | None,
    postgres_dsn: str | None,
    kafka_options: Mapping[str, str] | None = None,
    spark_conf: str = "",
) -> dict[str, str]:
    """The merge's secrets-bearing settings, as environment variables of its process: the registry,
    the DSN, the Kafka source options (SASL's JAAS line among them) and the Spark settings the
    `spark` resource reads from its environment (object store keys among them)."""
    env = {"BOTTLEDWATER_SCHEMA_REGISTRY": schema_registry_url or ""}
    if postgres_dsn:
        env[dsn.MERGE_DSN_ENV] = postgres_dsn
    if kafka_options:
        env[KAFKA_OPTIONS_ENV] = "\n".join(f"{k}={v}" for k, v in kafka_options.items())
    # Always set, even empty: the merge's Spark settings are the resource's, not what the run
    # process happens to inherit.
    env[SPARK_CONF_ENV] = spark_conf
    return env


def materializations(
    entries: Sequence[Mapping[str, Any]], known: frozenset[dg.AssetKey]
) -> list[dg.AssetMaterialization]:
    """A `commit_report` line's entries as materializations of the assets this location defines (a
    table that joined the merge by its topic pattern has no asset here)."""
    reported = []
    for entry in entries:
        key = dg.AssetKey(["delta", *(str(part) for part in entry["asset"])])
        if key not in known:
            continue
        watermark, proven = entry.get("watermark"), entry.get("proven_at_us")
        metadata: dict[str, Any] = {
            "merged_by": CONTINUOUS_MERGE_JOB,
            "batch": entry.get("batch"),
            "version": entry.get("version"),
            "position": None if watermark is None else format_lsn(int(watermark)),
            "proven_at": None if proven is None else dg.MetadataValue.timestamp(int(proven) / 1e6),
            "lag_s": entry.get("lag_s"),
        }
        if key != CHANGELOG_ASSET:
            # Summed over the report's window; 0: only the position moved (an idle table).
            metadata["changes_merged"] = entry.get("changes")
            metadata["commits"] = entry.get("commits")
        reported.append(
            dg.AssetMaterialization(
                asset_key=key, metadata={k: v for k, v in metadata.items() if v is not None}
            )
        )
    return reported


def reported_keys(topics: Sequence[str], topic_prefix: str | None, changelog: bool) -> frozenset[dg.AssetKey]:
    """The assets the continuous merge of `topics` reports: their mirrors, and the changelog."""
    locations = [layout.location_for_topic(t, topic_prefix) for t in topics]
    keys = {dg.AssetKey(["delta", loc.schema, loc.table]) for loc in locations}
    return frozenset(keys | ({CHANGELOG_ASSET} if changelog else set()))


def build_continuous_merge_job(topics: Sequence[str]) -> dg.JobDefinition:
    @dg.op(description="Runs spark_jobs.merge --continuous until it stops; its log lines become events.")
    def run_continuous_merge(  # noqa: PLR0917 - Dagster passes resources by parameter name
        context: dg.OpExecutionContext,
        config: ContinuousMergeConfig,
        kafka: KafkaResource,
        schema_registry: SchemaRegistryResource,
        warehouse: DeltaWarehouseResource,
        spark: SparkResource,
        postgres: PostgresResource,
    ) -> None:
        tail: list[WorkerLine] = []
        selected = config.topics or list(topics)
        known = reported_keys(selected, kafka.topic_prefix, warehouse.changelog)

        def forward(line: WorkerLine) -> None:
            entries = commit_report.parse(line.text)
            if entries is not None:
                for event in materializations(entries, known):
                    context.log_event(event)
                return
            tail.append(line)
            del tail[:-TAIL_LINES]
            (context.log.error if line.level is LogLevel.ERROR else context.log.info)(line.text)

        command = merge_command(
            selected,
            config.trigger_interval,
            kafka=kafka,
            warehouse=warehouse,
            spark=spark,
        )
        # JSON messages carry no types: the merge reads them from the Postgres catalog.
        env = merge_environment(
            schema_registry.url,
            postgres.dsn if kafka.message_format == "json" else None,
            kafka.spark_options(),
            spark.env_conf_text(),
        )
        code = run_worker(command, env, forward, lambda pid: context.log.info(f"continuous merge pid {pid}"))
        if code in NEEDS_PERSON_EXITS:
            # Started again as it is, the merge fails the same way: the supervisor must not relaunch.
            reason = last_error(tail)
            context.instance.add_run_tags(context.run_id, {NEEDS_PERSON_TAG: reason[:TAG_VALUE_MAX]})
            raise dg.Failure(
                description=f"the continuous merge exited with status {code} and needs a person: "
                f"{reason}; fix that, then launch the continuous_merge job",
                metadata={"last_lines": dg.MetadataValue.text("\n".join(t.text for t in tail[-50:]))},
            )
        if code != 0:
            raise dg.Failure(
                description=f"the continuous merge exited with status {code}: {last_error(tail)}; "
                "continuous_merge_supervisor relaunches it after a backoff",
                metadata={"last_lines": dg.MetadataValue.text("\n".join(t.text for t in tail[-50:]))},
            )

    @dg.job(
        name=CONTINUOUS_MERGE_JOB,
        description="Merges the changelogs into Delta continuously (a micro-batch every 10 s by "
        "default) until terminated. Kept alive by continuous_merge_supervisor; replaces merge_schedule.",
        executor_def=dg.in_process_executor,
    )
    def continuous_merge_job() -> None:
        run_continuous_merge()

    return continuous_merge_job


@dataclass(frozen=True)
class MergeRun:
    run_id: str
    active: bool
    failed: bool
    started_at: float | None
    ended_at: float | None
    # The merge's own one-line reason when it exited 2 or 3 (needs a person); None otherwise.
    needs_person: str | None = None


def next_launch(runs: Sequence[MergeRun], now: float) -> tuple[bool, str]:
    """(launch?, why) from the job's runs, newest first: none active, the newest did not stop for a
    person, and the backoff after the consecutive failures (those before a run that lasted
    HEALTHY_AFTER_S do not count) has passed."""
    if any(r.active for r in runs):
        return False, "a continuous merge run is active"
    if runs and runs[0].failed and runs[0].needs_person is not None:
        return False, (
            f"run {runs[0].run_id} stopped and needs a person: {runs[0].needs_person}; fix that, "
            "then launch the continuous_merge job"
        )
    failures = 0
    for run in runs:
        lasted = (run.ended_at or now) - (run.started_at or run.ended_at or now)
        if not run.failed or lasted >= HEALTHY_AFTER_S:
            break
        failures += 1
    if failures and runs[0].ended_at is not None:
        wait = backoff_seconds(failures, BACKOFF_BASE_S, BACKOFF_MAX_S)
        if now - runs[0].ended_at < wait:
            return False, f"{failures} failure(s) in a row: relaunch after {wait:.0f} s"
    return True, "no continuous merge run: launching one"


def delta_locations(
    tables: Sequence[CapturedTable], topic_prefix: str | None
) -> dict[dg.AssetKey, tuple[str, str]]:
    """Each Delta asset's (schema, table), as the merge names its path."""
    locations = {key: table_location(t, topic_prefix) for key, t in delta_keys(tables, topic_prefix).items()}
    return {key: (loc.schema, loc.table) for key, loc in locations.items()}


def last_commit(table_path: str) -> dict[str, Any] | None:
    """The newest commit of a local Delta table, read from its log (no Spark in a sensor); None when
    the table is not on a local file system or has no commit yet."""
    log = Path(table_path.removeprefix("file:")) / "_delta_log"
    if not log.is_dir():
        return None
    commits = sorted(log.glob("*.json"))
    if not commits:
        return None
    for line in commits[-1].read_text().splitlines():
        entry = json.loads(line)
        if "commitInfo" in entry:
            at = entry["commitInfo"].get("timestamp", 0) / 1000
            return {
                "last_commit": dg.MetadataValue.timestamp(at),
                "last_commit_age_s": round(time.time() - at, 1),
            }
    return None


def build_continuous_merge_supervisor(
    job: dg.JobDefinition,
    delta_assets: Mapping[dg.AssetKey, tuple[str, str]],
    interval_s: int,
    *,
    default_status: dg.DefaultSensorStatus = dg.DefaultSensorStatus.STOPPED,
) -> dg.SensorDefinition:
    """`delta_assets`: each Delta asset's (schema, table) as the merge names its path;
    `default_status`: on with `BW_MERGE_MODE=continuous` (docs/orchestration.md)."""

    @dg.sensor(
        name="continuous_merge_supervisor",
        job=job,
        minimum_interval_seconds=interval_s,
        default_status=default_status,
        description="Keeps one continuous_merge run alive (launches one when there is none, relaunches "
        "a failed one with exponential backoff) and observes each Delta table's last commit.",
    )
    def continuous_merge_supervisor(
        context: dg.SensorEvaluationContext, warehouse: DeltaWarehouseResource
    ) -> dg.SensorResult:
        records = context.instance.get_run_records(
            filters=dg.RunsFilter(job_name=CONTINUOUS_MERGE_JOB), limit=RECENT_RUNS
        )
        runs = [
            MergeRun(
                r.dagster_run.run_id,
                r.dagster_run.status in ACTIVE,
                r.dagster_run.status is dg.DagsterRunStatus.FAILURE,
                r.start_time,
                r.end_time,
                r.dagster_run.tags.get(NEEDS_PERSON_TAG),
            )
            for r in records
        ]
        launch, why = next_launch(runs, time.time())
        context.log.info(why)
        requests = [dg.RunRequest(run_key=f"after-{runs[0].run_id}" if runs else None)] if launch else []
        observations = []
        for key, (schema, table) in delta_assets.items():
            commit = last_commit(warehouse.table_path(schema, table))
            if commit is not None:
                observations.append(dg.AssetObservation(asset_key=key, metadata=commit))
        return dg.SensorResult(
            run_requests=requests, asset_events=observations, skip_reason=None if requests else why
        )

    return continuous_merge_supervisor
