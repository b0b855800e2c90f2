"""The lake consistent across tables: a bank-transfer workload over three tables (and a fourth that
stays idle), the real worker publishing progress, the merge recording watermarks, consistent reads.

Every transfer moves an amount from an account of `a` to one of `b` and inserts a `transfers` row, in
one transaction: the total is constant and every transfer row matches two balance changes. Merging
`a` alone shows, through the plain latest mirrors, a torn state (the money left `a` and never reached
`b`); the consistent read of the same moment does not, and equals Postgres as of its position."""

from __future__ import annotations

import random
import shutil
import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from psycopg2 import sql

from spark_jobs.lake import watermark_io
from spark_jobs.lake.mirror_versions import versions_of
from spark_jobs.merging.query_checkpoint import query_checkpoint
from spark_jobs.reading.consistent import NoCommonWatermark, read_consistent
from spark_jobs.rules import layout
from spark_jobs.rules.watermark import START
from tests.integration.conftest import unique_name
from tests.integration.lakehouse import (
    LakeCase,
    Worker,
    assert_same_rows,
    continuous_merge,
    execute,
    postgres_frame,
    running_worker,
)
from tests.integration.worker_harness import current_lsn, query

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

ACCOUNTS = 20
TOTAL = ACCOUNTS * 2 * 1000
# The worker publishes progress each second while its position moves: let one go out after a catch-up.
PROGRESS_WAIT_S = 3.0


def transfers(dsn: str, names: dict[str, str], count: int, rng: random.Random) -> None:
    a, b, log = (sql.Identifier(names[k]) for k in ("a", "b", "transfers"))
    move = "UPDATE {} SET balance = balance + %s, moves = moves + 1 WHERE id = %s"
    for _ in range(count):
        source, target, amount = rng.randint(1, ACCOUNTS), rng.randint(1, ACCOUNTS), rng.randint(1, 9)
        execute(
            dsn,
            (sql.SQL(move).format(a), (-amount, source)),
            (sql.SQL(move).format(b), (amount, target)),
            (
                sql.SQL("INSERT INTO {} (src, dst, amount) VALUES (%s, %s, %s)").format(log),
                (source, target, amount),
            ),
        )


def stream_transfers(
    dsn: str, names: dict[str, str], seconds: float, rng: random.Random, done: threading.Event
) -> threading.Thread:
    """A thread making transfers, five at a time, for `seconds`; sets `done` when it stops."""

    def load() -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            transfers(dsn, names, 5, rng)
            time.sleep(0.1)
        done.set()

    writer = threading.Thread(target=load, daemon=True)
    writer.start()
    return writer


def large_transfer(dsn: str, names: dict[str, str], count: int) -> None:
    """One transaction of `count` transfers of 0 from account 1 of `a` to account 1 of `b` (the
    invariant holds)."""
    a, b, log = (sql.Identifier(names[k]) for k in ("a", "b", "transfers"))
    statement = (
        sql.SQL(
            "WITH moved AS (INSERT INTO {} (src, dst, amount) SELECT 1, 1, 0 FROM generate_series(1, %s) "
            "RETURNING 1), a AS (UPDATE {} SET moves = moves + (SELECT count(*) FROM moved) WHERE id = 1) "
            "UPDATE {} SET moves = moves + (SELECT count(*) FROM moved) WHERE id = 1"
        ).format(log, a, b),
        (count,),
    )
    execute(dsn, statement)


def invariant(frames: Mapping[str, object]) -> tuple[int, int, int]:
    """(total balance, moves recorded on accounts, 2 x transfer rows): a whole state has the first
    equal to TOTAL and the other two equal."""
    from pyspark.sql import DataFrame
    from pyspark.sql import functions as F

    a, b, log = (frames[k] for k in ("a", "b", "transfers"))
    assert isinstance(a, DataFrame) and isinstance(b, DataFrame) and isinstance(log, DataFrame)
    sums = [f.agg(F.sum("balance"), F.sum("moves")).head() for f in (a, b)]
    # An empty table sums to null: 0 here, so that the assertion names the torn state.
    return (
        sum(int(row[0] or 0) for row in sums if row is not None),
        sum(int(row[1] or 0) for row in sums if row is not None),
        2 * log.count(),
    )


def create_bank(lake: LakeCase) -> dict[str, str]:
    """Accounts in `a` and `b` (ACCOUNTS each, 1000 apiece), an empty `transfers`, and `quiet`."""
    names = {k: unique_name(k) for k in ("a", "b", "transfers", "quiet")}
    ident = {k: sql.Identifier(v) for k, v in names.items()}
    execute(
        lake.dsn,
        *(
            sql.SQL(
                "CREATE TABLE {} (id int PRIMARY KEY, balance bigint NOT NULL, moves int NOT NULL)"
            ).format(ident[k])
            for k in ("a", "b")
        ),
        *(
            (
                sql.SQL("INSERT INTO {} SELECT i, 1000, 0 FROM generate_series(1, %s) i").format(ident[k]),
                (ACCOUNTS,),
            )
            for k in ("a", "b")
        ),
        sql.SQL("CREATE TABLE {} (id serial PRIMARY KEY, src int, dst int, amount int)").format(
            ident["transfers"]
        ),
        sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, note text)").format(ident["quiet"]),
        sql.SQL("INSERT INTO {} VALUES (1, 'never changes')").format(ident["quiet"]),
    )
    return names


def test_consistent_reads_see_whole_transactions_and_time_travel_to_a_position(lake: LakeCase) -> None:
    rng = random.Random(26)
    names = create_bank(lake)
    qualified = {k: f"public.{v}" for k, v in names.items()}  # the warehouse's schema.table
    tables = ",".join(f"public.{v}" for v in names.values())
    checkpoint = Path(query_checkpoint(lake.checkpoints))

    def consistent(*keys: str, at_lsn: int | None = None) -> tuple[int, dict[str, object]]:
        read = read_consistent(lake.spark, lake.warehouse, [qualified[k] for k in keys], at_lsn=at_lsn)
        return read.position, {k: read.frame(qualified[k]) for k in keys}

    with running_worker(lake, fmt="avro", tables=tables) as worker:
        worker.wait_caught_up()
        transfers(lake.dsn, names, 30, rng)
        worker.wait_caught_up()
        time.sleep(PROGRESS_WAIT_S)
        lake.merge_all()
        first, frames = consistent("a", "b", "transfers", "quiet")
        assert invariant(frames) == (TOTAL, 60, 60)
        # Postgres now is its state as of `first`: captured, to travel back to it later.
        expected = {k: _postgres_rows(lake, names[k], frames[k]) for k in ("a", "b", "transfers")}
        versions_first = {k: _latest_version(lake, names[k]) for k in ("a", "b", "transfers")}
        shutil.copytree(checkpoint, lake.tmp / "checkpoint-first")

        transfers(lake.dsn, names, 30, rng)
        worker.wait_caught_up()
        time.sleep(PROGRESS_WAIT_S)
        lake.merge_all()
        # A reader of the latest mirrors that reads `a` after this run's commit to it and `b` and
        # `transfers` before theirs (the one query commits the tables one after another) is torn:
        # the money left `a` and has not reached `b`.
        torn = invariant(
            {
                "a": lake.spark.read.format("delta").load(lake.path(names["a"])),
                **{
                    k: lake.spark.read.format("delta")
                    .option("versionAsOf", versions_first[k])
                    .load(lake.path(names[k]))
                    for k in ("b", "transfers")
                },
            }
        )
        assert torn[0] != TOTAL and torn[1] != torn[2], torn
        second, frames = consistent("a", "b", "transfers", "quiet")
        # The idle table `quiet` advanced with the others and holds nobody back.
        assert second > first and invariant(frames) == (TOTAL, 120, 120)
        for key in ("a", "b", "transfers"):
            data = _data(frames[key])
            assert_same_rows(data, postgres_frame(lake.spark, lake.dsn, names[key], data))

        # Time travel: every table as of `first` equals Postgres as it was then.
        position, frames = consistent("a", "b", "transfers", at_lsn=first)
        assert position == first
        for key in ("a", "b", "transfers"):
            assert sorted(tuple(r) for r in _data(frames[key]).collect()) == expected[key]

        # An older checkpoint restored and replayed: the watermark does not go back.
        before = watermark_io.stored_mark(lake.spark, lake.path(names["a"]))
        shutil.rmtree(checkpoint)
        shutil.copytree(lake.tmp / "checkpoint-first", checkpoint)
        lake.merge_all()
        after = watermark_io.stored_mark(lake.spark, lake.path(names["a"]))
        assert after.watermark >= before.watermark > START.watermark
        position, frames = consistent("a", "b", "transfers", "quiet")
        assert position >= second and invariant(frames) == (TOTAL, 120, 120)


def _latest_version(lake: LakeCase, name: str) -> int:
    from delta.tables import DeltaTable

    return int(DeltaTable.forPath(lake.spark, lake.path(name)).history(1).head()["version"])


def _data(frame: object) -> DataFrame:
    from pyspark.sql import DataFrame

    assert isinstance(frame, DataFrame)
    return frame.drop(*layout.META_COLUMNS)


def _postgres_rows(lake: LakeCase, name: str, like: object) -> list[tuple[object, ...]]:
    return sorted(tuple(r) for r in postgres_frame(lake.spark, lake.dsn, name, _data(like)).collect())


STREAM_S = 20.0  # seven triggers: enough reads across batches of every table
TRIGGER_S = 3.0
# The worker's --idle-progress-interval here: the lag on the idle source stays under two of them
# (the interval, then up to a trigger and a batch before the merge records the proof, then the reads:
# under 10 s on a loaded machine).
IDLE_PROGRESS_S = 10.0
CATCH_UP_S = 240.0


def test_consistent_reads_in_a_loop_under_the_continuous_merge_keep_the_invariant(lake: LakeCase) -> None:
    """Transfers stream for STREAM_S while the continuous merge runs (with --history, which serves any
    proven position under a steady load) and a reader loops: every consistent read holds the
    invariant, and the table that stays idle throughout holds no read back. The same loop over the
    latest mirrors counts its torn reads (reported, not asserted: whether a read falls between two
    tables' batches is up to timing; the test above shows one deterministically)."""
    from spark_jobs.merge_options import MergeOptions

    names = create_bank(lake)
    # `quiet` changes never after its snapshot: it must not hold the common watermark back.
    qualified = [f"public.{names[k]}" for k in ("a", "b", "transfers", "quiet")]
    options = MergeOptions(lake.warehouse, "avro", lake.registry, lake.prefix, history=True)
    topics = [lake.topic(names[k]) for k in ("a", "b", "transfers", "quiet")]
    done = threading.Event()

    tables = ",".join(f"public.{v}" for v in names.values())
    idle_every = ["--idle-progress-interval", str(IDLE_PROGRESS_S)]
    with running_worker(lake, fmt="avro", tables=tables, extra_args=idle_every) as worker:
        worker.wait_caught_up()
        with continuous_merge(lake, options, topics, TRIGGER_S) as merge:
            writer = stream_transfers(lake.dsn, names, STREAM_S, random.Random(7), done)
            whole, torn, positions = 0, 0, []
            deadline = time.monotonic() + STREAM_S + CATCH_UP_S
            # Through the load, then until the common position has moved at least once.
            while (not done.is_set() or len(set(positions)) < 2) and time.monotonic() < deadline:
                assert not merge.failure, merge.failure
                assert merge.thread.is_alive(), "the continuous merge stopped by itself"
                try:
                    read = read_consistent(lake.spark, lake.warehouse, qualified)
                except NoCommonWatermark:
                    time.sleep(1)
                    continue
                frames = {k: read.frame(q) for k, q in zip(("a", "b", "transfers"), qualified, strict=False)}
                total, moves, twice = invariant(frames)
                assert total == TOTAL and moves == twice, (read.position, total, moves, twice)
                whole += 1
                positions.append(read.position)
                latest = {
                    k: lake.spark.read.format("delta").load(lake.path(names[k]))
                    for k in ("a", "b", "transfers")
                }
                total, moves, twice = invariant(latest)
                torn += total != TOTAL or moves != twice
            writer.join()
            idle_lags = idle_source_lags(lake, qualified, merge.running)
            # A transaction after the pause moves the position on, and the lake equals Postgres.
            # Waited for up to the WAL's position after it, not just past the one read before it:
            # an idle progress event (the WAL moves with other tests' work) may move it first.
            transfers(lake.dsn, names, 1, random.Random(8))
            after = current_lsn(lake.dsn)
            worker.wait_caught_up()
            deadline = time.monotonic() + CATCH_UP_S
            while (read := read_consistent(lake.spark, lake.warehouse, qualified)).position < after:
                assert time.monotonic() < deadline and merge.thread.is_alive(), (after, merge.failure)
                time.sleep(1)
            for key, name in zip(("a", "b", "transfers"), qualified, strict=False):
                data = _data(read.frame(name))
                assert_same_rows(data, postgres_frame(lake.spark, lake.dsn, names[key], data))
    assert not merge.failure, merge.failure
    assert whole >= 2 and positions == sorted(positions), positions
    # The idle table advanced its watermark with the others (the warehouse's idle marks, written by
    # the batches with nothing of it): the common position moved on past its snapshot.
    idle = watermark_io.idle_marks(lake.spark, lake.warehouse)
    quiet = [v.mark for v in versions_of(lake.spark, lake.warehouse, qualified[3], idle=idle).versions]
    assert quiet and positions[-1] > quiet[0].watermark, (quiet, positions)
    assert len({m.watermark for m in quiet}) >= 2, quiet
    print(
        f"RESULT consistent_reads={whole} torn_latest_reads={torn} positions={len(set(positions))} "
        f"mark_commit_ms={mark_commit_ms(lake, lake.path(names['a']))} idle_lags_s={idle_lags}"
    )


def idle_source_lags(lake: LakeCase, names: list[str], merging: Callable[[], bool]) -> list[float]:
    """Postgres idle (no transaction) for three of the worker's idle progress intervals once the lake
    holds everything, then through a fourth: the lag that a consistent read, the Dagster observation
    and the freshness check (the lake's, and the table's own) report stays under two intervals, where
    it grew with the pause before (it counted from the last change). Returns the lags seen."""
    from spark_jobs import quality
    from spark_jobs.lake.mirror_versions import lake_watermark

    def lags() -> list[float]:
        try:
            read = read_consistent(lake.spark, lake.warehouse, names)
        except NoCommonWatermark:  # between two batches' commits under the load: none yet
            return [float("inf")]
        observed = lake_watermark(lake.spark, lake.warehouse, names)
        proven_at = observed["common_watermark_proven_at"]
        assert read.lag_s is not None and proven_at is not None, observed
        position = quality.LakePosition(read.position, datetime.fromtimestamp(float(proven_at), UTC))
        checks = [
            quality.freshness(lake.spark, lake.path(names[0].split(".")[1]), lake=position),
            quality.freshness(lake.spark, lake.path(names[0].split(".")[1])),
        ]
        return [read.lag_s, float(observed["common_watermark_lag_s"] or 0.0)] + [
            float(c.metadata["lag_s"]) for c in checks
        ]

    caught_up = time.monotonic() + CATCH_UP_S
    while max(last := lags()) >= 2 * IDLE_PROGRESS_S:  # the merge through the load's backlog first
        assert merging() and time.monotonic() < caught_up, f"the lake did not catch up: lags {last}"
        time.sleep(1)
    time.sleep(3 * IDLE_PROGRESS_S)
    seen: list[float] = []
    deadline = time.monotonic() + IDLE_PROGRESS_S
    while time.monotonic() < deadline:
        assert merging(), "the continuous merge stopped"
        seen += lags()
        time.sleep(1)
    assert max(seen) < 2 * IDLE_PROGRESS_S, seen
    return [round(lag, 1) for lag in (min(seen), max(seen))]


def mark_commit_ms(lake: LakeCase, path: str) -> list[int]:
    """How long each mark commit took after the commit before it (Delta's commit timestamps)."""
    from delta.tables import DeltaTable

    rows = sorted(
        DeltaTable.forPath(lake.spark, path).history().select("version", "timestamp", "operation").collect()
    )
    return [
        int((row["timestamp"] - before["timestamp"]).total_seconds() * 1000)
        for before, row in zip(rows, rows[1:], strict=False)
        if row["operation"] == "SET TBLPROPERTIES"
    ]


def test_a_batch_proving_only_what_a_table_holds_reads_nothing_of_it_and_writes_a_proof_file(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An idle source's batch: the table's state is read once; a later proof of the same position then
    costs no read of the table (it is moved away meanwhile) and gives the mark the later time, which
    the query's proof file carries to every reader; the query keeps only its newest file."""
    from pyspark.sql.types import LongType, StructField, StructType

    from kafka_contract import control
    from spark_jobs.lake import delta_tables
    from spark_jobs.rules.watermark import IdleMark, Mark, epoch_micros, table_key

    warehouse = str(tmp_path / "warehouse")
    path = f"{warehouse}/public/quiet"
    delta_tables.create_table(spark, path, StructType([StructField("id", LongType())]), {})
    watermark_io.write_mark(spark, path, Mark(100, 90, 1_000_000))
    table = watermark_io.TableWatermark(path, None, ("p.quiet", "p.control"), lambda value: {})
    first = datetime(2026, 11, 27, 9, 0, tzinfo=UTC)
    later = datetime(2026, 11, 27, 9, 0, 30, tzinfo=UTC)
    ends = {("p.quiet", 0): 5, ("p.control", 0): 9}

    def progress(lsn: int, at: datetime) -> list[dict[str, object]]:
        return [control.progress_record(lsn, at, {("p.quiet", 0): 5, ("p.control", 0): 8})]

    moved = table.idle(spark, progress(200, first), ends)
    assert moved is not None and moved.moved
    assert moved.mark == IdleMark(table_key(path), 1, None, Mark(200, 90, epoch_micros(first)))
    away = tmp_path / "away"
    Path(path).rename(away)
    assert table.idle(spark, progress(200, first), ends) is None  # nothing new: no step
    again = table.idle(spark, progress(200, later), ends)
    assert again is not None and not again.moved
    assert again.mark == IdleMark(table_key(path), 1, None, Mark(200, 90, epoch_micros(later)))
    away.rename(path)
    # Read again once its state is old: a commit of no data (as OPTIMIZE makes) is the version named.
    monkeypatch.setattr(watermark_io, "STATE_MAX_AGE_S", 0.0)
    delta_tables.set_property(spark, path, "maintained", "1")
    latest = datetime(2026, 11, 27, 9, 1, tzinfo=UTC)
    maintained = table.idle(spark, progress(200, latest), ends)
    assert maintained is not None and not maintained.moved and maintained.mark.version == 2

    for batch_id in (7, 8):
        watermark_io.write_proofs(spark, warehouse, "query-1", batch_id, [again.mark])
    files = [p.name for p in Path(layout.proofs_path(warehouse)).iterdir() if layout.is_proof_file(p.name)]
    assert files == [layout.proof_file_name("query-1", 8)]
    assert watermark_io.idle_marks(spark, warehouse)[table_key(path)] == [again.mark]
    assert watermark_io.newest_idle_mark(spark, path) == again.mark.mark


def test_exactly_once_delivery_through_killed_workers_keeps_the_lake_whole(lake: LakeCase) -> None:
    """--delivery exactly-once: the merge reads read_committed (an aborted transaction's messages are
    no changes, offsets have gaps at the commit markers), the watermark is still proven from the
    progress events, and after two SIGKILLs mid-load the consistent read equals Postgres. The
    database streams any transaction past 64kB, so a large one at the end is produced into Kafka
    while it runs and its changes reach the lake with their commit event's LSN."""
    rng = random.Random(41)
    names = create_bank(lake)
    database = query(lake.dsn, "SELECT current_database()")[0][0]
    execute(
        lake.dsn,
        sql.SQL("ALTER DATABASE {} SET logical_decoding_work_mem = '64kB'").format(sql.Identifier(database)),
    )
    qualified = {k: f"public.{v}" for k, v in names.items()}
    tables = ",".join(f"public.{v}" for v in names.values())
    eos = ("--delivery", "exactly-once")
    for _ in range(2):
        worker = Worker(lake, fmt="avro", tables=tables, extra_args=eos)
        worker.start()
        done = threading.Event()
        writer = stream_transfers(lake.dsn, names, 4.0, rng, done)
        time.sleep(rng.uniform(1.5, 3.5))
        assert worker.process is not None
        worker.process.kill()  # SIGKILL: the open Kafka transaction is left for the next start to abort
        worker.process.wait(10)
        writer.join(30)
    with running_worker(lake, fmt="avro", tables=tables, extra_args=eos) as worker:
        transfers(lake.dsn, names, 20, rng)
        large_transfer(lake.dsn, names, 3000)
        worker.wait_caught_up()
        assert "produced as they came" in worker.log_tail(None), worker.log_tail()
        time.sleep(PROGRESS_WAIT_S)
        lake.merge_all()
    read = read_consistent(lake.spark, lake.warehouse, [qualified[k] for k in ("a", "b", "transfers")])
    frames = {k: read.frame(qualified[k]) for k in ("a", "b", "transfers")}
    total, moves, twice_transfers = invariant(frames)
    assert total == TOTAL and moves == twice_transfers > 0
    for key in ("a", "b", "transfers"):
        data = _data(frames[key])
        assert_same_rows(data, postgres_frame(lake.spark, lake.dsn, names[key], data))
    assert watermark_io.stored_mark(lake.spark, lake.path(names["a"])).watermark > START.watermark
