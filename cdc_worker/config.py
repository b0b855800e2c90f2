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
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Literal

import psycopg2
import psycopg2.extensions

from cdc_worker.core.ack import FailurePolicy
from cdc_worker.core.errors import ConfigurationError
from cdc_worker.core.incremental import DEFAULT_CHUNK_ROWS
from cdc_worker.shell.logs import LogFormat
from cdc_worker.shell.postgres.partitions import PartitionMode
from cdc_worker.shell.stream.progress import IDLE_INTERVAL_S as DEFAULT_IDLE_PROGRESS_INTERVAL_S
from kafka_contract.redaction import normalize_dsn, redact_dsn, redact_settings, redact_text, redact_url

ENV_PREFIX = "BOTTLEDWATER_"
# Bottled Water's defaults, kept so that existing deployments behave the same.
DEFAULT_SLOT = "bottledwater"
DEFAULT_BROKER = "localhost:9092"
DEFAULT_SCHEMA_REGISTRY = "http://localhost:8081"
# A status update at least this often, whatever happens (DESIGN: every 10 s and when asked).
DEFAULT_STATUS_INTERVAL_S = 10.0
# Long enough for a promotion (pg_ctl promote, or a managed service's failover, in tens of seconds).
DEFAULT_RECONNECT_TIMEOUT_S = 60.0
# Two cores, and up to four attempts per task: a bare local[N] never retries a failed task.
DEFAULT_SPARK_MASTER = "local[2,4]"
TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
FALSE_WORDS = frozenset({"", "0", "false", "no", "off"})
# Separators inside one environment variable holding a list: k=v settings may contain commas
# (broker lists, SASL JAAS strings), so they are split on ';' or newlines; table globs on ','.
SETTING_SEPARATOR = re.compile(r"[;\n]")
GLOB_SEPARATOR = ","
# Setting names whose values are secrets, in librdkafka's and the registry client's vocabularies.
# Slot names Postgres accepts: lower-case letters, digits and underscores, at most NAMEDATALEN - 1.
_SLOT_NAME = re.compile(r"[a-z0-9_]{1,63}")
# A fragment of the connection string that libpq quotes back in its parse errors.
_LIBPQ_QUOTE = re.compile(r'"[^"]*"')


class OutputFormat(enum.StrEnum):
    AVRO = "avro"
    JSON = "json"


class ConfigError(ConfigurationError, ValueError):
    """An option value that cannot work; the message names the option and what to give instead."""


OptionKind = Literal["str", "int", "float", "flag", "choice", "settings", "globs", "per_table"]


@dataclass(frozen=True)
class OptionSpec:
    """One option of the worker: documented here once, used by the CLI, the docs and the tests."""

    dest: str
    flags: tuple[str, ...]
    kind: OptionKind
    help: str
    default: object = None
    choices: tuple[str, ...] = ()
    metavar: str | None = None
    secret: bool = False  # its value may hold a password: redacted wherever it is shown

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.dest.upper()


def default_snapshot_workers() -> int:
    return os.cpu_count() or 1


OPTIONS: tuple[OptionSpec, ...] = (
    OptionSpec("postgres", ("-d", "--postgres"), "str", secret=True, metavar="DSN",
               help="Postgres connection string (postgres://user:pass@host:port/dbname or key=value "
                    "form) of the database to capture. Required."),
    OptionSpec("slot", ("-s", "--slot"), "str", default=DEFAULT_SLOT, metavar="NAME",
               help="Logical replication slot name (a-z, 0-9, _). Created on first start; an existing "
                    "slot means resume without a snapshot."),
    OptionSpec("broker", ("-b", "--broker"), "str", default=DEFAULT_BROKER, metavar="HOST:PORT[,...]",
               help="Kafka bootstrap servers."),
    OptionSpec("schema_registry", ("-r", "--schema-registry"), "str", default=DEFAULT_SCHEMA_REGISTRY,
               secret=True, metavar="URL",
               help="Confluent-compatible schema registry URL (Avro output only)."),
    OptionSpec("output_format", ("-f", "--output-format"), "choice", default=OutputFormat.AVRO.value,
               choices=tuple(f.value for f in OutputFormat),
               help="Message format: Avro with registered schemas, or one JSON object per message."),
    OptionSpec("allow_unkeyed", ("-u", "--allow-unkeyed"), "flag", default=False,
               help="Publish tables without a primary key or replica identity index (null keys, deletes "
                    "not published) instead of refusing to start."),
    OptionSpec("topic_prefix", ("-p", "--topic-prefix"), "str", metavar="PREFIX",
               help="Prefix of every topic name: PREFIX.[schema.]table and PREFIX.bottledwater.control."),
    OptionSpec("on_error", ("-e", "--on-error"), "choice", default=FailurePolicy.EXIT.value,
               choices=tuple(p.value for p in FailurePolicy),
               help="On a data or delivery error: 'exit' non-zero without acknowledging past it, or "
                    "'log' it, count it, skip the message and go on."),
    OptionSpec("skip_snapshot", ("-x", "--skip-snapshot"), "flag", default=False,
               help="When creating the slot, stream from its consistent point without publishing the "
                    "tables' existing rows."),
    OptionSpec("kafka_config", ("-C", "--kafka-config"), "settings", secret=True, metavar="KEY=VALUE",
               help="librdkafka producer setting (repeatable; see --config-help), e.g. "
                    "compression.codec=zstd or message.timeout.ms=60000."),
    OptionSpec("topic_config", ("-T", "--topic-config"), "settings", metavar="KEY=VALUE",
               help="Setting of the topics the worker creates (repeatable): partitions=N, "
                    "replication.factor=N, or any Kafka topic config such as retention.ms=..."),
    OptionSpec("tables", ("--tables",), "globs", metavar="GLOB[,GLOB...]",
               help="Tables to capture, as schema.table globs (a glob without a dot matches the table "
                    "name in any schema). Default: every table the role can see."),
    OptionSpec("exclude_tables", ("--exclude-tables",), "globs", metavar="GLOB[,GLOB...]",
               help="Tables to leave out, as schema.table globs; applied after --tables."),
    OptionSpec("columns", ("--columns",), "per_table", metavar="GLOB=COL[,COL...]",
               help="Publish only these columns of the tables the glob matches (repeatable; Postgres 15+; "
                    "the publication's column list): e.g. 'shop.users=id,email'. Key and replica identity "
                    "columns cannot be left out."),
    OptionSpec("exclude_columns", ("--exclude-columns",), "per_table", metavar="GLOB=COL[,COL...]",
               help="Leave these columns of the tables the glob matches out of the publication "
                    "(repeatable; Postgres 15+): e.g. 'shop.users=password_hash,national_id'."),
    OptionSpec("row_filter", ("--row-filter",), "per_table", metavar="GLOB=EXPRESSION",
               help="Publish only the rows of the tables the glob matches for which the SQL expression "
                    "is true (repeatable; Postgres 15+; the publication's WHERE): e.g. "
                    "\"shop.orders=region = 'eu'\". It may use key and replica identity columns only."),
    OptionSpec("partitions", ("--partitions",), "choice", default=PartitionMode.ROOT.value,
               choices=tuple(m.value for m in PartitionMode),
               help="Partitioned tables: 'root' captures each as one table (one topic named for the "
                    "root, keyed by its key; publish_via_partition_root), 'leaf' each leaf partition as "
                    "a table of its own. A slot keeps the mode it was created with."),
    OptionSpec("publication", ("--publication",), "str", metavar="NAME",
               help="Publication the worker creates (or adopts if it owns it) and keeps equal to the "
                    "selected tables. Default: the slot name."),
    OptionSpec("snapshot_workers", ("--snapshot-workers",), "int", default=None, metavar="N",
               help="Parallel connections reading the snapshot. Default: the number of CPU cores."),
    OptionSpec("snapshot_engine", ("--snapshot-engine",), "choice", default="worker",
               choices=("worker", "spark"),
               help="Who reads the first snapshot: the worker's own processes, or a Spark job "
                    "(--spark-master) whose tasks import the slot's exported snapshot, one per ctid range."),
    OptionSpec("spark_master", ("--spark-master",), "str", default=DEFAULT_SPARK_MASTER, metavar="URL",
               help="Spark master of --snapshot-engine spark: local[N,ATTEMPTS], spark://host:port, yarn."),
    OptionSpec("resnapshot_chunk_rows", ("--resnapshot-chunk-rows",), "int", default=DEFAULT_CHUNK_ROWS,
               metavar="N",
               help="Rows read per chunk by a re-snapshot while streaming (bottledwater resnapshot); "
                    "each chunk is held in memory until the stream reaches its high watermark."),
    OptionSpec("capture_ddl", ("--capture-ddl",), "flag", default=False,
               help="Publish the captured tables' DDL (CREATE/ALTER/DROP TABLE) to the control topic as "
                    "ddl events, through an event trigger the worker installs (needs a superuser, or "
                    "rds_superuser; or `bottledwater ddl install` run once by one)."),
    OptionSpec("no_stream_in_progress", ("--no-stream-in-progress",), "flag", default=False,
               help="Do not stream large transactions while they run (Postgres 14+, pgoutput protocol 2): "
                    "take them only at their commit, spilled to disk by the server, as protocol 1 does."),
    OptionSpec("no_generated_columns", ("--no-generated-columns",), "flag", default=False,
               help="On Postgres 18+, leave stored generated columns out of the publication "
                    "(publish_generated_columns = none), as older servers always do; by default they "
                    "are published, snapshotted and streamed like any column."),
    OptionSpec("failover_slot", ("--failover-slot",), "choice", default="auto", choices=("auto", "on", "off"),
               help="Create the slot as a failover slot (Postgres 17+, failover => true), which standbys "
                    "with sync_replication_slots copy, so that after a promotion the worker streams on "
                    "from it (give a multi-host DSN, target_session_attrs=read-write). auto: on when the "
                    "server is 17+ and a standby syncs slots from it; said in one start-up line."),
    OptionSpec("spool_memory_mb", ("--spool-memory-mb",), "int", default=64, metavar="MB",
               help="Memory for transactions streamed while they run, held until their commit; past "
                    "it they go to files under --spool-dir."),
    OptionSpec("spool_dir", ("--spool-dir",), "str", metavar="DIR",
               help="Directory of the streamed transactions' spool files (removed after use and at "
                    "start). Default: bottledwater-spool in the system's temporary directory."),
    OptionSpec("codec", ("--codec",), "choice", default="auto", choices=("auto", "native", "python"),
               help="Row codec: native (Rust, built by the install when cargo is there), python (the "
                    "reference), or auto (native when built, else python, said in one start-up line)."),
    OptionSpec("producer", ("--producer",), "choice", default="auto", choices=("auto", "native", "confluent"),
               help="Kafka producer of the native codec's rows: native (its own librdkafka, whole "
                    "batches produced from Rust; TLS, SASL PLAIN/SCRAM/OAUTHBEARER, zstd; not GSSAPI "
                    "nor OIDC), confluent (confluent-kafka, one call "
                    "per message), or auto (native when it can be built with -C, said in one line)."),
    OptionSpec("metrics_port", ("--metrics-port",), "int", metavar="PORT",
               help="Serve Prometheus metrics on this port (0.0.0.0). Default: no metrics endpoint."),
    OptionSpec("log_format", ("--log-format",), "choice", default=LogFormat.TEXT.value,
               choices=tuple(f.value for f in LogFormat),
               help="Log lines as plain text or as one JSON object per line."),
    OptionSpec("log_level", ("--log-level",), "choice", default="info",
               choices=("debug", "info", "warning", "error"), help="Least severe log level shown."),
    OptionSpec("status_interval", ("--status-interval",), "float", default=DEFAULT_STATUS_INTERVAL_S,
               metavar="SECONDS",
               help="Longest time between two status updates to Postgres (lowered automatically to a "
                    "quarter of the server's wal_sender_timeout)."),
    OptionSpec("idle_progress_interval", ("--idle-progress-interval",), "float",
               default=DEFAULT_IDLE_PROGRESS_INTERVAL_S, metavar="SECONDS",
               help="While Postgres has nothing new, publish the progress event again this often: the "
                    "lake's lag on an idle database stays about this long (docs/lakehouse.md)."),
    OptionSpec("reconnect_timeout", ("--reconnect-timeout",), "float", default=DEFAULT_RECONNECT_TIMEOUT_S,
               metavar="SECONDS",
               help="After losing Postgres while streaming (a restart, a promotion), reconnect for this "
                    "long, one line per attempt, and stream on from the slot; then exit 1. 0: exit at once."),
)  # fmt: skip
OPTIONS_BY_DEST = {spec.dest: spec for spec in OPTIONS}


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
        metrics_port=int(str(port)) if port is not None else None,
        log_format=LogFormat(str(values.get("log_format", LogFormat.TEXT.value))),
        log_level=str(values.get("log_level", "info")),
        status_interval=interval,
        idle_progress_interval=idle_progress,
        reconnect_timeout=reconnect_timeout,
    )
