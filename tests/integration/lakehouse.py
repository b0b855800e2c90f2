"""Helpers of the lakehouse tests: the real worker as a subprocess, a merge run, frame comparison."""

from __future__ import annotations

import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg2

from spark_jobs.connections import postgres_catalog, postgres_rows
from spark_jobs.merge import KafkaSource, TableRun, run_continuous, run_merge
from spark_jobs.merge_options import MergeOptions
from spark_jobs.rules import layout
from tests.integration.conftest import unique_name

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

PROJECT_ROOT = Path(__file__).resolve().parents[2]
# The `bottledwater` console script, run from this tree (not whatever an install put on the PATH).
WORKER = [sys.executable, "-c", "import sys; from cdc_worker.cli import main; sys.exit(main())"]
CATCH_UP_TIMEOUT_S = 120.0
# The worker's log line once every snapshot row is acknowledged by Kafka.
SNAPSHOT_DONE = "snapshot complete"


class Worker:
    """`bottledwater` on a fresh database: snapshot, then stream, until stopped."""

    def __init__(
        self, case: LakeCase, *, fmt: str, tables: str, partitions: int = 2, extra_args: Sequence[str] = ()
    ) -> None:
        dsn, slot, prefix, broker, registry = case.dsn, case.slot, case.prefix, case.bootstrap, case.registry
        self.dsn, self.slot = dsn, slot
        self.args = [
            *WORKER, "-d", dsn, "-s", slot, "-b", broker, "-r", registry, "-f", fmt, "-p", prefix,
            "--tables", tables, "-T", f"partitions={partitions}", "--status-interval", "1",
            "--snapshot-workers", "1", *extra_args,
        ]  # fmt: skip
        self.log_path = case.tmp / "worker.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        log = self.log_path.open("ab")
        env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}
        self.process = subprocess.Popen(
            self.args, stdout=log, stderr=subprocess.STDOUT, cwd=PROJECT_ROOT, env=env
        )

    def wait_caught_up(self, timeout: float = CATCH_UP_TIMEOUT_S) -> None:
        """Until the slot's confirmed position passes everything written so far: the worker
        acknowledges only what Kafka has acknowledged, so every change is then in Kafka. A new slot
        starts past the snapshot's rows, so first the snapshot must have been delivered."""
        deadline = time.monotonic() + timeout
        while SNAPSHOT_DONE not in self.log_tail(None):
            assert self.process is not None
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"no snapshot from the worker: {self.log_tail()}")
            time.sleep(0.3)
        with psycopg2.connect(self.dsn) as conn, conn.cursor() as cur:
            cur.execute("SELECT pg_current_wal_lsn()")
            target = cur.fetchone()[0]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise AssertionError(f"worker exited {self.process.returncode}: {self.log_tail()}")
            with psycopg2.connect(self.dsn) as conn, conn.cursor() as cur:
                cur.execute(
                    "SELECT confirmed_flush_lsn >= %s::pg_lsn FROM pg_replication_slots WHERE slot_name = %s",
                    (target, self.slot),
                )
                row = cur.fetchone()
            if row is not None and row[0]:
                return
            time.sleep(0.3)
        raise AssertionError(f"worker did not reach {target} in {timeout}s: {self.log_tail()}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)

    def log_tail(self, length: int | None = 3000) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return text if length is None else text[-length:]


@contextmanager
def running_worker(case: LakeCase, **kwargs: Any) -> Iterator[Worker]:
    worker = Worker(case, **kwargs)
    worker.start()
    try:
        yield worker
    finally:
        worker.stop()


class ContinuousMerge:
    """`run_continuous` of the test's topics on a thread of its own; an exception it ends with is kept
    in `failure` for the test thread to fail on."""

    def __init__(
        self, case: LakeCase, options: MergeOptions, topics: Sequence[str], trigger_s: float
    ) -> None:
        self.stop = threading.Event()
        self.failure: list[BaseException] = []
        self.thread = threading.Thread(
            target=self._run, args=(case, options, list(topics), trigger_s), daemon=True
        )

    def _run(self, case: LakeCase, options: MergeOptions, topics: list[str], trigger_s: float) -> None:
        try:
            run_continuous(
                case.spark, options, KafkaSource(case.bootstrap), case.checkpoints,
                topics=topics, trigger_interval=trigger_s, stop=self.stop,
            )  # fmt: skip
        except BaseException as exc:  # handed to the test thread
            self.failure.append(exc)

    def running(self) -> bool:
        """Neither failed nor stopped by itself."""
        return not self.failure and self.thread.is_alive()


@contextmanager
def continuous_merge(
    case: LakeCase, options: MergeOptions, topics: Sequence[str], trigger_s: float
) -> Iterator[ContinuousMerge]:
    """The continuous merge running through the block, then stopped at a batch boundary and joined."""
    merge = ContinuousMerge(case, options, topics, trigger_s)
    merge.thread.start()
    try:
        yield merge
    finally:
        merge.stop.set()
        merge.thread.join(120)


def execute(dsn: str, *statements: Any) -> None:
    """Each statement is a psycopg2.sql.Composable or plain SQL text, optionally with parameters."""
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        for statement in statements:
            if isinstance(statement, tuple):
                cur.execute(*statement)
            else:
                cur.execute(statement)


@dataclass
class LakeCase:
    """One test's world: its database, a random topic prefix and slot, its warehouse and checkpoints."""

    spark: SparkSession
    dsn: str
    bootstrap: str
    registry: str
    tmp: Path
    prefix: str = field(default_factory=lambda: unique_name("bw"))
    slot: str = field(default_factory=lambda: unique_name("slot"))

    @property
    def warehouse(self) -> str:
        return str(self.tmp / "warehouse")

    @property
    def checkpoints(self) -> str:
        return str(self.tmp / "checkpoints")

    def topic(self, table: str) -> str:
        return f"{self.prefix}.{table}"

    def worker(self, fmt: str, table: str, partitions: int = 2) -> AbstractContextManager[Worker]:
        return running_worker(self, fmt=fmt, tables=f"public.{table}", partitions=partitions)

    def merge(self, table: str, fmt: str = "avro", **options: Any) -> TableRun:
        """One merge run of the table's topic; fails the test if the run failed."""
        max_offsets = options.pop("max_offsets_per_trigger", None)
        if fmt == "json":
            options.setdefault("postgres", self.dsn)  # JSON's types from the catalog, as in production
        registry = self.registry if fmt == "avro" else None
        merge_options = MergeOptions(self.warehouse, fmt, registry, self.prefix, **options)
        kafka = KafkaSource(self.bootstrap, max_offsets_per_trigger=max_offsets)
        runs = run_merge(self.spark, merge_options, kafka, self.checkpoints, topics=[self.topic(table)])
        # Topics an earlier run of the test merged stay in the one query (its checkpoint holds them).
        assert not [r.error for r in runs if r.error], [r.error for r in runs]
        (run,) = [r for r in runs if r.topic == self.topic(table)]
        return run

    def merge_all(self, fmt: str = "avro", **options: Any) -> dict[str, TableRun]:
        """One merge run of every topic under the test's prefix (one query), by table name."""
        threads = options.pop("threads", 2)
        catch_up = options.pop("catch_up", True)
        if fmt == "json":
            options.setdefault("postgres", self.dsn)
        registry = self.registry if fmt == "avro" else None
        merge_options = MergeOptions(self.warehouse, fmt, registry, self.prefix, **options)
        kafka = KafkaSource(self.bootstrap)
        pattern = re.escape(self.prefix) + r"\..*"
        runs = run_merge(
            self.spark,
            merge_options,
            kafka,
            self.checkpoints,
            pattern=pattern,
            threads=threads,
            catch_up=catch_up,
        )
        return {run.topic.removeprefix(self.prefix + "."): run for run in runs}

    def path(self, table: str) -> str:
        return f"{self.warehouse}/public/{table}"


def delta_data(spark: SparkSession, path: str) -> DataFrame:
    frame = spark.read.format("delta").load(path)
    return frame.drop(*layout.META_COLUMNS)


def postgres_frame(
    spark: SparkSession, dsn: str, table: str, like: DataFrame, schema: str = "public"
) -> DataFrame:
    """The Postgres table's rows as a DataFrame with `like`'s schema (the Delta table's columns)."""
    columns = {c.name: c for c in postgres_catalog.table_columns(dsn, schema, table)}
    wanted = [columns[name] for name in like.columns]
    rows = list(postgres_rows.fetch_rows(dsn, schema, table, wanted))
    return spark.createDataFrame(rows, like.schema)


# Tables up to this many rows are compared in Python (one Spark job a side); larger ones by Spark.
COLLECT_ROWS = 20_000


def _comparable(value: Any) -> Any:
    """A row value as a hashable, NaN-equal key (Spark's exceptAll treats NaN as equal to NaN)."""
    if isinstance(value, float) and math.isnan(value):
        return ("NaN",)
    if isinstance(value, bytearray):  # Spark's binary
        return bytes(value)
    if isinstance(value, dict):
        return tuple(sorted((repr(k), _comparable(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):  # arrays and structs (Row is a tuple)
        return tuple(_comparable(v) for v in value)
    return value


def _small_rows(frame: DataFrame) -> Counter[Any] | None:
    rows = frame.limit(COLLECT_ROWS + 1).collect()
    return None if len(rows) > COLLECT_ROWS else Counter(_comparable(tuple(r)) for r in rows)


def assert_same_rows(left: DataFrame, right: DataFrame) -> None:
    """Equal as multisets: same count, and nothing left over either way."""
    small_left = _small_rows(left)
    small_right = None if small_left is None else _small_rows(right)
    if small_left is not None and small_right is not None:
        only_left, only_right = (
            list((small_left - small_right).elements()),
            list((small_right - small_left).elements()),
        )
        counts = (small_left.total(), small_right.total())
        assert (only_left, only_right) == ([], []), (
            f"counts {counts[0]} vs {counts[1]}; only left: {only_left[:10]}; only right: {only_right[:10]}"
        )
        return
    left_count, right_count = left.count(), right.count()
    only_left = left.exceptAll(right).collect()
    only_right = right.exceptAll(left).collect()
    assert (left_count, only_left, only_right) == (right_count, [], []), (
        f"counts {left_count} vs {right_count}; only left: {only_left[:10]}; only right: {only_right[:10]}"
    )


def assert_delta_equals_postgres(spark: SparkSession, path: str, dsn: str, table: str) -> None:
    delta = delta_data(spark, path)
    assert_same_rows(delta, postgres_frame(spark, dsn, table, delta))


def sorted_rows(frame: DataFrame, columns: Sequence[str]) -> list[tuple[Any, ...]]:
    return sorted(tuple(r) for r in frame.select(*columns).collect())


def env_flag(name: str) -> bool:
    return os.environ.get(name, "") not in ("", "0")
