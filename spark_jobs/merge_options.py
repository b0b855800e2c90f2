"""The lake's settings: what a merge, a rebuild or a read of the lake is given (`MergeOptions`), how
its changelog records the decoding (`decoding_of`, `reading_options`), and the settings a job's command
line gives (`options_from_args`), built here alone so that every job reads a flag the same way.

They sit below the merge that applies them and above the lake, so that the jobs, the merge and
Dagster share one definition without importing each other.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from kafka_contract.redaction import public_url
from spark_jobs import option_parser
from spark_jobs.options import DEFAULT_MIRROR_MAX_LAG_S
from spark_jobs.rules.changelog_commit import Decoding
from spark_jobs.rules.mirror_features import DEFAULT as DEFAULT_FEATURES
from spark_jobs.rules.mirror_features import MirrorFeatures


@dataclass(frozen=True)
class MergeOptions:
    """warehouse: root of the Delta tables. output_format: the worker's -f (avro or json).
    schema_registry: registry URL (Avro). topic_prefix: the worker's -p. postgres: DSN used only to
    type JSON columns from the catalog (without it they are typed from the lake or inferred).
    history: also maintain the SCD type 2 table `<table>__history`. changelog: first append every
    batch's records to the lake's changelog, in one commit for all tables (`lake.changelog`).
    mirror_budget_s: with the changelog, the mirrors are merged off the batches, in rounds that spend
    this many seconds starting merges (`merging.mirrors_behind`); the others wait in the changelog up
    to `mirror_max_lag_s`. None: every mirror in every batch. mirror_features: the Delta table
    features of the mirror, history and tombstones tables created from now on (`rules.mirror_features`);
    an existing table keeps its own, said once per table in a log line when they differ."""

    warehouse: str
    output_format: str = "avro"
    schema_registry: str | None = None
    topic_prefix: str | None = None
    postgres: str | None = None
    history: bool = False
    changelog: bool = False
    registry_config: dict[str, str] = field(default_factory=dict)
    mirror_budget_s: float | None = None
    mirror_max_lag_s: float = DEFAULT_MIRROR_MAX_LAG_S
    mirror_features: MirrorFeatures = DEFAULT_FEATURES


def decoding_of(options: MergeOptions) -> Decoding:
    """How the merge of `options` decodes its records, as its changelog records it (the registry
    without credentials)."""
    registry = None if options.schema_registry is None else public_url(options.schema_registry)
    return Decoding(options.output_format, registry, options.topic_prefix)


def reading_options(
    warehouse: str,
    recorded: Decoding | None,
    *,
    output_format: str | None = None,
    schema_registry: str | None = None,
    topic_prefix: str | None = None,
) -> MergeOptions:
    """The merge's options for reading the changelog of `warehouse`: what it records (`recorded`),
    each one given instead (the registry with its credentials, say); Avro when neither says."""
    fmt = output_format or (recorded.output_format if recorded is not None else "avro")
    registry = schema_registry or (recorded.schema_registry if recorded is not None else None)
    prefix = topic_prefix if topic_prefix is not None else (recorded.topic_prefix if recorded else None)
    return MergeOptions(warehouse, fmt, registry, prefix or None)


def options_from_args(
    args: argparse.Namespace,
    recorded: Decoding | None = None,
    *,
    postgres: str | None = None,
    kept_features: Callable[[], MirrorFeatures] = lambda: DEFAULT_FEATURES,
) -> MergeOptions:
    """The settings of a job's command line (`option_parser.build_parser`). `recorded`: the decoding
    the warehouse's changelog records, which a reader of it (rebuild, consistent_read) decodes with
    where -f, -r, -p (or their variables) give nothing. `postgres`: the DSN that types JSON columns,
    as the job resolved it. `kept_features`: the Delta table features when --mirror-features gives
    none. A setting whose flag the job does not take keeps its default."""
    read_as = reading_options(
        args.warehouse,
        recorded,
        output_format=args.output_format,
        schema_registry=args.schema_registry,
        topic_prefix=args.topic_prefix,
    )
    changelog = bool(getattr(args, "changelog", False))
    given = option_parser.mirror_features(getattr(args, "mirror_features", None))
    return replace(
        read_as,
        postgres=postgres,
        history=bool(getattr(args, "history", False)),
        changelog=changelog,
        mirror_budget_s=option_parser.mirror_budget(changelog, getattr(args, "mirror_budget", None)),
        mirror_max_lag_s=getattr(args, "mirror_max_lag", DEFAULT_MIRROR_MAX_LAG_S),
        mirror_features=given or kept_features(),
    )
