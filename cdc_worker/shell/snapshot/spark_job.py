"""The initial load on Spark (`bottledwater --snapshot-engine spark`): every selected table split
into ctid ranges sized from `pg_class.relpages` (`cdc_worker.shell.snapshot.chunks.plan_chunks`,
about four ranges per executor core, at most 64 MB of heap each), one Spark task per range. Each
task imports the slot's exported snapshot and publishes its range to Kafka exactly as the worker's
own snapshot would (`cdc_worker.shell.snapshot.spark_ranges.publish_range`); the job returns when
every range is acknowledged by Kafka, or raises when a range failed all its attempts.

It lives in the worker, not in `spark_jobs/` (which never imports the worker): its tasks run the
worker's codec, so the executors need the `bottledwater` distribution installed (native codec
included, or they encode in Python: same bytes, slower). The worker runs the job in its own process
(the Spark driver, client mode) while its replication connection holds the exported snapshot open;
`main` runs a job file the same way under `spark-submit`
(`spark-submit cdc_worker/shell/snapshot/spark_job.py JOB_FILE`).

Progress (tables, ranges, rows, rows/s, ETA from `pg_class.reltuples`; `spark_progress`) is logged
by a driver thread as each table is done and every PROGRESS_INTERVAL_S; row counts arrive as tasks
finish (a Spark accumulator), so they move in steps.
"""

from __future__ import annotations

import logging
import pickle
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

from cdc_worker.shell.postgres.catalog import CatalogTable
from cdc_worker.shell.snapshot.chunks import DEFAULT_PAGES_PER_CHUNK, Chunk, plan_chunks
from cdc_worker.shell.snapshot.gone_keys import gone_keys
from cdc_worker.shell.snapshot.key_ranges import table_splits
from cdc_worker.shell.snapshot.spark_progress import Counts, CountsParam, LoadProgress
from cdc_worker.shell.snapshot.spark_ranges import RangeJob, RangeResult, publish_range

if TYPE_CHECKING:
    from pyspark.accumulators import AccumulatorParam
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

PROGRESS_INTERVAL_S = 10.0
PROGRESS_POLL_S = 1.0  # how often the driver looks for finished tables


@dataclass(frozen=True)
class LoadRequest:
    """One initial load: the tables and what every task shares (picklable, for a job file)."""

    job: RangeJob
    tables: tuple[CatalogTable, ...]
    pages_per_chunk: int = DEFAULT_PAGES_PER_CHUNK
    # Per table (oid): the keys its topic held before the snapshot (`gone_keys.existing_keys`).
    known_keys: Mapping[int, set[bytes]] = field(default_factory=dict)


@dataclass(frozen=True)
class LoadResult:
    ranges: int
    rows: int
    skipped: int
    seconds: float
    rows_per_table: dict[str, int]
    # Per table (oid): the known keys no range published again, to tombstone.
    gone: dict[int, set[bytes]] = field(default_factory=dict)

    @property
    def rows_per_second(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else 0.0


class InitialLoadFailed(RuntimeError):
    """The Spark job failed: a range failed every attempt, or the job was cancelled."""


def _progress(counts: object, progress: LoadProgress, done: threading.Event) -> None:
    while not done.wait(PROGRESS_POLL_S):
        for line in progress.lines(dict(getattr(counts, "value", {})), time.monotonic()):
            log.info("%s", line)


def run_initial_load(
    spark: SparkSession, request: LoadRequest, stop: threading.Event | None = None
) -> LoadResult:
    """Publish every range of `request.tables`; raises `InitialLoadFailed` with Spark's reason in
    one line. A set `stop` cancels the job (the exported snapshot's owner is going away)."""
    sc = spark.sparkContext
    splits, ctid_ranges = table_splits(request.job.spec.dsn, request.tables)
    chunks = plan_chunks(
        request.tables,
        request.pages_per_chunk,
        max(1, sc.defaultParallelism),
        key_splits=splits,
        ctid_ranges=ctid_ranges,
    )
    expected = sum(max(t.estimated_rows, 0) for t in request.tables)
    log.info(
        "spark snapshot of %d table(s) in %d range(s) on %s (default parallelism %d)",
        len(request.tables),
        len(chunks),
        sc.master,
        sc.defaultParallelism,
    )
    if not chunks:
        return LoadResult(0, 0, 0, 0.0, {})
    # CountsParam has the two methods of pyspark's AccumulatorParam without importing pyspark.
    zero: Counts = {}
    counts = sc.accumulator(zero, cast("AccumulatorParam[Counts]", CountsParam()))
    job = request.job
    # Shipped once per executor rather than pickled into every task.
    known = sc.broadcast(dict(request.known_keys)) if request.known_keys else None

    def publish(items: Iterable[tuple[int, Chunk]]) -> Iterator[RangeResult]:
        # Runs on an executor, one range per partition; pickled with `job` and the accumulator.
        from pyspark import TaskContext

        context = TaskContext.get()
        attempt = context.attemptNumber() if context is not None else 0
        for index, chunk in items:
            keys = known.value.get(chunk.table.schema.oid) if known is not None else None
            result = publish_range(job, chunk, index, attempt, keys)
            counts.add({result.table: (result.rows, 1)})
            yield result

    started = time.monotonic()
    done = threading.Event()
    per_table_ranges = Counter(chunk.table.qualified_name for chunk in chunks)
    progress = LoadProgress(per_table_ranges, expected, PROGRESS_INTERVAL_S, started)
    watcher = threading.Thread(target=_progress, args=(counts, progress, done), daemon=True)
    canceller = threading.Thread(target=_cancel_on, args=(spark, stop, done), daemon=True)
    watcher.start()
    if stop is not None:
        canceller.start()
    sc.setJobGroup("bottledwater-initial-load", "bottledwater initial load", interruptOnCancel=True)
    try:
        rdd = sc.parallelize(list(enumerate(chunks)), numSlices=len(chunks))
        results: list[RangeResult] = rdd.mapPartitions(publish).collect()
    except Exception as exc:  # Py4JJavaError, pyspark's PythonException: whatever failed the job
        raise InitialLoadFailed(_reason(exc)) from None
    finally:
        done.set()
        if known is not None:
            known.unpersist()
    watcher.join()
    for line in progress.lines(dict(counts.value), time.monotonic()):  # the tables done last
        log.info("%s", line)
    seconds = time.monotonic() - started
    per_table: dict[str, int] = {}
    for result in results:
        per_table[result.table] = per_table.get(result.table, 0) + result.rows
    total = sum(r.rows for r in results)
    log.info(
        "spark snapshot complete: %d rows in %d range(s) of %d table(s) in %.1fs (%.0f rows/s)",
        total,
        len(chunks),
        len(per_table),
        seconds,
        total / seconds if seconds else 0.0,
    )
    tallies = [(r.oid, r.seen_keys) for r in results if r.seen_keys is not None]
    gone = gone_keys(request.known_keys, tallies)
    return LoadResult(len(chunks), total, sum(r.skipped for r in results), seconds, per_table, gone)


def _cancel_on(spark: SparkSession, stop: threading.Event | None, done: threading.Event) -> None:
    while stop is not None and not done.is_set():
        if stop.wait(0.5):
            spark.sparkContext.cancelJobGroup("bottledwater-initial-load")
            return


def _reason(error: BaseException) -> str:
    """The first line of the Python error that failed the last attempt of a task, else Spark's."""
    text = str(error)
    for line in reversed(text.splitlines()):
        stripped = line.strip()
        if stripped.startswith(("cdc_worker.", "psycopg2.", "RuntimeError", "confluent_kafka.")) or (
            "Error: " in stripped and not stripped.startswith(("at ", "org.apache", "py4j"))
        ):
            return f"a snapshot range failed every attempt: {stripped}"
    return "the Spark job failed: " + " ".join(text.split())[:500]


def write_job_file(path: str, request: LoadRequest) -> None:
    """A job file for `main` (it holds the DSN: keep it private, mode 0600)."""
    import os

    with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as out:
        pickle.dump(request, out)


def main(argv: Sequence[str] | None = None) -> int:
    """`spark-submit cdc_worker/shell/snapshot/spark_job.py JOB_FILE`: run a job file the worker wrote."""
    from shared_connections.spark_session import SparkSettings, build_session

    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: spark_job.py JOB_FILE", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    with open(args[0], "rb") as job_file:
        request = pickle.load(job_file)  # the worker's own file, mode 0600
    spark = build_session(SparkSettings(app_name="bottledwater-initial-load", master=None))
    try:
        result = run_initial_load(spark, request)
    except InitialLoadFailed as exc:
        log.error("%s", exc)
        return 1
    print(f"published {result.rows} rows in {result.ranges} ranges")
    return 0


if __name__ == "__main__":
    sys.exit(main())
