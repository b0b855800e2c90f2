"""Every option of the Spark jobs, in one table: flag, environment variable, type, default, doc and
the jobs that take it (merge, maintenance, quality, verify, rebuild, consistent_read).

The CLIs are built from it (`option_parser.build_parser`), so each option is documented once, reads the same
environment variable as the worker (`bw-stack env` exports them, so one environment serves the
worker and the jobs), and `tests/unit/test_spark_jobs_options.py` holds the table against
docs/lakehouse.md. Environment defaults are read when a parser is built, never at import.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from shared_connections.spark_session import DEFAULT_MASTER
from spark_jobs.connections import dsn

Job = Literal["merge", "maintenance", "quality", "verify", "rebuild", "consistent_read"]
ALL_JOBS: frozenset[Job] = frozenset(
    {"merge", "maintenance", "quality", "verify", "rebuild", "consistent_read"}
)
OptionKind = Literal["str", "int", "float", "flag", "switch", "list"]

DEFAULT_VACUUM_HOURS = 168.0
DEFAULT_TOMBSTONE_HOURS = 168.0
DEFAULT_CHANGELOG_DAYS = 7.0
DEFAULT_MIRROR_MAX_LAG_S = 300.0
# The mirrors' budget when the changelog is kept and none is given: a batch spends its time on the
# changelog's one commit (the lake's position) and the mirrors follow in 5 s rounds between batches,
# so that the lake's position keeps the trigger's pace whatever the number of tables.
DEFAULT_MIRROR_BUDGET_S = 5.0
# `--mirror-budget off`: every mirror merged in every batch, behind the changelog's commit.
BUDGET_OFF = "off"
DEFAULT_MAX_LAG_S = 3600.0
DEFAULT_SHOWN_KEYS = 20
# How long verify waits for the keys that differ to agree once the lake reaches the source's position.
DEFAULT_SETTLE_S = 60.0
DEFAULT_TRIGGER_INTERVAL_S = 10.0
# Kept here (not imported from merge_query) so that the options table imports no Spark job.
DEFAULT_MERGE_THREADS = 2


@dataclass(frozen=True)
class JobOption:
    """One option of one or more Spark jobs. `required_for`: jobs that fail without it (an
    environment variable that is set counts as given)."""

    dest: str
    flags: tuple[str, ...]
    kind: OptionKind
    help: str
    jobs: frozenset[Job]
    default: object = None
    env: str | None = None
    choices: tuple[str, ...] = ()
    required_for: frozenset[Job] = frozenset()
    metavar: str | None = None
    group: str = "job"


def _jobs(*names: Job) -> frozenset[Job]:
    return frozenset(names)


_REBUILD = _jobs("rebuild")


# One KEY=VALUE per line: a JAAS line ends with ';', so ';' cannot separate them.
KAFKA_OPTIONS_ENV = "BOTTLEDWATER_MERGE_KAFKA_OPTIONS"
# The shared Spark options' variables, the Dagster code location's too (orchestration/settings.py),
# so that one environment sends every Spark job, orchestrated or not, to the same cluster.
SPARK_MASTER_ENV = "BW_SPARK_MASTER"
SPARK_DRIVER_MEMORY_ENV = "BW_SPARK_DRIVER_MEMORY"
SPARK_SHUFFLE_PARTITIONS_ENV = "BW_SPARK_SHUFFLE_PARTITIONS"
SPARK_PACKAGES_ENV = "BW_SPARK_PACKAGES"
# KEY=VALUE entries, comma-separated, or one per line when a value holds a comma.
SPARK_CONF_ENV = "BW_SPARK_CONF"
# The Dagster code location reads it too (orchestration/settings.py).
MIRROR_FEATURES_ENV = "BW_MIRROR_FEATURES"

OPTIONS: tuple[JobOption, ...] = (
    JobOption(
        "broker",
        ("-b", "--broker"),
        "str",
        "Kafka bootstrap servers, host:port[,...]",
        _jobs("merge"),
        env="BOTTLEDWATER_BROKER",
        required_for=_jobs("merge"),
    ),
    JobOption(
        "warehouse",
        ("--warehouse",),
        "str",
        "root of the Delta tables: <warehouse>/<schema>/<table>",
        ALL_JOBS,
        required_for=ALL_JOBS,
    ),
    JobOption(
        "checkpoints",
        ("--checkpoints",),
        "str",
        "root of the streaming checkpoint (<checkpoints>/_bw_merge; per-table ones are migrated from)",
        _jobs("merge"),
        required_for=_jobs("merge"),
    ),
    JobOption(
        "topic", ("-t", "--topic"), "list", "a table topic to merge; repeatable", _jobs("merge"), default=()
    ),
    JobOption(
        "topic_pattern",
        ("--topic-pattern",),
        "str",
        "regular expression (full match) selecting table topics",
        _jobs("merge"),
    ),
    JobOption(
        "output_format",
        ("-f", "--output-format"),
        "str",
        "the worker's message format",
        _jobs("merge"),
        default="avro",
        env="BOTTLEDWATER_OUTPUT_FORMAT",
        choices=("avro", "json"),
    ),
    JobOption(
        "schema_registry",
        ("-r", "--schema-registry"),
        "str",
        "schema registry URL (required for avro)",
        _jobs("merge"),
        env="BOTTLEDWATER_SCHEMA_REGISTRY",
    ),
    JobOption(
        "topic_prefix",
        ("-p", "--topic-prefix"),
        "str",
        "the worker's --topic-prefix",
        _jobs("merge"),
        env="BOTTLEDWATER_TOPIC_PREFIX",
    ),
    # The changelog's readers decode its records as the merge that wrote them, which the changelog
    # records (never a credential): these override it.
    JobOption(
        "output_format",
        ("-f", "--output-format"),
        "str",
        "the worker's message format (default: as the warehouse's changelog records it)",
        _jobs("rebuild", "consistent_read"),
        env="BOTTLEDWATER_OUTPUT_FORMAT",
        choices=("avro", "json"),
    ),
    JobOption(
        "schema_registry",
        ("-r", "--schema-registry"),
        "str",
        "schema registry URL, with its credentials if it needs them (default: the registry the "
        "warehouse's changelog records)",
        _jobs("rebuild", "consistent_read"),
        env="BOTTLEDWATER_SCHEMA_REGISTRY",
    ),
    JobOption(
        "topic_prefix",
        ("-p", "--topic-prefix"),
        "str",
        "the worker's --topic-prefix (default: as the warehouse's changelog records it)",
        _jobs("rebuild", "consistent_read"),
        env="BOTTLEDWATER_TOPIC_PREFIX",
    ),
    JobOption(
        "postgres_types",
        ("-d", "--postgres"),
        "str",
        "Postgres DSN, only to type JSON columns from the catalog (default: types from the Delta "
        "table, else inferred); shows in the process list: prefer the environment or --postgres-file",
        _jobs("merge", "rebuild"),
        env=dsn.MERGE_DSN_ENV,
        metavar="DSN",
    ),
    JobOption(
        "postgres_file",
        ("--postgres-file",),
        "str",
        "file whose first line is the Postgres DSN of -d (kept out of the process list)",
        _jobs("merge", "rebuild"),
        metavar="FILE",
    ),
    JobOption(
        "postgres",
        ("-d", "--postgres"),
        "str",
        "Postgres DSN of the source database, for drift and reconciliation (skipped without it)",
        _jobs("quality"),
        env="BOTTLEDWATER_POSTGRES",
        metavar="DSN",
    ),
    JobOption(
        "postgres",
        ("-d", "--postgres"),
        "str",
        "Postgres DSN of the source database, whose tables the mirrors are compared with",
        _jobs("verify"),
        env="BOTTLEDWATER_POSTGRES",
        required_for=_jobs("verify"),
        metavar="DSN",
    ),
    JobOption(
        "history",
        ("--history",),
        "flag",
        "also maintain the SCD type 2 table <table>__history",
        _jobs("merge", "rebuild"),
        default=False,
    ),
    JobOption(
        "changelog",
        ("--changelog",),
        "switch",
        "first append each micro-batch's records to the lake's changelog, one commit for all tables "
        "(--no-changelog: each mirror merged from Kafka alone, and no read fresher than the mirrors)",
        _jobs("merge"),
        default=True,
    ),
    JobOption(
        "mirror_features",
        ("--mirror-features",),
        "str",
        "Delta table features of the tables created from now on: default (column mapping and "
        "deletion vectors, reader 3 / writer 7) or portable (neither: every Delta reader, delta-rs "
        "included; MERGEs copy the files they touch); an existing table keeps its own (default: "
        "default; rebuild: as the replaced mirror)",
        _jobs("merge", "rebuild"),
        env=MIRROR_FEATURES_ENV,
        choices=("default", "portable"),
    ),
    JobOption(
        "mirror_budget",
        ("--mirror-budget",),
        "str",
        "with the changelog: merge the mirrors off the batches, in rounds that spend S seconds "
        f"starting mirrors' merges from the changelog, none while a batch runs (default "
        f"{DEFAULT_MIRROR_BUDGET_S:g}; {BUDGET_OFF}: every mirror in every batch)",
        _jobs("merge"),
        metavar="S",
    ),
    JobOption(
        "mirror_max_lag",
        ("--mirror-max-lag",),
        "float",
        "with --mirror-budget: a mirror waiting this long is merged whatever the budget",
        _jobs("merge"),
        default=DEFAULT_MIRROR_MAX_LAG_S,
        metavar="S",
    ),
    JobOption(
        "no_catch_up",
        ("--no-catch-up",),
        "flag",
        "with --mirror-budget, a run without --continuous leaves behind the mirrors the budget did "
        "not reach (default: it merges them before it ends)",
        _jobs("merge"),
        default=False,
    ),
    JobOption(
        "max_offsets_per_trigger",
        ("--max-offsets-per-trigger",),
        "int",
        "cap on messages per micro-batch (default: all available in one batch)",
        _jobs("merge"),
    ),
    JobOption(
        "continuous",
        ("--continuous",),
        "flag",
        "keep merging: one long-running query for every table, a micro-batch every --trigger-interval "
        "(default: merge what is available now and stop)",
        _jobs("merge"),
        default=False,
    ),
    JobOption(
        "trigger_interval",
        ("--trigger-interval",),
        "float",
        "seconds between the micro-batches of --continuous",
        _jobs("merge"),
        default=DEFAULT_TRIGGER_INTERVAL_S,
    ),
    JobOption(
        "merge_threads",
        ("--merge-threads",),
        "int",
        "tables of a micro-batch merged at once",
        _jobs("merge"),
        default=DEFAULT_MERGE_THREADS,
    ),
    JobOption(
        "allow_data_loss",
        ("--allow-data-loss",),
        "flag",
        "do not fail when retention deleted offsets the checkpoint expects",
        _jobs("merge"),
        default=False,
    ),
    JobOption(
        "kafka_option",
        ("--kafka-option",),
        "list",
        "extra Spark Kafka source option, e.g. kafka.security.protocol=SSL; repeatable; the "
        "environment variable holds more, one KEY=VALUE per line (for secrets such as "
        "kafka.sasl.jaas.config, which the process list would show); kafka.fetch.max.wait.ms is 10 "
        "unless set here",
        _jobs("merge"),
        default=(),
        env=KAFKA_OPTIONS_ENV,
        metavar="KEY=VALUE",
    ),
    JobOption(
        "table",
        ("--table",),
        "list",
        "only this schema.table (safe names); repeatable (default: all)",
        _jobs("maintenance", "verify"),
        default=(),
    ),
    JobOption("table", ("--table",), "list", "schema.table to rebuild", _REBUILD, required_for=_REBUILD),
    JobOption(
        "table",
        ("--table",),
        "list",
        "schema.table (safe names) to check; repeatable",
        _jobs("quality"),
        default=(),
        required_for=_jobs("quality"),
    ),
    JobOption(
        "no_zorder",
        ("--no-zorder",),
        "flag",
        "compact without Z-ordering by the key",
        _jobs("maintenance"),
        default=False,
    ),
    JobOption(
        "vacuum_hours",
        ("--vacuum-hours",),
        "float",
        "VACUUM retention in hours",
        _jobs("maintenance"),
        default=DEFAULT_VACUUM_HOURS,
    ),
    JobOption(
        "enable_deletion_vectors",
        ("--enable-deletion-vectors",),
        "flag",
        "turn deletion vectors on for tables created without them (Delta protocol reader 3 / writer 7)",
        _jobs("maintenance"),
        default=False,
    ),
    JobOption(
        "changelog_days",
        ("--changelog-days",),
        "float",
        "days the changelog keeps a batch's rows (never a parked table's; without --table only)",
        _jobs("maintenance"),
        default=DEFAULT_CHANGELOG_DAYS,
    ),
    JobOption("no_vacuum", ("--no-vacuum",), "flag", "skip VACUUM", _jobs("maintenance"), default=False),
    JobOption(
        "force",
        ("--force",),
        "flag",
        "allow a VACUUM retention under 168 hours",
        _jobs("maintenance"),
        default=False,
    ),
    JobOption(
        "tombstone_hours",
        ("--tombstone-hours",),
        "float",
        "keep deleted keys' tombstones this long",
        _jobs("maintenance"),
        default=DEFAULT_TOMBSTONE_HOURS,
    ),
    JobOption(
        "max_lag",
        ("--max-lag",),
        "float",
        "freshness limit in seconds",
        _jobs("quality"),
        default=DEFAULT_MAX_LAG_S,
    ),
    JobOption(
        "show",
        ("--show",),
        "int",
        "keys (rows, of a table without a key) printed per kind of difference",
        _jobs("verify"),
        default=DEFAULT_SHOWN_KEYS,
    ),
    JobOption(
        "settle_seconds",
        ("--settle-seconds",),
        "float",
        "how long keys that differ are read again, at one source position once the lake proves it, "
        "before they are reported (changes in flight settle; 0: report the first comparison)",
        _jobs("verify"),
        default=DEFAULT_SETTLE_S,
        metavar="S",
    ),
    # Spark, shared by every job.
    JobOption(
        "master",
        ("--master",),
        "str",
        f"Spark master URL (default: spark-submit's, else {DEFAULT_MASTER})",
        ALL_JOBS,
        env=SPARK_MASTER_ENV,
        group="Spark",
    ),
    JobOption(
        "jars",
        ("--jars",),
        "str",
        "comma-separated jars for spark.jars (default: the stack's "
        ".stack/spark-jars or BW_SPARK_JARS, `none` for none; none under spark-submit)",
        ALL_JOBS,
        group="Spark",
    ),
    JobOption(
        "packages",
        ("--packages",),
        "str",
        "comma-separated Maven coordinates for spark.jars.packages",
        ALL_JOBS,
        default="",
        env=SPARK_PACKAGES_ENV,
        group="Spark",
    ),
    JobOption(
        "driver_memory",
        ("--driver-memory",),
        "str",
        "spark.driver.memory",
        ALL_JOBS,
        default="1g",
        env=SPARK_DRIVER_MEMORY_ENV,
        group="Spark",
    ),
    JobOption(
        "shuffle_partitions",
        ("--shuffle-partitions",),
        "int",
        "spark.sql.shuffle.partitions",
        ALL_JOBS,
        default=2,
        env=SPARK_SHUFFLE_PARTITIONS_ENV,
        group="Spark",
    ),
    JobOption(
        "conf",
        ("--conf",),
        "list",
        "any other Spark setting; repeatable; the environment variable holds more, comma-separated "
        "or one per line (a value holding a comma), the flags winning",
        ALL_JOBS,
        default=(),
        env=SPARK_CONF_ENV,
        metavar="KEY=VALUE",
        group="Spark",
    ),
)
