"""The snapshot's reader processes start from a fork server: single-threaded (forking the worker,
which runs librdkafka's threads, would be unsafe), with jemalloc preloaded when the machine has it
and the user set no `LD_PRELOAD` of their own."""

from __future__ import annotations

import ctypes.util
import os
import threading
from multiprocessing.queues import Queue
from pathlib import Path

import pytest

from cdc_worker.shell.allocator import JEMALLOC
from cdc_worker.shell.snapshot.process import process_context


def report_reader(results: Queue[tuple[int, bool]]) -> None:
    """A reader's view of itself: its thread count, and whether jemalloc is mapped into it."""
    maps = Path("/proc/self/maps").read_text()
    results.put((threading.active_count(), "libjemalloc" in maps))


def test_a_reader_is_forked_single_threaded_with_jemalloc_when_the_machine_has_it() -> None:
    if os.environ.get("LD_PRELOAD"):
        pytest.skip("LD_PRELOAD is set: the fork server keeps it")
    context = process_context([])
    results: Queue[tuple[int, bool]] = context.Queue()
    reader = context.Process(target=report_reader, args=(results,))
    reader.start()
    threads, jemalloc = results.get(timeout=60)
    reader.join(30)
    assert reader.exitcode == 0
    assert threads == 1
    assert jemalloc == (ctypes.util.find_library(JEMALLOC) is not None)
    assert "LD_PRELOAD" not in os.environ  # set for the fork server's start only
