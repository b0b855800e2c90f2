"""The merge's own options: the history and changelog it keeps, the mirrors merged behind the
changelog, the trigger, the threads and Kafka's settings."""

from __future__ import annotations

from spark_jobs.options import (
    BUDGET_OFF,
    DEFAULT_MERGE_THREADS,
    DEFAULT_MIRROR_BUDGET_S,
    DEFAULT_MIRROR_MAX_LAG_S,
    DEFAULT_TRIGGER_INTERVAL_S,
    KAFKA_OPTIONS_ENV,
    MIRROR_FEATURES_ENV,
    JobOption,
    jobs,
)

OPTIONS: tuple[JobOption, ...] = (
    JobOption(
        "history",
        ("--history",),
        "flag",
        "also maintain the SCD type 2 table <table>__history",
        jobs("merge", "rebuild"),
        default=False,
    ),
    JobOption(
        "changelog",
        ("--changelog",),
        "switch",
        "first append each micro-batch's records to the lake's changelog, one commit for all tables "
        "(--no-changelog: each mirror merged from Kafka alone, and no read fresher than the mirrors)",
        jobs("merge"),
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
        jobs("merge", "rebuild"),
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
        jobs("merge"),
        metavar="S",
    ),
    JobOption(
        "mirror_max_lag",
        ("--mirror-max-lag",),
        "float",
        "with --mirror-budget: a mirror waiting this long is merged whatever the budget",
        jobs("merge"),
        default=DEFAULT_MIRROR_MAX_LAG_S,
        metavar="S",
    ),
    JobOption(
        "no_catch_up",
        ("--no-catch-up",),
        "flag",
        "with --mirror-budget, a run without --continuous leaves behind the mirrors the budget did "
        "not reach (default: it merges them before it ends)",
        jobs("merge"),
        default=False,
    ),
    JobOption(
        "max_offsets_per_trigger",
        ("--max-offsets-per-trigger",),
        "int",
        "cap on messages per micro-batch (default: all available in one batch)",
        jobs("merge"),
    ),
    JobOption(
        "continuous",
        ("--continuous",),
        "flag",
        "keep merging: one long-running query for every table, a micro-batch every --trigger-interval "
        "(default: merge what is available now and stop)",
        jobs("merge"),
        default=False,
    ),
    JobOption(
        "trigger_interval",
        ("--trigger-interval",),
        "float",
        "seconds between the micro-batches of --continuous",
        jobs("merge"),
        default=DEFAULT_TRIGGER_INTERVAL_S,
    ),
    JobOption(
        "merge_threads",
        ("--merge-threads",),
        "int",
        "tables of a micro-batch merged at once",
        jobs("merge"),
        default=DEFAULT_MERGE_THREADS,
    ),
    JobOption(
        "allow_data_loss",
        ("--allow-data-loss",),
        "flag",
        "do not fail when retention deleted offsets the checkpoint expects",
        jobs("merge"),
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
        jobs("merge"),
        default=(),
        env=KAFKA_OPTIONS_ENV,
        metavar="KEY=VALUE",
    ),
)
