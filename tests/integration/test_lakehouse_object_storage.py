"""The warehouse on object storage: the merge with the lake's changelog, a consistent read through
it, maintenance and the Dagster merge asset, all on `s3a://` against a real S3 API (moto's server on
loopback), with the streaming checkpoints there too; the mirror equals Postgres, and the secret key
shows in no log line (docs/lakehouse.md, "On object storage")."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import pytest
from psycopg2 import sql
from pyspark.sql import SparkSession

from orchestration import assets, jobs
from orchestration.continuous_merge import CONTINUOUS_MERGE_JOB
from orchestration.discovery import CapturedTable
from orchestration.resources.kafka import KafkaResource
from orchestration.resources.postgres import PostgresResource
from orchestration.resources.schema_registry import SchemaRegistryResource
from orchestration.resources.spark import SparkResource
from orchestration.resources.warehouse import DeltaWarehouseResource
from spark_jobs import maintenance, merge
from spark_jobs.lake import changelog, delta_tables
from spark_jobs.reading.consistent import read_consistent
from spark_jobs.rules import layout
from tests.integration.conftest import unique_name
from tests.integration.lakehouse import (
    PROJECT_ROOT,
    LakeCase,
    assert_delta_equals_postgres,
    assert_same_rows,
    execute,
    postgres_frame,
    running_worker,
)
from tests.integration.object_store import ObjectStore, configure, moto_server
from tests.integration.test_lakehouse_changelog_reads import _newest_changelog_lsn

# A progress event of the worker (--status-interval 1) past the changes, for the merge to prove.
PROGRESS_WAIT_S = 2.5
PROVE_ATTEMPTS = 5


@pytest.fixture(scope="session")
def object_store() -> Iterator[ObjectStore]:
    with moto_server() as store:
        yield store


@dataclass
class S3LakeCase(LakeCase):
    """A LakeCase whose warehouse and checkpoints are under `root` (`s3a://bucket/<test>`)."""

    root: str = ""

    @property
    def warehouse(self) -> str:
        return f"{self.root}/warehouse"

    @property
    def checkpoints(self) -> str:
        return f"{self.root}/checkpoints"


@pytest.fixture
def s3_lake(
    *,
    spark: SparkSession,
    object_store: ObjectStore,
    fresh_db: str,
    kafka_bootstrap: str,
    registry_url: str,
    tmp_path: Path,
) -> S3LakeCase:
    configure(spark, object_store)
    test = unique_name("s3")
    return S3LakeCase(spark, fresh_db, kafka_bootstrap, registry_url, tmp_path, root=object_store.url(test))


def _warehouse(lake: S3LakeCase) -> DeltaWarehouseResource:
    return DeltaWarehouseResource(root=lake.warehouse, checkpoint_root=lake.checkpoints, changelog=True)


def _dagster_merge(lake: S3LakeCase, table: str, instance: dg.DagsterInstance) -> dg.ExecuteInProcessResult:
    """The Dagster merge asset (changelog on) with the warehouse resource on s3a."""
    captured = CapturedTable("public", table, ("id",), ("id", "name", "n"), lake.topic(table))
    resources = {
        "spark": SparkResource(),  # getOrCreate: the tier's shared session
        "kafka": KafkaResource(bootstrap_servers=lake.bootstrap, topic_prefix=lake.prefix),
        "schema_registry": SchemaRegistryResource(url=lake.registry),
        "warehouse": _warehouse(lake),
        "postgres": PostgresResource(dsn=lake.dsn, slot=lake.slot),
    }
    return dg.materialize(
        [assets.build_delta_assets([captured], lake.prefix, changelog=True)],
        resources=resources,
        instance=instance,
        raise_on_error=False,
    )


def _merge_until_proven(lake: S3LakeCase, argv: list[str]) -> None:
    """The CLI's merge, run again until the changelog proves every change it holds (a progress event
    of the worker after them)."""
    for _ in range(PROVE_ATTEMPTS):
        time.sleep(PROGRESS_WAIT_S)
        assert merge.main(argv) == 0
        wanted = _newest_changelog_lsn(lake)
        head = changelog.newest(lake.spark, lake.warehouse)
        if head is not None and head.watermark >= wanted:
            return
    raise AssertionError(
        f"the changelog never proved {wanted}: {changelog.newest(lake.spark, lake.warehouse)}"
    )


def _data_files(keys: list[str], table_prefix: str) -> set[str]:
    """The table's Parquet files among the bucket's keys (its log and deletion vectors left out)."""
    return {
        k for k in keys if k.startswith(table_prefix) and "/_delta_log/" not in k and k.endswith(".parquet")
    }


def test_merge_with_the_changelog_reads_and_maintenance_on_s3_equal_postgres_and_log_no_secret(
    s3_lake: S3LakeCase,
    object_store: ObjectStore,
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    request: pytest.FixtureRequest,
) -> None:
    lake = s3_lake
    table = unique_name("people")
    t = sql.Identifier(table)
    execute(
        lake.dsn,
        sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, name text, n int)").format(t),
        sql.SQL("INSERT INTO {} SELECT g, 'person ' || g, g FROM generate_series(1, 20) g").format(t),
    )
    caplog.set_level(logging.DEBUG, logger="spark_jobs")
    secret = object_store.secret_key
    # The secret as a user would pass it on the command line (the environment is the better way, see
    # the docs): it reaches the session through the shared --conf option, and must be printed nowhere.
    conf = ["--conf", f"spark.hadoop.fs.s3a.bucket.{object_store.bucket}.secret.key={secret}"]
    common = [
        "-b", lake.bootstrap, "-r", lake.registry, "-p", lake.prefix, "-t", lake.topic(table),
        "--warehouse", lake.warehouse, "--checkpoints", lake.checkpoints, "--changelog", *conf,
    ]  # fmt: skip
    instance = dg.DagsterInstance.ephemeral()
    try:
        with running_worker(lake, fmt="avro", tables=f"public.{table}", partitions=1) as worker:
            worker.wait_caught_up()
            # The snapshot, merged by Dagster's asset with the warehouse resource on s3a.
            result = _dagster_merge(lake, table, instance)
            assert result.success, [e.message for e in result.all_events if e.is_failure]
            materialized = {
                e.asset_key.to_user_string(): e.step_materialization_data.materialization.metadata
                for e in result.get_asset_materialization_events()
                if e.asset_key is not None
            }
            assert set(materialized) == {f"delta/public/{table}", "delta/changelog"}
            assert str(materialized[f"delta/public/{table}"]["path"].value).startswith("s3a://")
            dagster_lines = [str(r.user_message) for r in instance.all_logs(result.run_id)]
            assert_delta_equals_postgres(lake.spark, lake.path(table), lake.dsn, table)
            snapshot_version = delta_tables.newest_version(lake.spark, lake.path(table))

            execute(
                lake.dsn,
                sql.SQL("UPDATE {} SET name = 'renamed', n = n * 10 WHERE id <= 5").format(t),
                sql.SQL("DELETE FROM {} WHERE id IN (6, 7)").format(t),
                sql.SQL("INSERT INTO {} VALUES (100, 'late', 100)").format(t),
            )
            worker.wait_caught_up()
            # The CLI's merge with no mirror budget: the changes wait in the changelog, the mirror
            # stays at the snapshot, and a read through the changelog is its mirror plus its tail.
            _merge_until_proven(lake, [*common, "--mirror-budget", "0", "--no-catch-up"])
        assert delta_tables.newest_version(lake.spark, lake.path(table)) == snapshot_version
        name = f"public.{table}"
        read = read_consistent(lake.spark, lake.warehouse, [name])
        assert read.changelog_version is not None and read.tables[name].tail_after is not None, read
        frame = read.frame(name).drop(*layout.META_COLUMNS)
        assert_same_rows(frame, postgres_frame(lake.spark, lake.dsn, table, frame))

        # The mirror caught up from the changelog (the run's end merges what waits), then maintained:
        # OPTIMIZE, deletion vectors purged, VACUUM with no retention.
        assert merge.main([*common, "--mirror-budget", "0"]) == 0
        assert_delta_equals_postgres(lake.spark, lake.path(table), lake.dsn, table)
        # Dagster's maintenance refuses while a continuous merge runs (nothing runs here: a run of its
        # job in progress is what the refusal looks for): on S3 a table takes one writer at a time.
        instance.add_run(
            dg.DagsterRun(job_name=CONTINUOUS_MERGE_JOB, run_id="merging", status=dg.DagsterRunStatus.STARTED)
        )
        refused = jobs.maintenance_job([dg.AssetKey(["delta", "public", table])]).execute_in_process(
            resources={"spark": SparkResource(), "warehouse": _warehouse(lake)},
            instance=instance,
            raise_on_error=False,
        )
        failure = refused.get_step_failure_events()[0].step_failure_data.error
        assert failure is not None and "while the continuous merge runs (run merging)" in failure.message
        dagster_lines += [str(r.user_message) for r in instance.all_logs(refused.run_id)]
        # The mirror only (--table): the changelog's maintenance is the same calls on another table.
        argv = ["--warehouse", lake.warehouse, "--table", name, "--vacuum-hours", "0", "--force", *conf]
        assert maintenance.main(argv) == 0
        printed = capfd.readouterr()
        mirror_line = next(
            line for line in printed.out.splitlines() if line.startswith(lake.path(table) + ":")
        )
        assert "optimized (0 files" not in mirror_line, mirror_line
        assert_delta_equals_postgres(lake.spark, lake.path(table), lake.dsn, table)

        # What S3 itself holds: the mirror, the changelog and the checkpoints, and after VACUUM only
        # the mirror's current files.
        test_prefix = lake.root.removeprefix(object_store.url()).strip("/")
        keys = object_store.keys(test_prefix + "/")
        mirror_prefix = f"{test_prefix}/warehouse/public/{table}/"
        assert any(k.startswith(mirror_prefix + "_delta_log/") for k in keys)
        assert any(k.startswith(f"{test_prefix}/warehouse/_bw_state/changelog/_delta_log/") for k in keys)
        assert any(k.startswith(f"{test_prefix}/checkpoints/") for k in keys)
        current = lake.spark.read.format("delta").load(lake.path(table)).inputFiles()
        assert _data_files(keys, mirror_prefix) == {f.split("://", 1)[1].split("/", 1)[1] for f in current}
        # Nothing took an s3a URI for a local path.
        assert not (PROJECT_ROOT / "s3a:").exists()
    finally:
        instance.dispose()

    # The JVM's own output (Spark's and Hadoop's log lines) went to the file pytest captures the
    # session's output in when the JVM started, not to capfd's.
    capture = request.config.pluginmanager.getplugin("capturemanager")
    jvm = capture.read_global_capture() if capture is not None and capture.is_globally_capturing() else None
    jvm_output = [jvm.out, jvm.err] if jvm is not None else []
    logged = "\n".join([printed.out, printed.err, caplog.text, *dagster_lines, *jvm_output])
    assert secret not in logged
