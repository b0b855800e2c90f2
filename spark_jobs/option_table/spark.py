"""Spark's options, shared by every job (each with its variable, the Dagster code location's too)."""

from __future__ import annotations

from shared_connections.spark_session import DEFAULT_MASTER
from spark_jobs.options import (
    ALL_JOBS,
    SPARK_CONF_ENV,
    SPARK_DRIVER_MEMORY_ENV,
    SPARK_MASTER_ENV,
    SPARK_PACKAGES_ENV,
    SPARK_SHUFFLE_PARTITIONS_ENV,
    JobOption,
)

OPTIONS: tuple[JobOption, ...] = (
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
