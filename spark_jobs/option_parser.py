"""The Spark jobs' command lines, built from the option table (`spark_jobs.options`): the parser of
each job (environment variables as defaults, read when a parser is built), the Kafka source options
and the SparkSession settings the shared Spark options ask for.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence

from shared_connections.spark_session import DEFAULT_MASTER, SparkSettings, under_spark_submit
from spark_jobs.errors import ConfigurationError
from spark_jobs.option_table import OPTIONS
from spark_jobs.options import (
    BUDGET_OFF,
    DEFAULT_MIRROR_BUDGET_S,
    KAFKA_OPTIONS_ENV,
    MIRROR_FEATURES_ENV,
    SPARK_CONF_ENV,
    Job,
    JobOption,
)
from spark_jobs.rules.mirror_features import MirrorFeatures
from spark_jobs.rules.mirror_features import parse as parse_mirror_features

_TYPES = {"str": str, "int": int, "float": float}


def options_for(job: Job) -> list[JobOption]:
    return [option for option in OPTIONS if job in option.jobs]


def _help(option: JobOption, job: Job) -> str:
    notes = []
    if option.env:
        notes.append(f"env {option.env}")
    if job in option.required_for:
        notes.append("required")
    elif option.kind == "switch":
        notes.append(f"default {'on' if option.default else 'off'}")
    elif option.kind not in ("flag", "list") and option.default not in (None, ""):
        notes.append(f"default {option.default}")
    return f"{option.help} [{'; '.join(notes)}]" if notes else option.help


def build_parser(
    job: Job, description: str, environ: Mapping[str, str] | None = None
) -> argparse.ArgumentParser:
    """The job's CLI: its options from the table, environment variables as defaults."""
    environ = os.environ if environ is None else environ
    parser = argparse.ArgumentParser(prog=f"spark_jobs.{job}", description=description)
    groups = {"job": parser, "Spark": parser.add_argument_group("Spark")}
    for option in options_for(job):
        target = groups[option.group]
        env_value = environ.get(option.env) if option.env else None
        default = env_value if env_value else option.default
        required = job in option.required_for and default in (None, (), "")
        if option.kind == "flag":
            target.add_argument(*option.flags, dest=option.dest, action="store_true", help=_help(option, job))
        elif option.kind == "switch":
            target.add_argument(
                *option.flags,
                dest=option.dest,
                action=argparse.BooleanOptionalAction,
                default=option.default,
                help=_help(option, job),
            )
        elif option.kind == "list":
            target.add_argument(
                *option.flags,
                dest=option.dest,
                action="append",
                default=[],
                required=required,
                metavar=option.metavar,
                help=_help(option, job),
            )
        else:
            target.add_argument(
                *option.flags,
                dest=option.dest,
                type=_TYPES[option.kind],
                default=default,
                required=required,
                choices=option.choices or None,
                metavar=option.metavar,
                help=_help(option, job),
            )
    return parser


def mirror_budget(changelog: bool, given: str | None) -> float | None:
    """`--mirror-budget` as the merge takes it: seconds, or None for every mirror in every batch
    (`off`, and always without the changelog); the default budget when the changelog is kept and
    none is given. A budget given without the changelog is refused in one line."""
    if not changelog:
        if given is not None:
            raise ConfigurationError(
                "--mirror-budget merges the mirrors behind the lake's changelog: drop --no-changelog"
            )
        return None
    if given is None:
        return DEFAULT_MIRROR_BUDGET_S
    if given.strip().lower() == BUDGET_OFF:
        return None
    try:
        seconds = float(given)
    except ValueError:
        seconds = -1.0
    if seconds < 0:
        raise ConfigurationError(f"--mirror-budget {given!r}: expected seconds (0 or more) or {BUDGET_OFF}")
    return seconds


def mirror_features(given: str | None) -> MirrorFeatures | None:
    """`--mirror-features` (or its variable, which argparse does not check against the choices);
    None when neither gives it. A value that is no choice is refused in one line."""
    try:
        return parse_mirror_features(given)
    except ValueError as exc:
        raise ConfigurationError(f"--mirror-features ({MIRROR_FEATURES_ENV}) {exc}") from None


def kafka_options(flags: Sequence[str], environ: Mapping[str, str]) -> dict[str, str]:
    """The Kafka source options: the environment's lines (KAFKA_OPTIONS_ENV), then the flags'."""
    lines = [line for line in environ.get(KAFKA_OPTIONS_ENV, "").splitlines() if line.strip()]
    return {**key_values(lines, KAFKA_OPTIONS_ENV), **key_values(flags, "--kafka-option")}


def key_values(entries: Sequence[str], flag: str) -> dict[str, str]:
    """`KEY=VALUE` entries of a repeatable option; a malformed one is a one-line error."""
    values: dict[str, str] = {}
    for item in entries:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigurationError(f"{flag} {item!r}: expected KEY=VALUE")
        values[key.strip()] = value
    return values


def parse_conf(text: str) -> dict[str, str]:
    """SPARK_CONF_ENV's Spark settings: `KEY=VALUE` entries separated by commas, or one per line
    when there are several lines (so that a value may hold a comma, as Java options and package
    lists do). Raises ValueError naming the malformed entry."""
    entries = text.splitlines() if "\n" in text.strip() else text.split(",")
    conf: dict[str, str] = {}
    for entry in (e.strip() for e in entries):
        if not entry:
            continue
        key, sep, value = entry.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{entry!r}: expected KEY=VALUE")
        conf[key.strip()] = value.strip()
    return conf


def spark_settings(
    args: argparse.Namespace, app_name: str, environ: Mapping[str, str] | None = None
) -> SparkSettings:
    """The SparkSession settings the shared Spark options ask for; `--conf` over SPARK_CONF_ENV's."""
    environ = os.environ if environ is None else environ
    try:
        from_env = parse_conf(environ.get(SPARK_CONF_ENV, ""))
    except ValueError as exc:
        raise ConfigurationError(f"{SPARK_CONF_ENV}: {exc}") from None
    master = args.master
    if master is None and not under_spark_submit():
        master = DEFAULT_MASTER
    return SparkSettings(
        app_name=app_name,
        master=master,
        shuffle_partitions=args.shuffle_partitions,
        driver_memory=args.driver_memory,
        jars=None if args.jars is None else [j for j in args.jars.split(",") if j],
        packages=[p for p in args.packages.split(",") if p],
        extra_conf={**from_env, **key_values(args.conf, "--conf")},
    )
