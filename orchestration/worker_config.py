"""The resources as the worker's own configuration: its option values, a `WorkerConfig`, or the
`BOTTLEDWATER_*` environment of a `bottledwater` child process.

The resources give the connection settings; every other worker option (`--on-error`,
`--allow-unkeyed`, `-T`, ...) comes from the code location's environment, exactly as the CLI would
read it, so one environment configures the worker however it is started.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING

from cdc_worker.config import WorkerConfig, config_from_values, resolve_values
from cdc_worker.options import OPTIONS_BY_DEST
from cdc_worker.worker import EXIT_OK, Worker
from orchestration.resources import KafkaResource, PostgresResource, SchemaRegistryResource

if TYPE_CHECKING:
    from cdc_worker.shell.stream.session import StreamSession


def worker_values(
    postgres: PostgresResource, kafka: KafkaResource, registry: SchemaRegistryResource
) -> dict[str, object]:
    """Option values in the shape the CLI parser produces (lists for repeatable options)."""
    values: dict[str, object] = {
        "postgres": postgres.dsn,
        "slot": postgres.slot,
        "publication": postgres.publication_name,
        "broker": kafka.bootstrap_servers,
        "output_format": kafka.message_format,
    }
    if postgres.tables:
        values["tables"] = list(postgres.tables)
    if kafka.topic_prefix:
        values["topic_prefix"] = kafka.topic_prefix
    if kafka.client_config:
        values["kafka_config"] = [f"{k}={v}" for k, v in kafka.client_config.items()]
    if registry.url:
        values["schema_registry"] = registry.url
    return values


def worker_config(
    postgres: PostgresResource,
    kafka: KafkaResource,
    registry: SchemaRegistryResource,
    *,
    overrides: Mapping[str, object] | None = None,
    environ: Mapping[str, str] | None = None,
) -> WorkerConfig:
    """A validated `WorkerConfig`: resources and `overrides` first, then the environment."""
    values = {**worker_values(postgres, kafka, registry), **(overrides or {})}
    return config_from_values(resolve_values(values, os.environ if environ is None else environ))


def worker_environment(
    postgres: PostgresResource, kafka: KafkaResource, registry: SchemaRegistryResource
) -> dict[str, str]:
    """The same values as `BOTTLEDWATER_*` variables for a child `bottledwater` process."""
    env: dict[str, str] = {}
    for dest, value in worker_values(postgres, kafka, registry).items():
        variable = OPTIONS_BY_DEST[dest].env
        if isinstance(value, list):
            # Table globs are comma-separated; k=v settings ';'-separated (values may hold commas).
            separator = "," if OPTIONS_BY_DEST[dest].kind == "globs" else ";"
            env[variable] = separator.join(str(v) for v in value)
        else:
            env[variable] = str(value)
    return env


class WorkerStartFailed(RuntimeError):
    """The worker's startup (checks, publications, slot, snapshot) did not reach the stream."""


def start_until_streaming(config: WorkerConfig) -> int:
    """Run the worker's own startup up to the moment it would stream, then stop it cleanly.

    That is: the startup checks, the publications synced to the selected tables, and the slot --
    created together with its consistent snapshot when it is new (or when its snapshot never
    completed), resumed otherwise. Returns the LSN the stream starts from (for a new slot, the LSN
    every snapshot row carries). The worker's log lines go to the `cdc_worker` loggers.
    """
    stop = threading.Event()
    start_lsns: list[int] = []

    def at_stream(session: StreamSession) -> None:
        start_lsns.append(session.start_lsn)
        stop.set()

    worker = Worker(config, stop)
    worker.on_streaming = at_stream
    code = worker.run()
    if code != EXIT_OK or not start_lsns:
        raise WorkerStartFailed(
            f"the worker's startup for slot {config.slot} ended with exit code {code} before streaming: "
            "its log lines above say why"
        )
    return start_lsns[0]
