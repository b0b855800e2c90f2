"""The terms of the Spark jobs' option table (`option_table.OPTIONS`): the jobs, an entry
(`JobOption`: flag, environment variable, type, default, doc and the jobs that take it), the
defaults and the environment variables the jobs and Dagster share.

The CLIs are built from the table (`option_parser.build_parser`), so each option is documented
once, reads the same environment variable as the worker (`bw-stack env` exports them, so one
environment serves the worker and the jobs), and `tests/unit/test_spark_jobs_options.py` holds the
table against docs/lakehouse.md. Environment defaults are read when a parser is built, never at import.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

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


def jobs(*names: Job) -> frozenset[Job]:
    return frozenset(names)


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
