"""The code location's settings, read from environment variables and checked. Pure: pass the env in.

The worker's own variables (`BOTTLEDWATER_*`) keep the meaning they have for the `bottledwater`
CLI, so one environment configures both; the orchestration's own are `BW_*`. Secrets (the Postgres
DSN, the webhook URL, the PagerDuty routing key, Kafka client settings) reach the resources as
Dagster `EnvVar`s, so the UI shows the variable's name and never its value; `secret_env` says which.

| variable | type, default | what |
| --- | --- | --- |
| BOTTLEDWATER_POSTGRES | DSN, the stack's `postgres` database | source database (secret) |
| BOTTLEDWATER_SLOT | name, `bottledwater` | replication slot |
| BOTTLEDWATER_PUBLICATION | name, same as the slot | publication the Delta assets are discovered from |
| BOTTLEDWATER_TABLES | comma-separated schema.table globs, all | tables the worker selects |
| BOTTLEDWATER_BROKER | host:port list, `localhost:9092` | Kafka bootstrap servers |
| BOTTLEDWATER_SCHEMA_REGISTRY | URL, none | Confluent-compatible registry (Avro) |
| BOTTLEDWATER_OUTPUT_FORMAT | `avro` or `json`, `avro` | message format |
| BOTTLEDWATER_TOPIC_PREFIX | string, none | topic prefix |
| BW_WAREHOUSE | path or URI, `<repo>/.stack/warehouse` | Delta warehouse root |
| BW_CHANGELOG | `on` or `off`, `on` | keep the lake's changelog (merge --changelog / --no-changelog) |
| BW_MIRROR_BUDGET_SECONDS | seconds or `off`, 5 | mirrors merged behind the changelog (--mirror-budget) |
| BW_MIRROR_FEATURES | `default` or `portable`, `default` | features of new mirrors (--mirror-features) |
| BW_ALERT_WEBHOOK_URL | URL, none (log only) | alert webhook (secret) |
| BW_ALERT_WEBHOOK_FORMAT | `slack`, `pagerduty`, `json`; from the URL's host, else `json` | body shape |
| BW_PAGERDUTY_ROUTING_KEY | string, none | Events v2 integration key (secret) |
| BW_SLOT_MAX_RETAINED_WAL | bytes (`512MiB`, `2GB`, `1073741824`), `1GiB` | lag alert threshold |
| BW_SLOT_MAX_LAG_SECONDS | seconds, 300 | lag alert threshold |
| BW_SLOT_INACTIVE_GRACE_SECONDS | seconds, 120 | how long a slot may have no worker |
| BW_ALERT_COOLDOWN_SECONDS | seconds, 3600 | re-send interval of an open incident |
| BW_FRESHNESS_MAX_LAG_SECONDS | seconds, 3600 | freshness check limit of the Delta tables |
| BW_MERGE_CRON | cron, `*/5 * * * *` | merge schedule |
| BW_MERGE_MODE | `continuous` or `scheduled`, `continuous` | the continuous merge, or merge_schedule |
| BW_MAINTENANCE_CRON | cron, `0 3 * * *` | OPTIMIZE/VACUUM schedule |
| BW_SENSOR_INTERVAL_SECONDS | seconds, 30 | tick of the supervisor and lag sensors |
| BW_WORKER_BACKOFF_SECONDS | seconds, 10 | first relaunch delay after a crash (doubles) |
| BW_WORKER_BACKOFF_MAX_SECONDS | seconds, 600 | longest relaunch delay |
| BW_AUTOMATION | `running` or `stopped`, `running` | default state of sensors and schedules |
| BW_DAGSTER_URL | URL, `http://127.0.0.1:3000` | UI address used in alert links |
| BW_RUNBOOK_URL | URL, the rendered docs/orchestration.md on the forge | runbook linked from every page |
| BW_SPARK_MASTER | Spark master URL, `local[2]` | where every orchestrated Spark job runs (--master) |
| BW_SPARK_DRIVER_MEMORY | JVM size (`512m`, `4g`), `1g` | spark.driver.memory (--driver-memory) |
| BW_SPARK_SHUFFLE_PARTITIONS | integer >= 1, 2 | spark.sql.shuffle.partitions (--shuffle-partitions) |
| BW_SPARK_CONF | `k=v`, comma- or newline-separated, none | more Spark settings, read at run time (--conf) |
| BW_SPARK_JARS | comma-separated jars, or `none`; the stack's | spark.jars (--jars) |
| BW_SPARK_PACKAGES | comma-separated group:artifact:version, none | spark.jars.packages (--packages) |
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from orchestration.policy.alerts import WebhookFormat
from orchestration.policy.links import DEFAULT_RUNBOOK_URL
from orchestration.policy.slot_health import LagThresholds
from shared_connections.spark_session import DEFAULT_MASTER, NO_JARS, SPARK_JARS_ENV
from spark_jobs import options
from spark_jobs.option_parser import parse_conf
from spark_jobs.rules import mirror_features as mirror_features_rules
from spark_jobs.rules.mirror_features import MirrorFeatures

PROJECT_ROOT = Path(__file__).resolve().parent.parent
STACK_POSTGRES = "postgresql://postgres@127.0.0.1:55432/postgres"
DEFAULT_SLOT = "bottledwater"
DEFAULT_BROKER = "localhost:9092"
DEFAULT_WAREHOUSE = str(PROJECT_ROOT / ".stack" / "warehouse")
DEFAULT_DAGSTER_URL = "http://127.0.0.1:3000"

_SIZE_UNITS = {
    "": 1,
    "B": 1,
    "KB": 1000,
    "MB": 1000**2,
    "GB": 1000**3,
    "TB": 1000**4,
    "KIB": 1024,
    "MIB": 1024**2,
    "GIB": 1024**3,
    "TIB": 1024**4,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")
_CRON_FIELD_RE = re.compile(r"^[0-9A-Za-z*/,\-?]+$")
_NAME_RE = re.compile(r"^[a-z0-9_]{1,63}$")
# What Spark itself accepts as a master: local[N] or local[N,F] or local[*], standalone (one or more
# host:port, for a master with standby), YARN, Kubernetes, and local-cluster[...] (Spark's own tests).
_MASTER_RE = re.compile(
    r"^(local(\[(\*|\d+)(,\d+)?\])?|local-cluster\[\d+,\d+,\d+\]|spark://[^\s/]+|yarn|k8s://\S+)$"
)
# A JVM memory size as spark.driver.memory takes it (JavaUtils.byteStringAs): no fraction, no space.
_JVM_SIZE_RE = re.compile(r"^\d+(b|[kmgtp]b?)?$", re.IGNORECASE)
_MAVEN_RE = re.compile(r"^[^:\s,]+:[^:\s,]+:[^:\s,]+$")
# Spark settings that have a variable of their own: set twice, the two would disagree silently.
_DEDICATED_CONF = {
    "spark.master": options.SPARK_MASTER_ENV,
    "spark.driver.memory": options.SPARK_DRIVER_MEMORY_ENV,
    "spark.sql.shuffle.partitions": options.SPARK_SHUFFLE_PARTITIONS_ENV,
    "spark.jars": SPARK_JARS_ENV,
    "spark.jars.packages": options.SPARK_PACKAGES_ENV,
}
CRON_FIELDS = 5


class SettingsError(ValueError):
    """A bad environment variable; the message names the variable and the expected form."""


class Automation(enum.StrEnum):
    RUNNING = "running"
    STOPPED = "stopped"


class MergeMode(enum.StrEnum):
    """Which merge the automation runs: `merge_schedule`, or `continuous_merge_supervisor` (one
    writer per checkpoint: never both)."""

    SCHEDULED = "scheduled"
    CONTINUOUS = "continuous"


@dataclass(frozen=True)
class AlertingSettings:
    webhook_url: str | None = None
    webhook_format: WebhookFormat = WebhookFormat.JSON
    pagerduty_routing_key: str | None = None


@dataclass(frozen=True)
class SparkJobSettings:
    """How every orchestrated Spark job gets its session: the `spark` resource's in-process session
    (merge, checks, maintenance, reset) and the continuous merge's own process (as its flags).

    jars: None for the stack's (`.stack/spark-jars`), "" for none (a cluster that has them), else a
        comma-separated list.
    conf: the checked value of BW_SPARK_CONF. The resource reads the variable itself when a session
        starts, as the Kafka resource reads its client settings, since it may hold credentials
        (`spark.hadoop.fs.s3a.secret.key`) that the UI and a process list must not show.
    """

    master: str = DEFAULT_MASTER
    driver_memory: str = "1g"
    shuffle_partitions: int = 2
    jars: str | None = None
    packages: tuple[str, ...] = ()
    conf: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class LocationSettings:
    postgres_dsn: str = STACK_POSTGRES
    slot: str = DEFAULT_SLOT
    publication: str = DEFAULT_SLOT
    tables: tuple[str, ...] = ()
    broker: str = DEFAULT_BROKER
    schema_registry: str | None = None
    output_format: str = "avro"
    topic_prefix: str | None = None
    warehouse: str = DEFAULT_WAREHOUSE
    changelog: bool = False
    mirror_budget_s: float | None = None
    mirror_features: MirrorFeatures = mirror_features_rules.DEFAULT
    alerting: AlertingSettings = field(default_factory=AlertingSettings)
    thresholds: LagThresholds = field(default_factory=LagThresholds)
    freshness_limit_s: float = 3600.0
    merge_cron: str = "*/5 * * * *"
    merge_mode: MergeMode = MergeMode.SCHEDULED
    maintenance_cron: str = "0 3 * * *"
    sensor_interval_s: int = 30
    worker_backoff_s: float = 10.0
    worker_backoff_max_s: float = 600.0
    automation: Automation = Automation.RUNNING
    dagster_url: str = DEFAULT_DAGSTER_URL
    runbook_url: str = DEFAULT_RUNBOOK_URL
    spark: SparkJobSettings = field(default_factory=SparkJobSettings)
    # Variables that were set and hold secrets: the resources read them as EnvVar at run time.
    secret_env: frozenset[str] = frozenset()


def parse_size(text: str, variable: str) -> int:
    """`1073741824`, `512MiB`, `2GB`, `1.5GiB` -> bytes."""
    match = _SIZE_RE.match(text)
    unit = match.group(2).upper() if match else ""
    if not match or unit not in _SIZE_UNITS:
        raise SettingsError(f"{variable}={text!r}: expected a size such as 1073741824, 512MiB or 2GB")
    return int(float(match.group(1)) * _SIZE_UNITS[unit])


def _seconds(env: Mapping[str, str], variable: str, default: float) -> float:
    raw = env.get(variable, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SettingsError(f"{variable}={raw!r}: expected a number of seconds") from None
    if value < 0:
        raise SettingsError(f"{variable}={raw!r}: must not be negative")
    return value


def _cron(env: Mapping[str, str], variable: str, default: str) -> str:
    raw = " ".join(env.get(variable, "").split()) or default
    fields = raw.split(" ")
    if len(fields) != CRON_FIELDS or not all(_CRON_FIELD_RE.match(f) for f in fields):
        raise SettingsError(f"{variable}={raw!r}: expected a 5-field cron expression such as '*/5 * * * *'")
    return raw


def _name(env: Mapping[str, str], variable: str, default: str) -> str:
    raw = env.get(variable, "").strip() or default
    # Slot names are limited by Postgres to lower-case letters, digits and underscores.
    if not _NAME_RE.match(raw):
        raise SettingsError(f"{variable}={raw!r}: expected 1-63 characters of a-z, 0-9 and _")
    return raw


def _url(env: Mapping[str, str], variable: str, default: str) -> str:
    """An absolute http(s) URL: a link in a page must open from a chat or a pager."""
    raw = env.get(variable, "").strip() or default
    parts = urlsplit(raw)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise SettingsError(f"{variable}={raw!r}: expected an absolute http(s) URL such as {default}")
    return raw


def infer_webhook_format(url: str) -> WebhookFormat:
    host = (urlsplit(url).hostname or "").lower()
    if host.endswith("pagerduty.com"):
        return WebhookFormat.PAGERDUTY
    if host == "hooks.slack.com":
        return WebhookFormat.SLACK
    return WebhookFormat.JSON


def _alerting(env: Mapping[str, str]) -> AlertingSettings:
    url = env.get("BW_ALERT_WEBHOOK_URL", "").strip() or None
    routing_key = env.get("BW_PAGERDUTY_ROUTING_KEY", "").strip() or None
    raw_format = env.get("BW_ALERT_WEBHOOK_FORMAT", "").strip().lower()
    if url is not None and urlsplit(url).scheme not in ("http", "https"):
        raise SettingsError("BW_ALERT_WEBHOOK_URL: expected an http(s) URL")
    if raw_format:
        try:
            fmt = WebhookFormat(raw_format)
        except ValueError:
            choices = ", ".join(f.value for f in WebhookFormat)
            raise SettingsError(
                f"BW_ALERT_WEBHOOK_FORMAT={raw_format!r}: expected one of {choices}"
            ) from None
    else:
        fmt = infer_webhook_format(url) if url else WebhookFormat.JSON
    if url and fmt is WebhookFormat.PAGERDUTY and not routing_key:
        raise SettingsError(
            "BW_ALERT_WEBHOOK_FORMAT=pagerduty needs BW_PAGERDUTY_ROUTING_KEY (the Events API v2 "
            "integration key of the PagerDuty service)"
        )
    return AlertingSettings(url, fmt, routing_key)


def _thresholds(env: Mapping[str, str]) -> LagThresholds:
    defaults = LagThresholds()
    raw_size = env.get("BW_SLOT_MAX_RETAINED_WAL", "").strip()
    cooldown = _seconds(env, "BW_ALERT_COOLDOWN_SECONDS", defaults.cooldown_seconds)
    if cooldown <= 0:
        raise SettingsError("BW_ALERT_COOLDOWN_SECONDS: must be positive")
    return LagThresholds(
        max_retained_wal_bytes=(
            parse_size(raw_size, "BW_SLOT_MAX_RETAINED_WAL") if raw_size else defaults.max_retained_wal_bytes
        ),
        max_lag_seconds=_seconds(env, "BW_SLOT_MAX_LAG_SECONDS", defaults.max_lag_seconds),
        inactive_grace_seconds=_seconds(
            env, "BW_SLOT_INACTIVE_GRACE_SECONDS", defaults.inactive_grace_seconds
        ),
        cooldown_seconds=cooldown,
    )


def _spark(env: Mapping[str, str]) -> SparkJobSettings:
    master = env.get(options.SPARK_MASTER_ENV, "").strip() or DEFAULT_MASTER
    if not _MASTER_RE.match(master):
        raise SettingsError(
            f"{options.SPARK_MASTER_ENV}={master!r}: expected a Spark master URL such as local[2], "
            "spark://host:7077, yarn or k8s://https://host:6443"
        )
    memory = env.get(options.SPARK_DRIVER_MEMORY_ENV, "").strip() or "1g"
    if not _JVM_SIZE_RE.match(memory):
        raise SettingsError(
            f"{options.SPARK_DRIVER_MEMORY_ENV}={memory!r}: expected a JVM memory size such as 512m, 1g "
            "or 4g (whole numbers only)"
        )
    raw_partitions = env.get(options.SPARK_SHUFFLE_PARTITIONS_ENV, "").strip() or "2"
    if not raw_partitions.isdigit() or int(raw_partitions) < 1:
        raise SettingsError(
            f"{options.SPARK_SHUFFLE_PARTITIONS_ENV}={raw_partitions!r}: expected a whole number of at "
            "least 1, such as 2 on a laptop or 2-3 times the cluster's cores"
        )
    raw_jars = env.get(SPARK_JARS_ENV, "").strip()
    if raw_jars.lower() == NO_JARS:
        jars: str | None = ""
    else:
        jars = ",".join(j.strip() for j in raw_jars.split(",") if j.strip()) or None
    packages = tuple(p.strip() for p in env.get(options.SPARK_PACKAGES_ENV, "").split(",") if p.strip())
    for package in packages:
        if not _MAVEN_RE.match(package):
            raise SettingsError(
                f"{options.SPARK_PACKAGES_ENV}: {package!r} is not a Maven coordinate: expected "
                "comma-separated group:artifact:version, e.g. io.delta:delta-spark_2.13:4.0.0"
            )
    try:
        conf = parse_conf(env.get(options.SPARK_CONF_ENV, ""))
    except ValueError as exc:
        raise SettingsError(
            f"{options.SPARK_CONF_ENV}: {exc}, comma-separated or one per line, e.g. "
            "spark.executor.memory=2g,spark.cores.max=4"
        ) from None
    for key in conf:
        if key in _DEDICATED_CONF:
            raise SettingsError(
                f"{options.SPARK_CONF_ENV}: {key} has a variable of its own: set {_DEDICATED_CONF[key]} "
                "instead"
            )
        if not key.startswith("spark.") or any(c.isspace() for c in key):
            raise SettingsError(
                f"{options.SPARK_CONF_ENV}: {key!r} is not a Spark setting: expected keys such as "
                "spark.executor.memory (Spark ignores keys outside spark.*)"
            )
    return SparkJobSettings(master, memory, int(raw_partitions), jars, packages, conf)


# A registry URL may carry basic-auth credentials (http://user:secret@host), as the worker assumes.
SECRET_VARIABLES = (
    "BOTTLEDWATER_POSTGRES",
    "BOTTLEDWATER_SCHEMA_REGISTRY",
    "BW_ALERT_WEBHOOK_URL",
    "BW_PAGERDUTY_ROUTING_KEY",
)


def load_settings(env: Mapping[str, str]) -> LocationSettings:
    """Settings from `env` (normally os.environ); raises SettingsError naming the bad variable."""
    slot = _name(env, "BOTTLEDWATER_SLOT", DEFAULT_SLOT)
    output_format = env.get("BOTTLEDWATER_OUTPUT_FORMAT", "").strip().lower() or "avro"
    if output_format not in ("avro", "json"):
        raise SettingsError(f"BOTTLEDWATER_OUTPUT_FORMAT={output_format!r}: expected avro or json")
    registry = env.get("BOTTLEDWATER_SCHEMA_REGISTRY", "").strip() or None
    interval = _seconds(env, "BW_SENSOR_INTERVAL_SECONDS", 30)
    if interval < 1:
        raise SettingsError("BW_SENSOR_INTERVAL_SECONDS: must be at least 1")
    backoff = _seconds(env, "BW_WORKER_BACKOFF_SECONDS", 10.0)
    backoff_max = _seconds(env, "BW_WORKER_BACKOFF_MAX_SECONDS", 600.0)
    if backoff_max < backoff:
        raise SettingsError("BW_WORKER_BACKOFF_MAX_SECONDS must be at least BW_WORKER_BACKOFF_SECONDS")
    raw_automation = env.get("BW_AUTOMATION", "").strip().lower() or Automation.RUNNING.value
    try:
        automation = Automation(raw_automation)
    except ValueError:
        raise SettingsError(f"BW_AUTOMATION={raw_automation!r}: expected running or stopped") from None
    # Continuous by default: the lake then trails the source by about a trigger interval, the
    # freshness the product is for; scheduled runs trade it for a Spark application that is not
    # always up (docs/orchestration.md, "Merge modes").
    raw_mode = env.get("BW_MERGE_MODE", "").strip().lower() or MergeMode.CONTINUOUS.value
    try:
        merge_mode = MergeMode(raw_mode)
    except ValueError:
        raise SettingsError(f"BW_MERGE_MODE={raw_mode!r}: expected scheduled or continuous") from None
    tables = tuple(t.strip() for t in env.get("BOTTLEDWATER_TABLES", "").split(",") if t.strip())
    changelog = env.get("BW_CHANGELOG", "").strip().lower() or "on"
    if changelog not in ("on", "off"):
        raise SettingsError(f"BW_CHANGELOG={changelog!r}: expected on or off")
    raw_budget = env.get("BW_MIRROR_BUDGET_SECONDS", "").strip().lower()
    if raw_budget and changelog != "on":
        raise SettingsError(
            "BW_MIRROR_BUDGET_SECONDS merges the mirrors behind the changelog: set BW_CHANGELOG=on"
        )
    budget: float | None = None
    if changelog == "on" and raw_budget != options.BUDGET_OFF:
        budget = _seconds(env, "BW_MIRROR_BUDGET_SECONDS", options.DEFAULT_MIRROR_BUDGET_S)
    try:
        features = mirror_features_rules.parse(env.get(options.MIRROR_FEATURES_ENV))
    except ValueError as exc:
        raise SettingsError(f"{options.MIRROR_FEATURES_ENV}={exc}") from None
    return LocationSettings(
        postgres_dsn=env.get("BOTTLEDWATER_POSTGRES", "").strip() or STACK_POSTGRES,
        slot=slot,
        publication=_name(env, "BOTTLEDWATER_PUBLICATION", slot),
        tables=tables,
        broker=env.get("BOTTLEDWATER_BROKER", "").strip() or DEFAULT_BROKER,
        schema_registry=registry,
        output_format=output_format,
        topic_prefix=env.get("BOTTLEDWATER_TOPIC_PREFIX", "").strip() or None,
        warehouse=env.get("BW_WAREHOUSE", "").strip() or DEFAULT_WAREHOUSE,
        changelog=changelog == "on",
        mirror_budget_s=budget,
        mirror_features=features or mirror_features_rules.DEFAULT,
        alerting=_alerting(env),
        thresholds=_thresholds(env),
        freshness_limit_s=_seconds(env, "BW_FRESHNESS_MAX_LAG_SECONDS", 3600.0),
        merge_cron=_cron(env, "BW_MERGE_CRON", "*/5 * * * *"),
        merge_mode=merge_mode,
        maintenance_cron=_cron(env, "BW_MAINTENANCE_CRON", "0 3 * * *"),
        sensor_interval_s=int(interval),
        worker_backoff_s=backoff,
        worker_backoff_max_s=backoff_max,
        automation=automation,
        dagster_url=_url(env, "BW_DAGSTER_URL", DEFAULT_DAGSTER_URL).rstrip("/"),
        runbook_url=_url(env, "BW_RUNBOOK_URL", DEFAULT_RUNBOOK_URL).split("#", 1)[0],
        spark=_spark(env),
        secret_env=frozenset(v for v in SECRET_VARIABLES if env.get(v, "").strip()),
    )
