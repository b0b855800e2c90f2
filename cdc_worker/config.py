"""The worker's options: one table of every flag (its type, default and environment variable), the
frozen `WorkerConfig` they produce, and the redaction that keeps passwords out of logs.

Every option is declared once, in `OPTIONS`; the CLI builds its parser from that table, the docs
list it, and a unit test checks that `--help` shows every flag and variable. Precedence is the usual
one: a flag on the command line, else its `BOTTLEDWATER_*` environment variable, else the default.
For the repeatable options (`-C`, `-T`, `--tables`, `--exclude-tables`) the command line replaces the
environment variable as a whole rather than adding to it, so what runs is what one place says.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields

import psycopg2
import psycopg2.extensions

from cdc_worker.core.ack import FailurePolicy
from cdc_worker.core.errors import ConfigurationError
from cdc_worker.core.incremental import DEFAULT_CHUNK_ROWS
from cdc_worker.options import (
    DEFAULT_BROKER,
    DEFAULT_IDLE_PROGRESS_INTERVAL_S,
    DEFAULT_RECONNECT_TIMEOUT_S,
    DEFAULT_SCHEMA_REGISTRY,
    DEFAULT_SLOT,
    DEFAULT_SPARK_MASTER,
    DEFAULT_STATUS_INTERVAL_S,
    MAX_STREAMED_PRODUCERS,
    OPTIONS,
    OptionSpec,
    OutputFormat,
    default_snapshot_workers,
)
from cdc_worker.shell.logs import LogFormat
from cdc_worker.shell.postgres.partitions import PartitionMode
from kafka_contract.redaction import normalize_dsn, redact_dsn, redact_settings, redact_text, redact_url

TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
FALSE_WORDS = frozenset({"", "0", "false", "no", "off"})
# Separators inside one environment variable holding a list: k=v settings may contain commas
# (broker lists, SASL JAAS strings), so they are split on ';' or newlines; table globs on ','.
SETTING_SEPARATOR = re.compile(r"[;\n]")
GLOB_SEPARATOR = ","
# Slot names Postgres accepts: lower-case letters, digits and underscores, at most NAMEDATALEN - 1.
_SLOT_NAME = re.compile(r"[a-z0-9_]{1,63}")
# A fragment of the connection string that libpq quotes back in its parse errors.
_LIBPQ_QUOTE = re.compile(r'"[^"]*"')


class ConfigError(ConfigurationError, ValueError):
    """An option value that cannot work; the message names the option and what to give instead."""


@dataclass(frozen=True)
class WorkerConfig:
    """Everything the worker needs, validated. Build it with `config_from_values`."""

    postgres: str
    slot: str = DEFAULT_SLOT
    broker: str = DEFAULT_BROKER
    schema_registry: str = DEFAULT_SCHEMA_REGISTRY
    output_format: OutputFormat = OutputFormat.AVRO
    allow_unkeyed: bool = False
    topic_prefix: str | None = None
    on_error: FailurePolicy = FailurePolicy.EXIT
    skip_snapshot: bool = False
    kafka_config: Mapping[str, str] = field(default_factory=dict)
    topic_config: Mapping[str, str] = field(default_factory=dict)
    tables: tuple[str, ...] = ()
    exclude_tables: tuple[str, ...] = ()
    partitions: PartitionMode = PartitionMode.ROOT
    # Per table glob, in the order given (`subsets`): the last entry matching a table wins.
    columns: tuple[tuple[str, str], ...] = ()
    exclude_columns: tuple[tuple[str, str], ...] = ()
    row_filter: tuple[tuple[str, str], ...] = ()
    publication: str | None = None
    snapshot_workers: int = field(default_factory=default_snapshot_workers)
    snapshot_engine: str = "worker"
    spark_master: str = DEFAULT_SPARK_MASTER
    resnapshot_chunk_rows: int = DEFAULT_CHUNK_ROWS
    capture_ddl: bool = False
    no_stream_in_progress: bool = False
    no_generated_columns: bool = False
    failover_slot: str = "auto"
    spool_memory_mb: int = 64
    spool_dir: str | None = None
    codec: str = "auto"
    producer: str = "auto"
    delivery: str = "at-least-once"
    streamed_producers: int = 2
    metrics_port: int | None = None
    log_format: LogFormat = LogFormat.TEXT
    log_level: str = "info"
    status_interval: float = DEFAULT_STATUS_INTERVAL_S
    idle_progress_interval: float = DEFAULT_IDLE_PROGRESS_INTERVAL_S
    reconnect_timeout: float = DEFAULT_RECONNECT_TIMEOUT_S

    @property
    def publication_name(self) -> str:
        return self.publication or self.slot

    def describe(self) -> dict[str, object]:
        """The configuration as it may be logged: every secret redacted, values as plain data."""
        described: dict[str, object] = {}
        for item in fields(self):
            value = getattr(self, item.name)
            if isinstance(value, enum.Enum):
                value = value.value
            elif isinstance(value, tuple):
                value = [f"{v[0]}={v[1]}" if isinstance(v, tuple) else v for v in value]
            elif isinstance(value, Mapping):
                value = dict(value)
            described[item.name] = value
        described["postgres"] = redact_dsn(self.postgres)
        described["schema_registry"] = redact_url(self.schema_registry)
        described["kafka_config"] = redact_settings(self.kafka_config)
        described["publication"] = self.publication_name
        return described


def parse_settings(entries: Sequence[str], option: str) -> dict[str, str]:
    """`["a=1", "b=x=y"]` -> `{"a": "1", "b": "x=y"}`; the last of two equal keys wins."""
    settings: dict[str, str] = {}
    for entry in entries:
        key, sep, value = entry.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{option}: {entry!r} is not KEY=VALUE (e.g. {option} compression.codec=zstd)")
        settings[key.strip()] = value.strip()
    return settings


def parse_per_table(entries: Sequence[str], option: str) -> tuple[tuple[str, str], ...]:
    """`["shop.*=id,name"]` -> `(("shop.*", "id,name"),)`: a table glob, '=', then the value (which
    may hold '=' and ',', as a row filter does)."""
    parsed = []
    for entry in entries:
        glob, sep, value = entry.partition("=")
        if not sep or not glob.strip() or not value.strip():
            raise ConfigError(f"{option}: {entry!r} is not GLOB=VALUE (e.g. {option} 'shop.users=...')")
        parsed.append((glob.strip(), value.strip()))
    return tuple(parsed)


def split_globs(entries: Sequence[str]) -> tuple[str, ...]:
    """Repeated and comma-separated globs, flattened, empty ones dropped."""
    return tuple(g.strip() for entry in entries for g in entry.split(GLOB_SEPARATOR) if g.strip())


def env_value(spec: OptionSpec, environ: Mapping[str, str]) -> object:
    """The value the environment gives `spec`, or None when its variable is unset."""
    raw = environ.get(spec.env)
    if raw is None:
        return None
    if spec.kind == "flag":
        word = raw.strip().lower()
        if word in TRUE_WORDS:
            return True
        if word in FALSE_WORDS:
            return False
        raise ConfigError(f"{spec.env}={raw!r}: use one of {sorted(TRUE_WORDS | FALSE_WORDS - {''})}")
    if spec.kind in ("settings", "per_table"):
        return [part for part in SETTING_SEPARATOR.split(raw) if part.strip()]
    if spec.kind == "globs":
        return [raw]
    return raw


def _convert(spec: OptionSpec, value: object) -> object:
    where = f"{spec.flags[-1]} (or {spec.env})"
    if spec.kind == "int":
        try:
            return int(str(value))
        except ValueError:
            raise ConfigError(f"{where}: {value!r} is not an integer") from None
    if spec.kind == "float":
        try:
            return float(str(value))
        except ValueError:
            raise ConfigError(f"{where}: {value!r} is not a number") from None
    if spec.kind == "choice" and value not in spec.choices:
        raise ConfigError(f"{where}: {value!r} is not one of {', '.join(spec.choices)}")
    if spec.kind == "settings":
        return parse_settings(_strings(value), spec.flags[0])
    if spec.kind == "globs":
        return split_globs(_strings(value))
    if spec.kind == "per_table":
        return parse_per_table(_strings(value), spec.flags[0])
    return value


def _given(value: object) -> bool:
    """Whether argparse saw the option: its defaults are None, False (flags) and [] (lists)."""
    return value is not None and value is not False and value != []


def resolve_values(cli_values: Mapping[str, object], environ: Mapping[str, str]) -> dict[str, object]:
    """Per option: the command line's value if given, else the environment's, else the default;
    converted to its type. Options without any value are left out (the dataclass default)."""
    resolved: dict[str, object] = {}
    for spec in OPTIONS:
        value = cli_values.get(spec.dest)
        if not _given(value):
            value = env_value(spec, environ)
        if value is None:
            value = spec.default
        if value is None:
            continue
        resolved[spec.dest] = _convert(spec, value)
    return resolved


def _strings(value: object) -> tuple[str, ...]:
    return tuple(str(v) for v in value) if isinstance(value, list | tuple) else ()


def _pairs(value: object) -> tuple[tuple[str, str], ...]:
    return tuple((str(g), str(v)) for g, v in value) if isinstance(value, tuple) else ()


def _settings(value: object) -> dict[str, str]:
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, Mapping) else {}


def _hide_quote(match: re.Match[str]) -> str:
    return match.group(0) if match.group(0) == '"="' else '"…"'  # the "=" it says is missing stays


def checked_dsn(dsn: str) -> str:
    """The DSN as the worker will use it (`normalize_dsn`), refused here when libpq cannot parse
    it: libpq's own error quotes the string back, password included, and would otherwise surface
    as a traceback from the first connection."""
    normalized = normalize_dsn(dsn)
    try:
        psycopg2.extensions.parse_dsn(normalized)
    except psycopg2.ProgrammingError as exc:
        # Neither the string nor libpq's quotes of it are shown: a malformed string cannot be
        # trusted to be redacted (`user:pass word@host` puts half the password in the quote).
        why = _LIBPQ_QUOTE.sub(_hide_quote, " ".join(str(exc).split()))
        raise ConfigError(
            f"-d/--postgres (or BOTTLEDWATER_POSTGRES) is not a connection string libpq can read "
            f"({redact_text(why)}): give postgresql://user:password@host:port/dbname or key=value "
            "pairs such as 'host=... port=... dbname=... user=...'"
        ) from None
    return normalized


def config_from_values(values: Mapping[str, object]) -> WorkerConfig:
    """Validate resolved option values into a `WorkerConfig`."""
    postgres = values.get("postgres")
    if not postgres:
        raise ConfigError("no database given: pass -d/--postgres DSN or set BOTTLEDWATER_POSTGRES")
    dsn = checked_dsn(str(postgres))
    slot = str(values.get("slot", DEFAULT_SLOT))
    if not _SLOT_NAME.fullmatch(slot):
        raise ConfigError(f"--slot {slot!r}: slot names are 1-63 characters of a-z, 0-9 and _")
    publication = values.get("publication")
    workers = values.get("snapshot_workers")
    if workers is not None and int(str(workers)) < 1:
        raise ConfigError(f"--snapshot-workers {workers}: give at least 1")
    chunk_rows = int(str(values.get("resnapshot_chunk_rows", DEFAULT_CHUNK_ROWS)))
    if chunk_rows < 1:
        raise ConfigError(f"--resnapshot-chunk-rows {chunk_rows}: give at least 1")
    port = values.get("metrics_port")
    if port is not None and not 0 <= int(str(port)) <= 65535:
        raise ConfigError(f"--metrics-port {port}: give a TCP port, 1-65535 (0 picks a free one)")
    interval = float(str(values.get("status_interval", DEFAULT_STATUS_INTERVAL_S)))
    if interval <= 0:
        raise ConfigError(f"--status-interval {interval}: give a positive number of seconds")
    idle_progress = float(str(values.get("idle_progress_interval", DEFAULT_IDLE_PROGRESS_INTERVAL_S)))
    if idle_progress <= 0:
        raise ConfigError(f"--idle-progress-interval {idle_progress}: give a positive number of seconds")
    reconnect_timeout = float(str(values.get("reconnect_timeout", DEFAULT_RECONNECT_TIMEOUT_S)))
    if reconnect_timeout < 0:
        raise ConfigError(f"--reconnect-timeout {reconnect_timeout}: give 0 or more seconds")
    spool_memory_mb = int(str(values.get("spool_memory_mb", 64)))
    if spool_memory_mb < 1:
        raise ConfigError(
            f"--spool-memory-mb {spool_memory_mb}: give at least 1 (the memory streamed transactions "
            "may use before they go to files under --spool-dir)"
        )
    streamed_producers = int(str(values.get("streamed_producers", 2)))
    if not 0 <= streamed_producers <= MAX_STREAMED_PRODUCERS:
        raise ConfigError(
            f"--streamed-producers {streamed_producers}: give 0 to {MAX_STREAMED_PRODUCERS} (large "
            "transactions produced while they run at once; each takes a producer and its memory)"
        )
    if values.get("snapshot_engine") == "spark" and values.get("delivery") == "exactly-once":
        raise ConfigError(
            "--snapshot-engine spark publishes outside Kafka transactions: under --delivery exactly-once "
            "leave --snapshot-engine at worker (each table one transaction), or use --delivery at-least-once"
        )
    topic_config = _settings(values.get("topic_config"))
    for numeric in ("partitions", "replication.factor"):
        if numeric in topic_config and not topic_config[numeric].lstrip("-").isdigit():
            raise ConfigError(f"-T {numeric}={topic_config[numeric]!r}: give an integer")
    return WorkerConfig(
        postgres=dsn,
        slot=slot,
        broker=str(values.get("broker", DEFAULT_BROKER)),
        schema_registry=str(values.get("schema_registry", DEFAULT_SCHEMA_REGISTRY)),
        output_format=OutputFormat(str(values.get("output_format", OutputFormat.AVRO.value))),
        allow_unkeyed=bool(values.get("allow_unkeyed", False)),
        topic_prefix=str(values["topic_prefix"]) if values.get("topic_prefix") else None,
        on_error=FailurePolicy(str(values.get("on_error", FailurePolicy.EXIT.value))),
        skip_snapshot=bool(values.get("skip_snapshot", False)),
        kafka_config=_settings(values.get("kafka_config")),
        topic_config=topic_config,
        tables=_strings(values.get("tables", ())),
        exclude_tables=_strings(values.get("exclude_tables", ())),
        partitions=PartitionMode(str(values.get("partitions", PartitionMode.ROOT.value))),
        columns=_pairs(values.get("columns")),
        exclude_columns=_pairs(values.get("exclude_columns")),
        row_filter=_pairs(values.get("row_filter")),
        publication=str(publication) if publication else None,
        snapshot_workers=int(str(workers)) if workers is not None else default_snapshot_workers(),
        snapshot_engine=str(values.get("snapshot_engine", "worker")),
        spark_master=str(values.get("spark_master", DEFAULT_SPARK_MASTER)),
        resnapshot_chunk_rows=chunk_rows,
        capture_ddl=bool(values.get("capture_ddl", False)),
        no_stream_in_progress=bool(values.get("no_stream_in_progress", False)),
        no_generated_columns=bool(values.get("no_generated_columns", False)),
        failover_slot=str(values.get("failover_slot", "auto")),
        spool_memory_mb=spool_memory_mb,
        spool_dir=str(values["spool_dir"]) if values.get("spool_dir") else None,
        codec=str(values.get("codec", "auto")),
        producer=str(values.get("producer", "auto")),
        delivery=str(values.get("delivery", "at-least-once")),
        streamed_producers=streamed_producers,
        metrics_port=int(str(port)) if port is not None else None,
        log_format=LogFormat(str(values.get("log_format", LogFormat.TEXT.value))),
        log_level=str(values.get("log_level", "info")),
        status_interval=interval,
        idle_progress_interval=idle_progress,
        reconnect_timeout=reconnect_timeout,
    )
