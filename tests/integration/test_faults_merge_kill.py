"""A Delta merge killed with kill -9 during its commit, then run again: Delta equals Postgres.

The merge runs as its own process (`python -m spark_jobs.merge`, its own Spark JVM) on a backlog of
changes into an existing mirror. The test watches the mirror's directory and SIGKILLs the process
group at the moment a MERGE's data files are on disk but no commit in `_delta_log/` holds them yet
(or Delta's temporary commit file is being written): the transaction is between writing and
committing. That it was caught in that window is asserted after the kill (the files are still
referenced by no commit, the next version's JSON does not exist); a missed window (the process
finished first, or the commit landed before the kill) is retried on a further backlog, a bounded
number of times. Then the merge runs again on the same checkpoint: every row equals Postgres,
no key twice, no deleted key back.

Twice: merging the mirror in every batch, and behind the lake's changelog under the schedule
(`--changelog --mirror-budget 0`: the batches only append to the changelog, the run's catch-up
merges the mirror's pending slice at the end), where the kill lands inside that MERGE, after the
changelog's commits: the rerun merges the slice from the changelog again, and the mirror reaches the
changelog's head.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg2
import pytest
from psycopg2 import sql

from spark_jobs.lake import changelog as changelog_io
from spark_jobs.lake import local_log, watermark_io
from tests.integration.conftest import unique_name
from tests.integration.lakehouse import (
    PROJECT_ROOT,
    LakeCase,
    Worker,
    assert_delta_equals_postgres,
    delta_data,
    execute,
    running_worker,
)
from tests.integration.orchestration_harness import stop_group

ATTEMPTS = 3
# Starting a JVM with Delta and reading the backlog, on a loaded machine.
MERGE_TIMEOUT_S = 240
POLL_S = 0.005
ROWS = 20_000
# A commit's temporary file (HDFSLogStore writes `.<version>.json.<uuid>.tmp`, then renames it).
TEMP_COMMIT = ".json."
PARQUET_MAGIC = b"PAR1"


@dataclass
class Window:
    """What was on disk when the merge was killed."""

    version: int  # the version being committed
    files: set[str]  # its data files, referenced by no commit
    written: set[str]  # those of them whose footer was written before the kill
    temp_commit: bool


class LogWatcher:
    """The mirror's files against its `_delta_log/`: which data files no commit references."""

    def __init__(self, table: Path) -> None:
        self.table = table
        self.log = table / "_delta_log"
        self.read: set[int] = set()
        self.referenced: set[str] = set()

    def versions(self) -> list[int]:
        return local_log.commit_versions(str(self.table)) or []

    def refresh(self) -> int:
        """Reads the commits not read yet; returns the newest version (-1: none)."""
        versions = self.versions()
        unread = [v for v in versions if v not in self.read]
        for version, action in local_log.commit_actions(str(self.table), unread):
            if "add" in action:
                self.referenced.add(action["add"]["path"])
            self.read.add(version)
        return versions[-1] if versions else -1

    def data_files(self) -> set[str]:
        """Data files as the log names them: relative paths (Delta may put them in random-prefix
        folders, as it does with column mapping)."""
        found = set()
        for folder, subfolders, names in os.walk(self.table):
            if folder == str(self.table):
                subfolders[:] = [d for d in subfolders if d != "_delta_log"]
            relative = os.path.relpath(folder, self.table)
            found |= {n if relative == "." else f"{relative}/{n}" for n in names if n.endswith(".parquet")}
        return found

    def temp_commit(self) -> bool:
        try:
            return any(p.name.startswith(".") and TEMP_COMMIT in p.name and p.name.endswith(".tmp")
                       for p in os.scandir(self.log))  # fmt: skip
        except FileNotFoundError:
            return False


def _merge_command(lake: LakeCase, table: str, max_offsets: int, *, changelog: bool) -> list[str]:
    command = [
        sys.executable, "-m", "spark_jobs.merge", "-b", lake.bootstrap, "-r", lake.registry, "-f", "avro",
        "-p", lake.prefix, "--warehouse", lake.warehouse, "--checkpoints", lake.checkpoints,
        "-t", lake.topic(table), "--max-offsets-per-trigger", str(max_offsets),
    ]  # fmt: skip
    return command + (["--changelog", "--mirror-budget", "0"] if changelog else ["--no-changelog"])


def _complete(path: Path) -> bool:
    """A Parquet file whose footer is written: its task has finished writing it."""
    try:
        with path.open("rb") as handle:
            handle.seek(-4, os.SEEK_END)
            return path.stat().st_size > len(PARQUET_MAGIC) * 2 and handle.read(4) == PARQUET_MAGIC
    except OSError:
        return False


def _kill_during_commit(
    lake: LakeCase, table: str, max_offsets: int, log_path: Path, notes: list[str], *, changelog: bool
) -> Window | None:
    """Runs the merge; SIGKILLs it while a commit of the mirror is under way: a data file of the
    commit fully written (or the commit's temporary file there) and no commit holding it. The
    window, or None when the merge ended, or the commit landed, before the kill."""
    watcher = LogWatcher(Path(lake.path(table)))
    watcher.refresh()
    before = watcher.data_files()
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}
    with log_path.open("ab") as log:
        merge = subprocess.Popen(
            _merge_command(lake, table, max_offsets, changelog=changelog),
            cwd=PROJECT_ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # the driver and its JVM, killed together
        )
    seen: set[str] = set()
    try:
        deadline = time.monotonic() + MERGE_TIMEOUT_S
        while merge.poll() is None:
            assert time.monotonic() < deadline, f"the merge did not finish in {MERGE_TIMEOUT_S}s"
            fresh = watcher.data_files() - before - watcher.referenced
            seen |= fresh
            written = {f for f in fresh if _complete(watcher.table / f)}
            temp = watcher.temp_commit()
            if written or temp:
                # Files no commit read so far references may belong to a commit that has just
                # landed: only a file that no commit references is a commit under way.
                watcher.refresh()
                if (written - watcher.referenced) or temp:
                    os.killpg(merge.pid, signal.SIGKILL)
                    merge.wait(30)
                    newest = watcher.refresh()
                    uncommitted = (watcher.data_files() - before) - watcher.referenced
                    pending = newest + 1
                    if uncommitted and not (watcher.log / f"{pending:020d}.json").exists():
                        return Window(pending, uncommitted, written - watcher.referenced, temp)
                    notes.append(f"too late: version {newest} committed {sorted(written)}")
                    return None  # the commit made it first
                before |= watcher.referenced  # the files of a batch committed meanwhile
            time.sleep(POLL_S)
        assert merge.returncode == 0, log_path.read_text(errors="replace")[-4000:]
        notes.append(
            f"finished before a kill: versions {watcher.versions()}, {len(seen)} data files seen "
            f"uncommitted, {len(watcher.data_files() - before)} new"
        )
        return None
    finally:
        stop_group(merge, timeout=30)


def _changes(lake: LakeCase, table: str, round_: int) -> None:
    """A backlog touching rows all over the table: updates, deletes, a deleted key back, inserts."""
    t = sql.Identifier(table)
    low = ROWS + round_ * 5_000
    execute(
        lake.dsn,
        (sql.SQL("UPDATE {} SET qty = qty + %s, note = repeat(md5(id::text), 4) WHERE id %% 3 = 0").format(t),
         (round_,)),
        (sql.SQL("DELETE FROM {} WHERE id %% 7 = %s").format(t), (round_ % 7,)),
        (sql.SQL("INSERT INTO {} VALUES (%s, 'back', 1, 'again') ON CONFLICT DO NOTHING").format(t),
         (7 + round_,)),
        (sql.SQL("INSERT INTO {} SELECT g, 'new', g, md5(g::text) FROM generate_series(%s, %s) g").format(t),
         (low + 1, low + 5_000)),
    )  # fmt: skip


def _rows_and_deleted(lake: LakeCase, table: str) -> tuple[int, list[int]]:
    with psycopg2.connect(lake.dsn) as conn, conn.cursor() as cur:
        cur.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table)))
        count = cur.fetchone()[0]
        cur.execute(
            sql.SQL("SELECT g FROM generate_series(1, %s) g WHERE NOT EXISTS (SELECT 1 FROM {} WHERE id = g)")
            .format(sql.Identifier(table)),
            (ROWS,),
        )  # fmt: skip
        deleted = [r[0] for r in cur.fetchall()]
    conn.close()
    return count, deleted


def _until_caught(
    lake: LakeCase, worker: Worker, table: str, notes: list[str], *, changelog: bool
) -> Iterator[tuple[int, Window | None]]:
    for attempt in range(ATTEMPTS):
        _changes(lake, table, attempt + 1)
        worker.wait_caught_up()
        log_path = lake.tmp / f"merge-{attempt}.log"
        yield attempt, _kill_during_commit(lake, table, 8_000, log_path, notes, changelog=changelog)


@pytest.mark.parametrize("changelog", [False, True], ids=["per_batch", "behind_the_changelog"])
def test_a_merge_killed_during_its_commit_then_rerun_equals_postgres(lake: LakeCase, changelog: bool) -> None:
    name = unique_name("orders")
    t = sql.Identifier(name)
    execute(
        lake.dsn,
        sql.SQL("CREATE TABLE {} (id bigint PRIMARY KEY, item text, qty int, note text)").format(t),
        (sql.SQL("INSERT INTO {} SELECT g, 'item ' || g, g, md5(g::text) FROM generate_series(1, %s) g")
         .format(t), (ROWS,)),
    )  # fmt: skip
    with running_worker(lake, fmt="avro", tables=f"public.{name}") as worker:
        worker.wait_caught_up()
        # The mirror exists, so the killed batch merges into existing rows (and, behind the
        # changelog, is not merged in the batch: a table without a mirror is, whatever the budget).
        lake.merge(name, changelog=changelog)
        window = None
        missed: list[str] = []
        for _attempt, caught in _until_caught(lake, worker, name, missed, changelog=changelog):
            if caught is not None:
                window = caught
                break
        assert window is not None, f"the kill never landed inside a commit in {ATTEMPTS} attempts: {missed}"
        worker.wait_caught_up()

    # Killed inside the commit: the batch's data files are written, its version is not.
    table_path = Path(lake.path(name))
    assert window.files and all((table_path / f).exists() for f in window.files), window
    assert window.written or window.temp_commit, window  # not merely while its first rows were written
    assert not (table_path / "_delta_log" / f"{window.version:020d}.json").exists(), window

    if changelog:
        # The killed run's batches were in the changelog before its catch-up merged the mirror.
        head = changelog_io.newest(lake.spark, lake.warehouse)
        assert head is not None
        assert watermark_io.stored_mark(lake.spark, lake.path(name)).watermark < head.watermark, head
    # The same checkpoint: the killed batch (or, behind the changelog, the killed catch-up) runs again.
    run = lake.merge(name, changelog=changelog, mirror_budget_s=0.0 if changelog else None)
    assert (table_path / "_delta_log" / f"{window.version:020d}.json").exists()
    if changelog:
        assert head is not None
        mark = watermark_io.stored_mark(lake.spark, lake.path(name))
        assert mark.watermark >= head.watermark, f"the mirror {mark} is behind the changelog's {head}"
    else:
        assert run.batches, "the rerun merged nothing: the killed batch was not replayed"
    watcher = LogWatcher(table_path)
    watcher.refresh()
    assert not (window.files & watcher.referenced), "a commit picked up the killed batch's files"

    assert_delta_equals_postgres(lake.spark, lake.path(name), lake.dsn, name)
    delta = delta_data(lake.spark, lake.path(name))
    count, deleted = _rows_and_deleted(lake, name)
    assert deleted, "the backlog deleted nothing: the resurrection check would prove nothing"
    assert delta.count() == delta.select("id").distinct().count() == count, "a key held twice"
    assert delta.where(delta.id.isin(deleted)).count() == 0, "a deleted row came back"
    print(f"killed in the commit of version {window.version}: {window}; missed attempts: {missed}")
