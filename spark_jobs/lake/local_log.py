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
from typing import Any

_COMMIT_FILE = re.compile(r"^(\d+)\.json$")


def local_path(table_path: str) -> Path | None:
    """The table's directory when it is on the local file system, else None."""
    if "://" in table_path and not table_path.startswith("file:"):
        return None
    return Path(table_path.removeprefix("file://").removeprefix("file:"))


def commit_versions(table_path: str) -> list[int] | None:
    """The versions of a local Delta table's commit files, oldest first; None when it is not on a
    local file system or has no log."""
    directory = local_path(table_path)
    if directory is None or not (directory / "_delta_log").is_dir():
        return None
    return sorted(
        int(m.group(1))
        for p in (directory / "_delta_log").iterdir()
        if (m := _COMMIT_FILE.match(p.name)) is not None
    )


def commit_actions(table_path: str, versions: Iterable[int]) -> list[tuple[int, dict[str, Any]]]:
    """(version, action) of a local table's commits of these versions, in order: each line of a
    commit file is one action (`add`, `remove`, `metaData`, `commitInfo`, ...). A commit removed by
    the log's cleanup meanwhile is skipped."""
    return [
        (version, action)
        for version, text in _commit_texts(table_path, versions)
        for action in map(json.loads, filter(str.strip, text.splitlines()))
        if isinstance(action, dict)
    ]


def newest_metadata(table_path: str, within: int = 64) -> dict[str, Any] | None:
    """The table's metadata (its schema, partitioning, `configuration` = its properties) at its
    newest version: from that version's checksum file (`<version>.crc`, which Delta writes after the
    commit with the table's metadata in it), else the newest `metaData` action among its newest
    `within` commits; None when the table is not local, has no log, or neither says (a commit gone
    meanwhile, or the metadata older than those commits): Delta then reads it from its checkpoint."""
    versions = commit_versions(table_path)
    if not versions:
        return None
    checksum = _checksum(table_path, versions[-1])
    if checksum is not None and isinstance(checksum.get("metadata"), dict):
        return dict(checksum["metadata"])
    for version in reversed(versions[-within:]):
        texts = _commit_texts(table_path, [version])
        if not texts:
            return None  # removed meanwhile: an older metaData found after it could be stale
        for line in reversed(texts[0][1].splitlines()):
            action = json.loads(line) if line.strip() else None
            if isinstance(action, dict) and isinstance(action.get("metaData"), dict):
                return dict(action["metaData"])
    return None


def _checksum(table_path: str, version: int) -> dict[str, Any] | None:
    """The version's checksum file, None when there is none (not written yet, or by a writer that
    writes none) or it is not whole JSON."""
    path = Path(str(local_path(table_path))) / "_delta_log" / f"{version:020d}.crc"
    try:
        parsed = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None
    return parsed if isinstance(parsed, dict) else None


def _newest_commits(table_path: str, limit: int | None = None) -> list[tuple[int, str]] | None:
    """A local Delta table's newest `limit` commits (all of them without a limit), (version, commit
    file text) oldest first; None when it is not on a local file system or has no log."""
    versions = commit_versions(table_path)
    if versions is None:
        return None
    return _commit_texts(table_path, versions if limit is None else versions[-limit:])


def _commit_texts(table_path: str, versions: Iterable[int]) -> list[tuple[int, str]]:
    log = Path(str(local_path(table_path))) / "_delta_log"
    commits = []
    for version in versions:
        try:
            commits.append((version, (log / f"{version:020d}.json").read_text()))
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
