"""The tables a job works on, and the options of maintenance, quality and verify."""

from __future__ import annotations

from spark_jobs.options import (
    DEFAULT_CHANGELOG_DAYS,
    DEFAULT_MAX_LAG_S,
    DEFAULT_SETTLE_S,
    DEFAULT_SHOWN_KEYS,
    DEFAULT_TOMBSTONE_HOURS,
    DEFAULT_VACUUM_HOURS,
    JobOption,
    jobs,
)

REBUILD = jobs("rebuild")

OPTIONS: tuple[JobOption, ...] = (
    JobOption(
        "table",
        ("--table",),
        "list",
        "only this schema.table (safe names); repeatable (default: all)",
        jobs("maintenance", "verify"),
        default=(),
    ),
    JobOption("table", ("--table",), "list", "schema.table to rebuild", REBUILD, required_for=REBUILD),
    JobOption(
        "table",
        ("--table",),
        "list",
        "schema.table (safe names) to check; repeatable",
        jobs("quality"),
        default=(),
        required_for=jobs("quality"),
    ),
    JobOption(
        "no_zorder",
        ("--no-zorder",),
        "flag",
        "compact without Z-ordering by the key",
        jobs("maintenance"),
        default=False,
    ),
    JobOption(
        "vacuum_hours",
        ("--vacuum-hours",),
        "float",
        "VACUUM retention in hours",
        jobs("maintenance"),
        default=DEFAULT_VACUUM_HOURS,
    ),
    JobOption(
        "enable_deletion_vectors",
        ("--enable-deletion-vectors",),
        "flag",
        "turn deletion vectors on for tables created without them (Delta protocol reader 3 / writer 7)",
        jobs("maintenance"),
        default=False,
    ),
    JobOption(
        "changelog_days",
        ("--changelog-days",),
        "float",
        "days the changelog keeps a batch's rows (never a parked table's; without --table only)",
        jobs("maintenance"),
        default=DEFAULT_CHANGELOG_DAYS,
    ),
    JobOption("no_vacuum", ("--no-vacuum",), "flag", "skip VACUUM", jobs("maintenance"), default=False),
    JobOption(
        "force",
        ("--force",),
        "flag",
        "allow a VACUUM retention under 168 hours",
        jobs("maintenance"),
        default=False,
    ),
    JobOption(
        "tombstone_hours",
        ("--tombstone-hours",),
        "float",
        "keep deleted keys' tombstones this long",
        jobs("maintenance"),
        default=DEFAULT_TOMBSTONE_HOURS,
    ),
    JobOption(
        "max_lag",
        ("--max-lag",),
        "float",
        "freshness limit in seconds",
        jobs("quality"),
        default=DEFAULT_MAX_LAG_S,
    ),
    JobOption(
        "show",
        ("--show",),
        "int",
        "keys (rows, of a table without a key) printed per kind of difference",
        jobs("verify"),
        default=DEFAULT_SHOWN_KEYS,
    ),
    JobOption(
        "settle_seconds",
        ("--settle-seconds",),
        "float",
        "how long keys that differ are read again, at one source position once the lake proves it, "
        "before they are reported (changes in flight settle; 0: report the first comparison)",
        jobs("verify"),
        default=DEFAULT_SETTLE_S,
        metavar="S",
    ),
)
