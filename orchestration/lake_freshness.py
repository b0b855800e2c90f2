"""The lake's common watermark as the slot-lag pager sees it: from the Delta logs, without Spark.

The slot tells how far the worker is behind Postgres; the common watermark (docs/lakehouse.md) tells
how far a consistent reader of the lake is: the newest source position every Delta table can be read
at, and when the worker proved it. The page names both (`orchestration.policy.lake_watermark`), so
that on-call sees at once whether the slot, the merge or one table holds the lake back. A sensor
reads no Delta table through Spark: each mirror's newest commits are read from its `_delta_log` (a
local warehouse; a remote one shows "unknown") with the warehouse's newest idle marks, and their
marks fed to the pure `spark_jobs.rules.watermark.common_watermark`. On a warehouse that keeps the
lake's changelog, its newest commit's proven position is named too (`observe_changelog`): what a
read through the changelog serves, however far the mirrors trail.
"""

from __future__ import annotations

from collections.abc import Mapping

from orchestration.policy.lake_watermark import LakeWatermark
from spark_jobs.lake.local_log import commits_with_metadata, local_path
from spark_jobs.lake.mirror_versions import RECENT_COMMITS
from spark_jobs.rules import layout
from spark_jobs.rules.changelog_commit import newest_commit, parse_changelog_commit
from spark_jobs.rules.watermark import (
    IdleMark,
    TableVersions,
    Version,
    by_table,
    common_watermark,
    marked_in,
    parse_idle,
    proven_at,
    table_key,
    warehouse_of,
    with_idle,
)


def _log_versions(table_path: str) -> list[Version] | None:
    commits = commits_with_metadata(table_path, RECENT_COMMITS)
    return None if commits is None else marked_in(commits)


def _idle_marks(warehouse: str) -> dict[str, list[IdleMark]]:
    """The newest idle marks of a local warehouse, then its merge queries' newest proofs, by table key."""
    commits = commits_with_metadata(layout.idle_marks_path(warehouse), RECENT_COMMITS) or []
    marks = [m for _, metadata in commits for m in parse_idle(metadata)]
    return by_table(marks + _proof_marks(warehouse))


def _proof_marks(warehouse: str) -> list[IdleMark]:
    """The marks of a local warehouse's proof files (`spark_jobs.lake.watermark_io.write_proofs`)."""
    directory = local_path(layout.proofs_path(warehouse))
    if directory is None or not directory.is_dir():
        return []
    marks: list[IdleMark] = []
    for path in sorted(directory.iterdir()):
        if layout.is_proof_file(path.name):
            try:
                marks += parse_idle(path.read_text())
            except FileNotFoundError:  # replaced by a newer one since the listing
                continue
    return marks


def observe(table_paths: Mapping[str, str]) -> LakeWatermark | None:
    """The common watermark of the tables (name -> mirror path) that exist, None when they share no
    position (or none is readable here). A table's history table counts as in `consistent_read`."""
    tables = []
    idle: dict[str, dict[str, list[IdleMark]]] = {}  # by warehouse, then table key
    for name, path in table_paths.items():
        versions = _log_versions(path)
        if versions is None:
            continue  # not merged yet (or not local): it holds no reader back
        history = None
        marks = [v.mark for v in _log_versions(path + layout.HISTORY_SUFFIX) or []]
        if marks:
            history = (marks[0].watermark + 1, max(m.watermark for m in marks))
        warehouse = warehouse_of(path)
        if warehouse not in idle:
            idle[warehouse] = _idle_marks(warehouse)
        own = idle[warehouse].get(table_key(path), [])
        tables.append(with_idle(TableVersions(name, versions, history), own))
    position = common_watermark(tables)
    if position is None:
        return None
    proven = proven_at(tables, position)
    return LakeWatermark(position, None if proven is None else proven / 1e6)


def observe_changelog(changelog_path: str) -> LakeWatermark | None:
    """The position the lake's changelog proves (its newest commits' newest watermark) and when the
    worker proved it; None when it proves none yet, or is not a local table."""
    commits = commits_with_metadata(changelog_path, RECENT_COMMITS) or []
    head = newest_commit(parse_changelog_commit(text) for _, text in commits)
    if head is None or head.watermark <= 0:
        return None
    return LakeWatermark(head.watermark, None if head.at is None else head.at / 1e6)
