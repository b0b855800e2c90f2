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
    log = _log_directory(table_path)
    if log is None:
        return None
    return sorted(int(m.group(1)) for p in log.iterdir() if (m := _COMMIT_FILE.match(p.name)) is not None)


def commit_actions(table_path: str, versions: Iterable[int]) -> list[tuple[int, dict[str, Any]]]:
    """(version, action) of a local table's commits of these versions, in order: each line of a
    commit file is one action (`add`, `remove`, `metaData`, `commitInfo`, ...). A commit removed by
    the log's cleanup meanwhile (or a table not local) gives none."""
    log = _log_directory(table_path)
    if log is None:
        return []
    actions = []
    for version in versions:
        try:
            text = (log / f"{version:020d}.json").read_text()
        except FileNotFoundError:  # removed by the log's cleanup since the listing
            continue
        lines = filter(str.strip, text.splitlines())
        actions += [(version, a) for a in map(json.loads, lines) if isinstance(a, dict)]
    return actions


def newest_metadata(table_path: str, within: int = 64) -> dict[str, Any] | None:
    """The table's metadata (its schema, partitioning, `configuration` = its properties) at its
    newest version (`metadata_at`)."""
    versions = commit_versions(table_path)
    return metadata_at(table_path, versions[-1], within, versions) if versions else None


def metadata_at(
    table_path: str, version: int, within: int = 64, versions: list[int] | None = None
) -> dict[str, Any] | None:
    """The table's metadata as of `version`: from that version's checksum file (`<version>.crc`,
    which Delta writes after the commit with the table's metadata in it), else the newest `metaData`
    action among the `within` commits up to it; None when the table is not local, has no log, or
    neither says (a commit gone meanwhile, or the metadata older than those commits): Delta then
    reads it from its checkpoint. `versions`: the table's `commit_versions`, when known."""
    checksum = _checksum(table_path, version)
    if checksum is not None and isinstance(checksum.get("metadata"), dict):
        return dict(checksum["metadata"])
    versions = commit_versions(table_path) if versions is None else versions
    for older in reversed([v for v in versions or () if v <= version][-within:]):
        actions = commit_actions(table_path, [older])
        if not actions:
            return None  # removed meanwhile: an older metaData found after it could be stale
        changed = [a["metaData"] for _, a in actions if isinstance(a.get("metaData"), dict)]
        if changed:
            return dict(changed[-1])
    return None


def column_names_at(table_path: str, version: int) -> list[str] | None:
    """The table's column names as of `version`, in order (`metadata_at`'s schema); None when its
    metadata is not found so."""
    metadata = metadata_at(table_path, version)
    schema = None if metadata is None else metadata.get("schemaString")
    fields = json.loads(schema).get("fields") if isinstance(schema, str) else None
    return [str(f["name"]) for f in fields] if isinstance(fields, list) else None


def commits_with_metadata(table_path: str, limit: int | None = None) -> list[tuple[int, str]] | None:
    """(version, user metadata) of the commits that carry some among a local table's newest `limit`,
    oldest first, as `DeltaTable.history(limit)` gives them; None when the table is not local."""
    versions = commit_versions(table_path)
    if versions is None:
        return None
    newest = versions if limit is None else versions[-limit:]
    return sorted(
        (version, str(info["userMetadata"]))
        for version, action in commit_actions(table_path, newest)
        if isinstance(info := action.get("commitInfo"), dict) and info.get("userMetadata") is not None
    )


def _log_directory(table_path: str) -> Path | None:
    """A local table's `_delta_log` directory; None when the table is elsewhere or has no log."""
    directory = local_path(table_path)
    log = None if directory is None else directory / "_delta_log"
    return log if log is not None and log.is_dir() else None


def _checksum(table_path: str, version: int) -> dict[str, Any] | None:
    """The version's checksum file, None when there is none (not written yet, or by a writer that
    writes none) or it is not whole JSON."""
    log = _log_directory(table_path)
    try:
        parsed = None if log is None else json.loads((log / f"{version:020d}.crc").read_text())
    except (FileNotFoundError, ValueError):
        return None
    return parsed if isinstance(parsed, dict) else None
