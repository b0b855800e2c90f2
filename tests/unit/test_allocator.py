"""The worker's processes run on jemalloc when the machine has it, unless the user preloads a
library of their own: the snapshot's fork server by setting `LD_PRELOAD` for its start, the worker
by re-executing itself once."""

from __future__ import annotations

import ctypes.util
import os
import subprocess
import sys

import pytest

from cdc_worker.shell.allocator import JEMALLOC, allocator_in_use, preload_for, preloaded_exec


def test_the_users_own_ld_preload_is_left_alone() -> None:
    assert preload_for("/opt/lib/libtcmalloc.so", "libjemalloc.so.2") is None
    assert preloaded_exec({"LD_PRELOAD": "libc.so.6"}, "libjemalloc.so.2", "/usr/bin/python3", ["p"]) is None


def test_jemalloc_is_preloaded_when_found_and_nothing_otherwise() -> None:
    assert preload_for(None, "libjemalloc.so.2") == "libjemalloc.so.2"
    assert preload_for("", "libjemalloc.so.2") == "libjemalloc.so.2"
    assert preload_for(None, None) is None
    assert preloaded_exec({}, None, "/usr/bin/python3", ["python3", "-m", "x"]) is None


def test_the_re_execution_runs_the_same_command_line_with_jemalloc_added() -> None:
    planned = preloaded_exec(
        {"PATH": "/bin", "LD_PRELOAD": ""},
        "libjemalloc.so.2",
        "/venv/bin/python3",
        ["python", "-m", "w", "-s", "x"],
    )
    assert planned is not None
    assert planned.program == "/venv/bin/python3"
    assert planned.argv == ["/venv/bin/python3", "-m", "w", "-s", "x"]
    assert planned.environ == {"PATH": "/bin", "LD_PRELOAD": "libjemalloc.so.2"}


def test_no_re_execution_without_an_interpreter_to_run_again() -> None:
    assert preloaded_exec({}, "libjemalloc.so.2", "", ["python"]) is None
    assert preloaded_exec({}, "libjemalloc.so.2", "/usr/bin/python3", []) is None


def test_the_startup_log_names_the_allocator() -> None:
    assert allocator_in_use({"LD_PRELOAD": "libjemalloc.so.2"}) == "jemalloc"
    assert allocator_in_use({"LD_PRELOAD": "libc.so.6"}) == "glibc malloc"
    assert allocator_in_use({}) == "glibc malloc"


PROBE = (
    "import sys; from pathlib import Path; from cdc_worker.shell.allocator import run_on_jemalloc; "
    "run_on_jemalloc(); print(sys.argv[1:], 'libjemalloc' in Path('/proc/self/maps').read_text())"
)


@pytest.mark.skipif(ctypes.util.find_library(JEMALLOC) is None, reason="the machine has no jemalloc")
def test_a_process_re_executes_itself_once_on_jemalloc_with_its_arguments() -> None:
    environ = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, "--slot", "a b"],
        env=environ,
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.strip() == "['--slot', 'a b'] True"


def test_a_process_with_a_preload_of_its_own_keeps_glibc() -> None:
    environ = {**os.environ, "LD_PRELOAD": "libc.so.6"}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, "x"], env=environ, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "['x'] False"
