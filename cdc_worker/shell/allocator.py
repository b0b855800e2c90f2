"""The worker's processes run on jemalloc when the machine has it (Debian's `libjemalloc2`).

librdkafka allocates eight blocks per message in the thread that produces it (the message, and the
copy of the five `bw.*` headers: one per header, their list and its array) and frees them in its
delivery thread. glibc's malloc pays for that hand-over in consolidation and arena locks: about a
third of the producing thread's CPU in a profile of the snapshot's readers, and of the worker's own
thread when it publishes a large streamed transaction at its commit. jemalloc pays much less (see
docs/benchmarks.md). The messages are the same either way.

A library cannot be preloaded into a running process, so the worker re-executes itself once, at its
start, with `LD_PRELOAD` naming jemalloc (`preloaded_exec`). Nothing happens when `LD_PRELOAD` is
set already: the user's own choice stands (`LD_PRELOAD=libc.so.6` keeps glibc's malloc, as a
harmless preload of what is loaded anyway), and the re-executed worker finds it set. The snapshot's
fork server (`shell.snapshot.process`) applies the same rule to its readers.
"""

from __future__ import annotations

import ctypes.util
import functools
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

JEMALLOC = "jemalloc"


@functools.cache
def jemalloc_library() -> str | None:
    """jemalloc's shared library (a name the dynamic loader finds), or None when it is missing."""
    # find_library runs ldconfig: once per process.
    return ctypes.util.find_library(JEMALLOC)


def preload_for(ld_preload: str | None, jemalloc: str | None) -> str | None:
    """What `LD_PRELOAD` a process of the worker should start with: nothing to change when one is
    set (the user's own, left alone), else jemalloc's library when found, else nothing."""
    if ld_preload:
        return None
    return jemalloc


@dataclass(frozen=True)
class Exec:
    """A re-execution of this process: the program, its arguments and its environment."""

    program: str
    argv: list[str]
    environ: dict[str, str]


def preloaded_exec(
    environ: Mapping[str, str], jemalloc: str | None, executable: str, orig_argv: Sequence[str]
) -> Exec | None:
    """The re-execution that puts jemalloc under this Python process (`orig_argv` is the
    interpreter's own command line, options and `-m`/`-c` included), or None when there is none to
    do: `LD_PRELOAD` set already, or no jemalloc on the machine, or no interpreter to run again."""
    library = preload_for(environ.get("LD_PRELOAD"), jemalloc)
    if library is None or not executable or not orig_argv:
        return None
    return Exec(executable, [executable, *orig_argv[1:]], {**environ, "LD_PRELOAD": library})


def run_on_jemalloc() -> None:
    """Re-executes this process on jemalloc when `preloaded_exec` says so (it does not return
    then); otherwise returns and the process goes on as it is."""
    planned = preloaded_exec(os.environ, jemalloc_library(), sys.executable, sys.orig_argv)
    if planned is None:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(planned.program, planned.argv, planned.environ)


def allocator_in_use(environ: Mapping[str, str]) -> str:
    """What the startup log says of the allocator: jemalloc when preloaded, else glibc's malloc."""
    return JEMALLOC if JEMALLOC in environ.get("LD_PRELOAD", "") else "glibc malloc"
