"""Whether the session streams large transactions while they run, and the spool it keeps them in."""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

from cdc_worker.core.changes.spool import Spool, default_spool_dir

log = logging.getLogger(__name__)

# pgoutput's `streaming` option and protocol 2 exist from Postgres 14.
STREAMING_VERSION = 140000


def spool_for(
    *, stream_in_progress: bool, memory_mb: int, directory: str | None, server_version_num: int
) -> Spool | None:
    """A fresh spool (files a killed run left removed) when in-progress streaming is on and the
    server has it; None means protocol 1, large transactions sent only at their commit."""
    if not stream_in_progress:
        return None
    if server_version_num < STREAMING_VERSION:
        log.info("Postgres %d streams no transaction in progress (14+ does): protocol 1", server_version_num)
        return None
    spool = Spool(memory_mb * 1024 * 1024, directory)
    removed = spool.clean()
    if removed:
        log.info("removed %d spool files a previous run left in %s", removed, spool.directory)
    return spool


def check_spool_dir(*, stream_in_progress: bool, directory: str | None) -> list[str]:
    """Start-up check: the spool directory can be created and written (a file made and removed),
    so that the first large transaction does not stop the stream instead."""
    if not stream_in_progress:
        return []
    path = Path(directory) if directory is not None else default_spool_dir()
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(prefix="bw-check-", dir=path):
            pass
    except OSError as exc:
        return [
            f"--spool-dir {path}: cannot create or write files there ({exc.strerror or exc}): give a "
            "writable directory with --spool-dir, or turn in-progress streaming off with "
            "--no-stream-in-progress"
        ]
    return []
