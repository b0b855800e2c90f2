"""Where the jobs find the lake, the records and how to decode them, and Postgres: the
warehouse, Kafka and the topics, the worker's format, registry and topic prefix (the merge's, and
the changelog readers' overrides), the DSNs."""

from __future__ import annotations

from spark_jobs.connections import dsn
from spark_jobs.options import ALL_JOBS, JobOption, jobs

OPTIONS: tuple[JobOption, ...] = (
    JobOption(
        "broker",
        ("-b", "--broker"),
        "str",
        "Kafka bootstrap servers, host:port[,...]",
        jobs("merge"),
        env="BOTTLEDWATER_BROKER",
        required_for=jobs("merge"),
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
        jobs("merge"),
        required_for=jobs("merge"),
    ),
    JobOption(
        "topic", ("-t", "--topic"), "list", "a table topic to merge; repeatable", jobs("merge"), default=()
    ),
    JobOption(
        "topic_pattern",
        ("--topic-pattern",),
        "str",
        "regular expression (full match) selecting table topics",
        jobs("merge"),
    ),
    JobOption(
        "output_format",
        ("-f", "--output-format"),
        "str",
        "the worker's message format",
        jobs("merge"),
        default="avro",
        env="BOTTLEDWATER_OUTPUT_FORMAT",
        choices=("avro", "json"),
    ),
    JobOption(
        "schema_registry",
        ("-r", "--schema-registry"),
        "str",
        "schema registry URL (required for avro)",
        jobs("merge"),
        env="BOTTLEDWATER_SCHEMA_REGISTRY",
    ),
    JobOption(
        "topic_prefix",
        ("-p", "--topic-prefix"),
        "str",
        "the worker's --topic-prefix",
        jobs("merge"),
        env="BOTTLEDWATER_TOPIC_PREFIX",
    ),
    # The changelog's readers decode its records as the merge that wrote them, which the changelog
    # records (never a credential): these override it.
    JobOption(
        "output_format",
        ("-f", "--output-format"),
        "str",
        "the worker's message format (default: as the warehouse's changelog records it)",
        jobs("rebuild", "consistent_read"),
        env="BOTTLEDWATER_OUTPUT_FORMAT",
        choices=("avro", "json"),
    ),
    JobOption(
        "schema_registry",
        ("-r", "--schema-registry"),
        "str",
        "schema registry URL, with its credentials if it needs them (default: the registry the "
        "warehouse's changelog records)",
        jobs("rebuild", "consistent_read"),
        env="BOTTLEDWATER_SCHEMA_REGISTRY",
    ),
    JobOption(
        "topic_prefix",
        ("-p", "--topic-prefix"),
        "str",
        "the worker's --topic-prefix (default: as the warehouse's changelog records it)",
        jobs("rebuild", "consistent_read"),
        env="BOTTLEDWATER_TOPIC_PREFIX",
    ),
    JobOption(
        "postgres_types",
        ("-d", "--postgres"),
        "str",
        "Postgres DSN, only to type JSON columns from the catalog (default: types from the Delta "
        "table, else inferred); shows in the process list: prefer the environment or --postgres-file",
        jobs("merge", "rebuild"),
        env=dsn.MERGE_DSN_ENV,
        metavar="DSN",
    ),
    JobOption(
        "postgres_file",
        ("--postgres-file",),
        "str",
        "file whose first line is the Postgres DSN of -d (kept out of the process list)",
        jobs("merge", "rebuild"),
        metavar="FILE",
    ),
    JobOption(
        "postgres",
        ("-d", "--postgres"),
        "str",
        "Postgres DSN of the source database, for drift and reconciliation (skipped without it)",
        jobs("quality"),
        env="BOTTLEDWATER_POSTGRES",
        metavar="DSN",
    ),
    JobOption(
        "postgres",
        ("-d", "--postgres"),
        "str",
        "Postgres DSN of the source database, whose tables the mirrors are compared with",
        jobs("verify"),
        env="BOTTLEDWATER_POSTGRES",
        required_for=jobs("verify"),
        metavar="DSN",
    ),
)
