"""The worker's options as a table: every flag once, with its kind, default, help and environment
variable (`OPTIONS`), and the defaults they start from. The CLI builds its parser from it, the docs
list it and the Dagster worker config reads its variables; `cdc_worker.config` turns the values into
a validated `WorkerConfig`."""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass
from typing import Literal

from cdc_worker.core.ack import FailurePolicy
from cdc_worker.core.incremental import DEFAULT_CHUNK_ROWS
from cdc_worker.shell.logs import LogFormat
from cdc_worker.shell.postgres.partitions import PartitionMode
from cdc_worker.shell.stream.progress import IDLE_INTERVAL_S

ENV_PREFIX = "BOTTLEDWATER_"
# Bottled Water's defaults, kept so that existing deployments behave the same.
DEFAULT_SLOT = "bottledwater"
DEFAULT_BROKER = "localhost:9092"
DEFAULT_SCHEMA_REGISTRY = "http://localhost:8081"
# A status update at least this often, whatever happens (and whenever the server asks for one).
DEFAULT_STATUS_INTERVAL_S = 10.0
# Long enough for a promotion (pg_ctl promote, or a managed service's failover, in tens of seconds).
DEFAULT_RECONNECT_TIMEOUT_S = 60.0
# Large transactions produced while they run at once, at most (each a librdkafka producer).
MAX_STREAMED_PRODUCERS = 16
# Two cores, and up to four attempts per task: a bare local[N] never retries a failed task.
DEFAULT_SPARK_MASTER = "local[2,4]"
# How often the worker repeats an unchanged progress event while Postgres has nothing new.
DEFAULT_IDLE_PROGRESS_INTERVAL_S = IDLE_INTERVAL_S


class OutputFormat(enum.StrEnum):
    AVRO = "avro"
    JSON = "json"


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
    OptionSpec("delivery", ("--delivery",), "choice", default="at-least-once",
               choices=("at-least-once", "exactly-once"),
               help="at-least-once (idempotent producer; a restart may publish a transaction again) or "
                    "exactly-once (a transactional producer whose transactional.id is the slot's: "
                    "read_committed consumers see each change once; needs a broker with "
                    "transactions). See docs/worker.md, Delivery guarantees."),
    OptionSpec("streamed_producers", ("--streamed-producers",), "int", default=2, metavar="N",
               help="Under --delivery exactly-once with the native producer: how many large "
                    "transactions at once are produced into Kafka while they run (streamed by "
                    "Postgres), each in a Kafka transaction of its own that its commit commits, so "
                    "that it is visible moments after it; one more, or 0 here, is published at its "
                    "commit from the spool. See docs/worker.md, Large transactions."),
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
