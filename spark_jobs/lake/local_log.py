"""A Delta table's commits read straight from its `_delta_log/<version>.json` files, when the table
is on the local file system.

The marks the merge writes (`rules.watermark`, `rules.changelog_commit`) are its commits' user
metadata. Delta's own history (`DeltaTable.history`) reads the same files, but through a query of
its own: about 0.15-0.2 s per table on two cores, 500 times the file reads, and a consistent read or
the slot page asks it of every table. A table on another file system (`s3://`, `abfss://`, ...) is
read through Delta (None here). Commits are written whole (Delta's log store renames a complete
file into place), so a file listed is a file readable; one removed by the log's cleanup meanwhile is
skipped, as Delta would no longer list it either.

No Spark, no JVM: the orchestration reads the lake with it without a session.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path

_COMMIT_FILE = re.compile(r"^(\d+)\.json$")


def local_path(table_path: str) -> Path | None:
    """The table's directory when it is on the local file system, else None."""
    if "://" in table_path and not table_path.startswith("file:"):
        return None
    return Path(table_path.removeprefix("file://").removeprefix("file:"))


def _newest_commits(table_path: str, limit: int | None = None) -> list[tuple[int, str]] | None:
    """A local Delta table's newest `limit` commits (all of them without a limit), (version, commit
    file text) oldest first; None when it is not on a local file system or has no log."""
    directory = local_path(table_path)
    if directory is None:
        return None
    log = directory / "_delta_log"
    if not log.is_dir():
        return None
    numbered = sorted(
        (int(m.group(1)), p) for p in log.iterdir() if (m := _COMMIT_FILE.match(p.name)) is not None
    )
    commits = []
    for version, path in numbered if limit is None else numbered[-limit:]:
        try:
            commits.append((version, path.read_text()))
        except FileNotFoundError:  # removed by the log's cleanup since the listing
            continue
    return commits


def _user_metadata(commits: Iterable[tuple[int, str]]) -> Iterable[tuple[int, str | None]]:
    """(version, its commit's user metadata) of (version, commit file text) pairs."""
    for version, text in commits:
        for line in text.splitlines():
            entry = json.loads(line) if line.strip() else {}
            info = entry.get("commitInfo") if isinstance(entry, dict) else None
            if isinstance(info, dict):
                yield version, info.get("userMetadata")


def commits_with_metadata(table_path: str, limit: int | None = None) -> list[tuple[int, str]] | None:
    """(version, user metadata) of the commits that carry some among a local table's newest `limit`,
    oldest first, as `DeltaTable.history(limit)` gives them; None when the table is not local."""
    commits = _newest_commits(table_path, limit)
    if commits is None:
        return None
    return sorted((v, m) for v, m in _user_metadata(commits) if m is not None)
