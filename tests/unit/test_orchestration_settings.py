"""The code location's settings: defaults, parsing, and a clear error per bad variable."""

from __future__ import annotations

import pytest

from orchestration.definitions import build_resources
from orchestration.policy.alerts import WebhookFormat
from orchestration.resources import SparkResource
from orchestration.settings import (
    STACK_POSTGRES,
    Automation,
    SettingsError,
    infer_webhook_format,
    load_settings,
    parse_size,
)


def test_defaults_point_at_the_stack_and_alert_in_the_log_only() -> None:
    settings = load_settings({})
    assert settings.postgres_dsn == STACK_POSTGRES
    assert (settings.slot, settings.publication) == ("bottledwater", "bottledwater")
    assert settings.alerting.webhook_url is None
    assert settings.merge_cron == "*/5 * * * *" and settings.maintenance_cron == "0 3 * * *"
    assert settings.automation is Automation.RUNNING
    assert settings.secret_env == frozenset()
    # The changelog by default, its mirrors merged behind it in 5 s rounds.
    assert settings.changelog and settings.mirror_budget_s == 5.0
    assert load_settings({"BW_MIRROR_BUDGET_SECONDS": "2"}).mirror_budget_s == 2.0
    assert load_settings({"BW_MIRROR_BUDGET_SECONDS": "off"}).mirror_budget_s is None
    off = load_settings({"BW_CHANGELOG": "off"})
    assert not off.changelog and off.mirror_budget_s is None
    with pytest.raises(SettingsError, match="set BW_CHANGELOG=on"):
        load_settings({"BW_CHANGELOG": "off", "BW_MIRROR_BUDGET_SECONDS": "5"})
    with pytest.raises(SettingsError, match="BW_MIRROR_BUDGET_SECONDS='soon': expected a number"):
        load_settings({"BW_MIRROR_BUDGET_SECONDS": "soon"})


def test_variables_are_read_and_secrets_are_remembered_by_name() -> None:
    settings = load_settings(
        {
            "BOTTLEDWATER_POSTGRES": "postgresql://u:pw@db/app",
            "BOTTLEDWATER_SLOT": "orders_slot",
            "BOTTLEDWATER_TABLES": "public.orders, inventory.*",
            "BOTTLEDWATER_OUTPUT_FORMAT": "JSON",
            "BW_MERGE_CRON": "*/10  * * * *",
            "BW_SLOT_MAX_RETAINED_WAL": "512MiB",
            "BW_SLOT_MAX_LAG_SECONDS": "90",
            "BW_ALERT_WEBHOOK_URL": "https://hooks.slack.com/services/T/B/X",
            "BW_AUTOMATION": "stopped",
        }
    )
    assert settings.publication == "orders_slot"  # follows the slot unless set
    assert settings.tables == ("public.orders", "inventory.*")
    assert settings.output_format == "json"
    assert settings.merge_cron == "*/10 * * * *"
    assert settings.thresholds.max_retained_wal_bytes == 512 * 1024**2
    assert settings.thresholds.max_lag_seconds == 90
    assert settings.alerting.webhook_format is WebhookFormat.SLACK
    assert settings.automation is Automation.STOPPED
    assert settings.secret_env == {"BOTTLEDWATER_POSTGRES", "BW_ALERT_WEBHOOK_URL"}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1073741824", 1024**3),
        ("1GiB", 1024**3),
        ("2GB", 2 * 1000**3),
        ("1.5 MiB", 1572864),
        ("10kb", 10_000),
    ],
)
def test_sizes(text: str, expected: int) -> None:
    assert parse_size(text, "X") == expected


@pytest.mark.parametrize(
    ("env", "variable"),
    [
        ({"BW_SLOT_MAX_RETAINED_WAL": "lots"}, "BW_SLOT_MAX_RETAINED_WAL"),
        ({"BW_SLOT_MAX_LAG_SECONDS": "-1"}, "BW_SLOT_MAX_LAG_SECONDS"),
        ({"BW_MERGE_CRON": "every five minutes"}, "BW_MERGE_CRON"),
        ({"BW_MAINTENANCE_CRON": "0 3 * *"}, "BW_MAINTENANCE_CRON"),
        ({"BOTTLEDWATER_SLOT": "Bad-Slot"}, "BOTTLEDWATER_SLOT"),
        ({"BOTTLEDWATER_OUTPUT_FORMAT": "xml"}, "BOTTLEDWATER_OUTPUT_FORMAT"),
        ({"BW_ALERT_WEBHOOK_FORMAT": "teams"}, "BW_ALERT_WEBHOOK_FORMAT"),
        ({"BW_ALERT_WEBHOOK_URL": "ftp://x"}, "BW_ALERT_WEBHOOK_URL"),
        ({"BW_ALERT_WEBHOOK_URL": "https://events.pagerduty.com/v2/enqueue"}, "BW_PAGERDUTY_ROUTING_KEY"),
        ({"BW_ALERT_COOLDOWN_SECONDS": "0"}, "BW_ALERT_COOLDOWN_SECONDS"),
        (
            {"BW_WORKER_BACKOFF_SECONDS": "60", "BW_WORKER_BACKOFF_MAX_SECONDS": "5"},
            "BW_WORKER_BACKOFF_MAX_SECONDS",
        ),
        ({"BW_AUTOMATION": "sometimes"}, "BW_AUTOMATION"),
        ({"BW_SENSOR_INTERVAL_SECONDS": "0"}, "BW_SENSOR_INTERVAL_SECONDS"),
        ({"BW_CHANGELOG": "yes please"}, "BW_CHANGELOG"),
    ],
)
def test_a_bad_variable_is_named_in_the_error(env: dict[str, str], variable: str) -> None:
    with pytest.raises(SettingsError, match=variable):
        load_settings(env)


def test_the_webhook_format_follows_the_url_unless_set() -> None:
    assert infer_webhook_format("https://events.pagerduty.com/v2/enqueue") is WebhookFormat.PAGERDUTY
    assert infer_webhook_format("https://hooks.slack.com/services/a") is WebhookFormat.SLACK
    assert infer_webhook_format("http://127.0.0.1:9999/hook") is WebhookFormat.JSON
    pd = load_settings(
        {"BW_ALERT_WEBHOOK_URL": "https://events.pagerduty.com/v2/enqueue", "BW_PAGERDUTY_ROUTING_KEY": "abc"}
    )
    assert (
        pd.alerting.webhook_format is WebhookFormat.PAGERDUTY and pd.alerting.pagerduty_routing_key == "abc"
    )
    forced = load_settings(
        {"BW_ALERT_WEBHOOK_URL": "https://hooks.slack.com/x", "BW_ALERT_WEBHOOK_FORMAT": "json"}
    )
    assert forced.alerting.webhook_format is WebhookFormat.JSON


def test_links_are_absolute_urls_and_the_runbook_defaults_to_the_rendered_docs() -> None:
    settings = load_settings({"BW_DAGSTER_URL": "http://127.0.0.1:3123/"})
    assert settings.dagster_url == "http://127.0.0.1:3123"
    assert settings.runbook_url.startswith("https://") and settings.runbook_url.endswith(
        "docs/orchestration.md"
    )
    custom = load_settings({"BW_RUNBOOK_URL": "https://wiki.example/bw/runbook#old"})
    assert custom.runbook_url == "https://wiki.example/bw/runbook"
    with pytest.raises(SettingsError, match="BW_RUNBOOK_URL='docs/orchestration.md': expected an absolute"):
        load_settings({"BW_RUNBOOK_URL": "docs/orchestration.md"})


def test_spark_runs_locally_unless_told_otherwise() -> None:
    spark = load_settings({}).spark
    assert (spark.master, spark.driver_memory, spark.shuffle_partitions) == ("local[2]", "1g", 2)
    assert (spark.jars, spark.packages, dict(spark.conf)) == (None, (), {})


def test_the_spark_variables_are_read() -> None:
    spark = load_settings(
        {
            "BW_SPARK_MASTER": " spark://m1:7077,m2:7077 ",
            "BW_SPARK_DRIVER_MEMORY": "4G",
            "BW_SPARK_SHUFFLE_PARTITIONS": "48",
            "BW_SPARK_CONF": "spark.executor.memory=2g, spark.cores.max=8,",
            "BW_SPARK_JARS": "/opt/a.jar, /opt/b.jar",
            "BW_SPARK_PACKAGES": "io.delta:delta-spark_2.13:4.0.0,org.apache.spark:spark-avro_2.13:4.0.0",
        }
    ).spark
    assert (spark.master, spark.driver_memory, spark.shuffle_partitions) == (
        "spark://m1:7077,m2:7077",
        "4G",
        48,
    )
    assert dict(spark.conf) == {"spark.executor.memory": "2g", "spark.cores.max": "8"}
    assert spark.jars == "/opt/a.jar,/opt/b.jar"
    assert spark.packages == ("io.delta:delta-spark_2.13:4.0.0", "org.apache.spark:spark-avro_2.13:4.0.0")
    for master in ("local", "local[*]", "local[4,2]", "yarn", "k8s://https://api:6443"):
        assert load_settings({"BW_SPARK_MASTER": master}).spark.master == master


def test_spark_conf_is_one_per_line_when_a_value_holds_a_comma() -> None:
    conf = load_settings(
        {"BW_SPARK_CONF": "spark.executor.extraJavaOptions=-Da=1,-Db=2\nspark.cores.max=4\n"}
    ).spark.conf
    assert dict(conf) == {"spark.executor.extraJavaOptions": "-Da=1,-Db=2", "spark.cores.max": "4"}


def test_no_jars_for_a_cluster_that_has_its_own() -> None:
    assert load_settings({"BW_SPARK_JARS": "none"}).spark.jars == ""
    assert load_settings({"BW_SPARK_JARS": " "}).spark.jars is None  # the stack's


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        (
            {"BW_SPARK_MASTER": "spark:/m:7077"},
            "BW_SPARK_MASTER='spark:/m:7077': expected a Spark master URL",
        ),
        ({"BW_SPARK_MASTER": "local[two]"}, "BW_SPARK_MASTER="),
        ({"BW_SPARK_DRIVER_MEMORY": "1.5g"}, "BW_SPARK_DRIVER_MEMORY='1.5g': expected a JVM memory size"),
        ({"BW_SPARK_DRIVER_MEMORY": "lots"}, "BW_SPARK_DRIVER_MEMORY="),
        ({"BW_SPARK_SHUFFLE_PARTITIONS": "0"}, "BW_SPARK_SHUFFLE_PARTITIONS='0': expected a whole number"),
        ({"BW_SPARK_SHUFFLE_PARTITIONS": "2.5"}, "BW_SPARK_SHUFFLE_PARTITIONS="),
        ({"BW_SPARK_CONF": "spark.cores.max"}, "BW_SPARK_CONF: 'spark.cores.max': expected KEY=VALUE"),
        ({"BW_SPARK_CONF": "executor.memory=2g"}, "BW_SPARK_CONF: 'executor.memory' is not a Spark setting"),
        (
            {"BW_SPARK_CONF": "spark.master=yarn"},
            "spark.master has a variable of its own: set BW_SPARK_MASTER",
        ),
        ({"BW_SPARK_CONF": "spark.jars=/a.jar"}, "set BW_SPARK_JARS instead"),
        ({"BW_SPARK_PACKAGES": "delta-spark"}, "BW_SPARK_PACKAGES: 'delta-spark' is not a Maven coordinate"),
    ],
)
def test_a_bad_spark_variable_is_one_line_naming_it_and_the_fix(env: dict[str, str], expected: str) -> None:
    with pytest.raises(SettingsError) as raised:
        load_settings(env)
    message = str(raised.value)
    assert expected in message and "\n" not in message


def test_the_spark_resource_is_built_from_the_settings_and_reads_its_conf_at_run_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    env = {
        "BW_SPARK_MASTER": "spark://m:7077",
        "BW_SPARK_DRIVER_MEMORY": "2g",
        "BW_SPARK_SHUFFLE_PARTITIONS": "16",
        "BW_SPARK_JARS": "none",
        "BW_SPARK_PACKAGES": "io.delta:delta-spark_2.13:4.0.0",
        "BW_SPARK_CONF": "spark.hadoop.fs.s3a.secret.key=s3cret,spark.cores.max=4",
    }
    resource = build_resources(load_settings(env))["spark"]
    assert isinstance(resource, SparkResource)
    # The conf may hold credentials: the resource's config, which the UI shows, does not have it.
    assert "s3cret" not in repr(resource.model_dump())
    monkeypatch.setenv("BW_SPARK_CONF", env["BW_SPARK_CONF"])
    settings = resource.settings()
    assert (settings.master, settings.driver_memory, settings.shuffle_partitions) == (
        "spark://m:7077",
        "2g",
        16,
    )
    assert (settings.jars, settings.packages) == ([], ["io.delta:delta-spark_2.13:4.0.0"])
    conf = settings.conf()
    assert conf["spark.hadoop.fs.s3a.secret.key"] == "s3cret" and conf["spark.cores.max"] == "4"
    assert conf["spark.sql.shuffle.partitions"] == "16" and "spark.jars" not in conf
    assert conf["spark.jars.packages"] == "io.delta:delta-spark_2.13:4.0.0"
    assert "spark.pyspark.python" not in conf  # the cluster's interpreter unless the conf names one
