"""The layers docs/architecture.md draws, held against the code's imports: the core imports no I/O
and nothing above it, the shell nothing above it, the Kafka contract nothing of ours or heavier,
the worker and spark_jobs nothing of each other, the connections they share nothing of either,
spark_jobs' layers nothing above them, the orchestration's policy no Dagster and no I/O, and no
module imports itself back through others."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("cdc_worker", "kafka_contract", "shared_connections", "spark_jobs", "orchestration", "stack")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for package in PACKAGES for p in (ROOT / package).rglob("*.py")}


def imports(path: Path) -> Iterator[str]:
    """Every module `path` imports, at any depth (lazy imports inside functions count too)."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


def imported_by(prefix: str) -> dict[str, set[str]]:
    return {
        name: set(imports(path))
        for name, path in modules().items()
        if name == prefix or name.startswith(prefix + ".")  # spark_jobs.lake is not spark_jobs.lakehouse
    }


# Pure functions of otherwise forbidden libraries: psycopg2's hstore text parser (no connection).
ALLOWED = {
    "cdc_worker.core.pgtypes.text": {
        "psycopg2",
        "psycopg2.InterfaceError",
        "psycopg2.extras",
        "psycopg2.extras.HstoreAdapter",
    }
}


# spark_jobs' layers, top down (the jobs and the read side, merging, the lake's settings, lake,
# connections, decoding, rules): each imports nothing of the layers above it.
SPARK_JOBS = tuple(
    f"spark_jobs.{job}"
    for job in (
        "lakehouse",
        "merge",
        "maintenance",
        "quality",
        "verify",
        "verifying",  # verify's parts, with it
        "consistent_read",
        "reading",  # the read side, which the jobs call: with them, above the merge it decodes with
        "job_main",  # the jobs' shared exit: their layer
    )
)
SETTINGS = (
    "spark_jobs.options",
    "spark_jobs.option_table",
    "spark_jobs.option_parser",
    "spark_jobs.merge_options",
)
ABOVE_SETTINGS = (*SPARK_JOBS, "spark_jobs.merging")
ABOVE_LAKE = (*ABOVE_SETTINGS, *SETTINGS)
ABOVE_CONNECTIONS = (*ABOVE_LAKE, "spark_jobs.lake")
ABOVE_DECODING = (*ABOVE_CONNECTIONS, "spark_jobs.connections")
ABOVE_RULES = (*ABOVE_DECODING, "spark_jobs.decoding")
ORCHESTRATION_DEFINITIONS = tuple(
    name
    for name in modules()
    if name.startswith("orchestration.") and not name.startswith("orchestration.policy")
)


def offenders(prefix: str, forbidden: tuple[str, ...]) -> list[str]:
    return sorted(
        f"{name} imports {target}"
        for name, targets in imported_by(prefix).items()
        for target in targets - ALLOWED.get(name, set())
        if any(target == f or target.startswith(f + ".") for f in forbidden)
    )


@pytest.mark.parametrize(
    ("layer", "forbidden"),
    [
        # The pure core: no sockets, no threads, nothing above it.
        (
            "cdc_worker.core",
            ("cdc_worker.shell", "cdc_worker.cli", "cdc_worker.config", "cdc_worker.options",
             "cdc_worker.worker", "psycopg2", "confluent_kafka.admin", "confluent_kafka.cimpl", "socket",
             "threading", "multiprocessing"),
        ),
        ("cdc_worker.shell",
         ("cdc_worker.cli", "cdc_worker.config", "cdc_worker.options", "cdc_worker.worker")),
        # Executors and Dagster import the contract: nothing of ours, no registry client, no psycopg2.
        (
            "kafka_contract",
            ("cdc_worker", "spark_jobs", "orchestration", "stack", "psycopg2", "confluent_kafka", "pyspark"),
        ),
        # The worker and the lake are peers: each reaches Spark and Postgres through
        # shared_connections, and neither imports the other.
        ("cdc_worker", ("spark_jobs", "orchestration")),
        ("spark_jobs", ("cdc_worker", "orchestration")),
        ("shared_connections", ("cdc_worker", "spark_jobs", "orchestration", "stack")),
        ("spark_jobs.merging", SPARK_JOBS),
        ("spark_jobs.reading", tuple(job for job in SPARK_JOBS if job != "spark_jobs.reading")),
        ("spark_jobs.verifying",
         tuple(job for job in SPARK_JOBS if job not in ("spark_jobs.verifying", "spark_jobs.reading"))),
        *((settings, ABOVE_SETTINGS) for settings in SETTINGS),
        ("spark_jobs.lake", ABOVE_LAKE),
        ("spark_jobs.connections", ABOVE_CONNECTIONS),
        ("spark_jobs.decoding", ABOVE_DECODING),
        # The pure rules: no Delta table read, no connection opened.
        ("spark_jobs.rules", (*ABOVE_RULES, "delta", "psycopg2", "confluent_kafka")),
        # The errors every layer raises: below the rules, importing nothing of spark_jobs or any I/O.
        ("spark_jobs.errors", ("spark_jobs", "pyspark", "delta", "psycopg2", "confluent_kafka", "sys")),
        # The orchestration's policy: no Dagster, no I/O, nothing of the definitions that apply it.
        ("orchestration.policy",
         (*ORCHESTRATION_DEFINITIONS, "dagster", "dagster_pyspark", "pyspark", "psycopg2", "confluent_kafka",
          "spark_jobs", "cdc_worker.shell", "socket", "threading", "urllib.request")),
    ],
)  # fmt: skip
def test_a_layer_imports_nothing_above_it(layer: str, forbidden: tuple[str, ...]) -> None:
    assert offenders(layer, forbidden) == []


def test_no_import_cycles() -> None:
    known = modules()
    graph = {
        name: {target for target in imports(path) if target in known and target != name}
        for name, path in known.items()
    }
    # A package's __init__ importing nothing of its own, an edge to it is an edge to a leaf.
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for target in graph[node]:
            if state.get(target) == 1:
                cycles.append([*trail[trail.index(target) :], target] if target in trail else [node, target])
            elif target not in state:
                visit(target, [*trail, target])
        state[node] = 2

    for name in graph:
        if name not in state:
            visit(name, [name])
    assert cycles == []


# The stream session dispatches each message kind to the collaborator that owns it; the owners share
# only these pieces (where the stream is, publishing, the status channel, chunk reads, the producers
# of large transactions the worker starts), so that a capability is added as an owner and a line in
# the session's tables, not threaded through others.
STREAM = "cdc_worker.shell.stream"
STREAM_SHARED = {
    f"{STREAM}.{name}"
    for name in ("position", "publishing", "heartbeat", "resnapshot_reader", "early_streams")
}
STREAM_OWNERS = (
    "row_changes", "in_progress", "relations", "resnapshot", "ddl_events", "truncates", "acknowledgement",
    "progress", "kafka_commits",
)  # fmt: skip


@pytest.mark.parametrize("owner", STREAM_OWNERS)
def test_a_stream_owner_imports_no_other_owner(owner: str) -> None:
    name = f"{STREAM}.{owner}"
    ours = {t for t in imports(modules()[name]) if t.startswith(STREAM + ".")}
    stream_modules = {m for m in modules() if m.startswith(STREAM + ".")}
    assert {t for t in ours if t in stream_modules} <= STREAM_SHARED


def test_every_stream_module_is_an_owner_shared_or_the_session() -> None:
    """A new module under shell/stream/ says here which it is, so the rule above holds it."""
    known = {m.removeprefix(STREAM + ".") for m in modules() if m.startswith(STREAM + ".")}
    shared = {m.removeprefix(STREAM + ".") for m in STREAM_SHARED}
    assert known - shared - set(STREAM_OWNERS) == {"session", "spooling"}
