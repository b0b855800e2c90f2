"""What the continuous merge committed, as machine-readable log lines for its supervisor.

Dagster runs `spark_jobs.merge --continuous` as a child process and reads its output line by line
(orchestration/continuous_merge.py); a line that starts, after the logging prefix, with `PREFIX`
holds a JSON list of assets the merge brought to a newer source position since the last such line,
which the run reports as Dagster materializations. An entry names its asset (`["changelog"]` or
`[schema, table]`, the Delta asset's key after `delta`), the newest batch, the position the asset now
holds (the changelog's proven watermark, a mirror's mark) with when the worker proved it, the lag
then, the changes and commits since the last report, and the Delta version (local warehouses only:
read from the log's listing, no Spark).

A mirror is reported when a commit merged its changes (in a batch, behind the changelog, or a parked
table's replay) and, less often, when its position moved with nothing of its own (its idle mark):
it then holds the source as of a newer position, as a scheduled merge that ran over it. So that a
10 s trigger over 200 tables does not flood the event log, each asset is reported at most once
per `committed_window_s` (its newest state, the changes summed), an idle advance at most once per
`idle_window_s`; the reporter's owner calls `flush` often (the continuous merge's poll, every
second) and once with `force` when it stops.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from spark_jobs.lake import local_log
from spark_jobs.merging.merge_batch import BatchResult
from spark_jobs.merging.merge_query import BatchCommitted
from spark_jobs.rules import layout
from spark_jobs.rules.changelog_commit import ChangelogCommit
from spark_jobs.rules.watermark import NO_POSITION, Mark

log = logging.getLogger(__name__)
PREFIX = "bw-materialized "
CHANGELOG = ("changelog",)
COMMITTED_WINDOW_S = 30.0
IDLE_WINDOW_S = 600.0


@dataclass(frozen=True)
class Pending:
    """An asset's newest state not reported yet; `committed`: a commit of its own since the last
    report (else only its position moved)."""

    asset: tuple[str, ...]
    path: str
    batch: int
    watermark: int | None
    proven_at_us: int | None
    seen_at: float
    changes: int
    commits: int
    committed: bool

    def merged_with(self, newer: Pending) -> Pending:
        return replace(
            newer,
            changes=self.changes + newer.changes,
            commits=self.commits + newer.commits,
            committed=self.committed or newer.committed,
        )

    def entry(self, version: int | None) -> dict[str, Any]:
        lag = (
            None if self.proven_at_us is None else round(max(0.0, self.seen_at - self.proven_at_us / 1e6), 3)
        )
        fields = {
            "asset": list(self.asset),
            "batch": self.batch,
            "watermark": self.watermark,
            "proven_at_us": self.proven_at_us,
            "lag_s": lag,
            "changes": self.changes,
            "commits": self.commits,
            "version": version,
        }
        return {k: v for k, v in fields.items() if v is not None}


def _position(watermark: int) -> int | None:
    return None if watermark == NO_POSITION else watermark


class CommitReport:
    """Collects the merge's commits (`batch`, `mirror`, from the query's and the mirrors' threads) and
    emits the due ones in one `PREFIX` line per `flush`."""

    def __init__(
        self,
        warehouse: str,
        topic_prefix: str | None,
        *,
        emit: Callable[[str], None] | None = None,
        committed_window_s: float = COMMITTED_WINDOW_S,
        idle_window_s: float = IDLE_WINDOW_S,
    ) -> None:
        self.warehouse = warehouse
        self.topic_prefix = topic_prefix
        self.emit = emit or log.info
        self.committed_window_s = committed_window_s
        self.idle_window_s = idle_window_s
        self._lock = threading.Lock()
        self._pending: dict[tuple[str, ...], Pending] = {}
        self._reported: dict[tuple[str, ...], float] = {}
        # Each table's newest position seen, so that an idle advance is told from no move at all.
        self._positions: dict[str, int] = {}

    def batch(
        self,
        committed: BatchCommitted,
        head: ChangelogCommit | None,
        marks: Mapping[str, Mark | None],
        now: float,
    ) -> None:
        """A batch of the query ended: the changelog's commit (`head`, the writer's newest: reported
        when this batch wrote it), the tables it merged, and the tables whose mark moved without."""
        if head is not None and head.batch == committed.batch_id:
            path = layout.changelog_path(self.warehouse)
            watermark = _position(head.watermark)
            self._add(Pending(CHANGELOG, path, head.batch, watermark, head.at, now, 0, 1, committed=True))
        for topic, mark in marks.items():
            result = committed.results.get(topic)
            if result is not None:
                self.mirror(topic, result, mark, now)
            elif mark is not None and mark.watermark > self._positions.get(topic, NO_POSITION):
                self._table(topic, committed.batch_id, mark, now, changes=0, committed=False)

    def mirror(self, topic: str, result: BatchResult, mark: Mark | None, now: float) -> None:
        """A commit of a table's changes (`result`), with the table's mark after it."""
        self._table(topic, result.batch_id, mark, now, changes=result.changes, committed=True)

    def _table(
        self, topic: str, batch: int, mark: Mark | None, now: float, *, changes: int, committed: bool
    ) -> None:
        location = layout.location_for_topic(topic, self.topic_prefix)
        watermark = None if mark is None else _position(mark.watermark)
        if watermark is not None:
            with self._lock:
                self._positions[topic] = max(watermark, self._positions.get(topic, NO_POSITION))
        self._add(
            Pending(
                (location.schema, location.table),
                location.path(self.warehouse),
                batch,
                watermark,
                None if mark is None else mark.at,
                now,
                changes,
                1 if committed else 0,
                committed,
            )
        )

    def _add(self, pending: Pending) -> None:
        with self._lock:
            earlier = self._pending.get(pending.asset)
            self._pending[pending.asset] = pending if earlier is None else earlier.merged_with(pending)

    def due(self, now: float, *, force: bool = False) -> list[Pending]:
        """The pending assets to report now (forgotten here): all with `force`, else those never
        reported, or last reported a window ago (the committed or the idle one)."""
        with self._lock:
            ready = []
            for asset, pending in self._pending.items():
                window = self.committed_window_s if pending.committed else self.idle_window_s
                last = self._reported.get(asset)
                if force or last is None or now - last >= window:
                    ready.append(pending)
            for pending in ready:
                del self._pending[pending.asset]
                self._reported[pending.asset] = now
        return sorted(ready, key=lambda p: (p.asset != CHANGELOG, p.asset))

    def flush(self, now: float, *, force: bool = False) -> int:
        """Emit the due assets in one line; returns how many."""
        ready = self.due(now, force=force)
        if ready:
            entries = [p.entry(_newest_version(p.path)) for p in ready]
            self.emit(PREFIX + json.dumps(entries, separators=(",", ":")))
        return len(ready)


def _newest_version(path: str) -> int | None:
    """A local table's newest version, from its log's listing; None elsewhere (no Spark here)."""
    versions = local_log.commit_versions(path)
    return versions[-1] if versions else None


def parse(text: str) -> list[dict[str, Any]] | None:
    """The entries of a `PREFIX` line (after any logging prefix), None for any other line."""
    _, found, rest = text.partition(PREFIX)
    if not found:
        return None
    try:
        entries = json.loads(rest)
    except ValueError:
        return None
    if not isinstance(entries, list):
        return None
    return [e for e in entries if isinstance(e, dict) and isinstance(e.get("asset"), list)]
