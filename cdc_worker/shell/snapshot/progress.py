"""Progress of the snapshot: rows per table and in total, rows/s and ETA, shown with rich on a
terminal and as log lines (every 10 s, one per table in progress and one in total) elsewhere.

Estimates come from `pg_class.reltuples` (absent for a table never analyzed, then no ETA). Worker
threads call `advance` every few thousand rows; both displays are thread-safe.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cdc_worker.shell.snapshot.chunks import Chunk

log = logging.getLogger(__name__)


@dataclass
class _TableProgress:
    name: str
    estimated_rows: int | None
    rows: int = 0
    chunks_left: int = 0
    started: float | None = None
    finished: float | None = None


@dataclass
class SnapshotProgress:
    """Rows per table and in total, rows/s and ETA: a rich display on a terminal, log lines elsewhere."""

    tables: dict[int, _TableProgress] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)
    use_rich: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _rich: Any = None
    _tasks: dict[int, Any] = field(default_factory=dict)
    _total_task: Any = None

    @classmethod
    def for_chunks(cls, chunks: Sequence[Chunk], *, use_rich: bool | None = None) -> SnapshotProgress:
        progress = cls(use_rich=sys.stderr.isatty() if use_rich is None else use_rich)
        for chunk in chunks:
            oid = chunk.table.schema.oid
            entry = progress.tables.get(oid)
            if entry is None:
                estimate = chunk.table.estimated_rows
                entry = progress.tables[oid] = _TableProgress(
                    chunk.table.qualified_name, estimate if estimate >= 0 else None
                )
            entry.chunks_left += 1
        return progress

    @property
    def total_rows(self) -> int:
        return sum(t.rows for t in self.tables.values())

    def _estimated_total(self) -> int | None:
        estimates = [t.estimated_rows for t in self.tables.values()]
        return None if any(e is None for e in estimates) else sum(e or 0 for e in estimates)

    def start(self) -> None:
        if not self.use_rich:
            return
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self._rich = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            transient=False,
        )
        self._total_task = self._rich.add_task("total", total=self._estimated_total(), rate="")
        for oid, entry in self.tables.items():
            self._tasks[oid] = self._rich.add_task(entry.name, total=entry.estimated_rows, rate="")
        self._rich.start()

    def advance(self, oid: int, rows: int) -> None:
        now = time.monotonic()
        with self._lock:
            entry = self.tables[oid]
            if entry.started is None:
                entry.started = now
            entry.rows += rows
        if self._rich is not None:
            rate = f"{entry.rows / max(now - (entry.started or now), 1e-3):,.0f} rows/s"
            self._rich.update(self._tasks[oid], advance=rows, rate=rate)
            total_rate = f"{self.total_rows / max(now - self.started, 1e-3):,.0f} rows/s"
            self._rich.update(self._total_task, advance=rows, rate=total_rate)

    def chunk_done(self, oid: int) -> None:
        with self._lock:
            entry = self.tables[oid]
            entry.chunks_left -= 1
            if entry.chunks_left == 0:
                entry.finished = time.monotonic()
                if entry.started is None:
                    entry.started = entry.finished
        if entry.chunks_left == 0:
            if self._rich is not None:
                self._rich.update(self._tasks[oid], total=entry.rows, completed=entry.rows)
            else:
                seconds = (entry.finished or 0) - (entry.started or 0)
                log.info(
                    "snapshot of %s done: %d rows in %.1fs",
                    entry.name,
                    entry.rows,
                    seconds,
                    extra={"table": entry.name},
                )

    def log_lines(self) -> list[str]:
        """One line per table in progress and one for the total (the plain, non-TTY display)."""
        now = time.monotonic()
        lines = []
        with self._lock:
            for entry in self.tables.values():
                if entry.started is None or entry.finished is not None:
                    continue
                lines.append(
                    _progress_line(entry.name, entry.rows, entry.estimated_rows, now - entry.started)
                )
            lines.append(
                _progress_line("total", self.total_rows, self._estimated_total(), now - self.started)
            )
        return lines

    def stop(self) -> None:
        if self._rich is not None:
            if self._total_task is not None:
                self._rich.update(self._total_task, total=self.total_rows, completed=self.total_rows)
            self._rich.stop()
            self._rich = None


def _progress_line(name: str, rows: int, estimate: int | None, elapsed: float) -> str:
    rate = rows / elapsed if elapsed > 0 else 0.0
    line = f"snapshot {name}: {rows:,} rows, {rate:,.0f} rows/s"
    if estimate:
        percent = min(100.0, 100.0 * rows / estimate)
        eta = max(0.0, (estimate - rows) / rate) if rate > 0 else float("inf")
        line += f", {percent:.0f}% of ~{estimate:,}, ETA {eta:,.0f}s"
    return line
