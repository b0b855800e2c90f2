"""Run the `bottledwater` CLI as a child process and hand each log line to a callback.

The `cdc_worker` job runs the worker as a separate process rather than in the Dagster run's own
interpreter, so that a crash of either is seen by the other: a killed worker is a non-zero exit the
job reports as a failure (and the supervisor relaunches); a terminated run stops the worker with
SIGTERM, which makes it flush, acknowledge and exit 0 (docs/worker.md, "Quickstart against your own
Postgres and Kafka"). Configuration travels in the child's environment (`BOTTLEDWATER_*`), never on
its command line, where `ps` would show the Postgres password to every user of the machine.
"""

from __future__ import annotations

import enum
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from kafka_contract.redaction import redact_text

WORKER_EXECUTABLE = "bottledwater"
# The worker's own shutdown flushes Kafka and sends a final acknowledgement; give it this long.
STOP_TIMEOUT_S = 60.0
# docs/worker.md: 2 means "needs a person" (bad configuration, a failed startup check, a lost slot):
# the same start would fail the same way, so nobody should retry it blindly.
EXIT_NEEDS_PERSON = 2


class LogLevel(enum.StrEnum):
    DEBUG = "debug"
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


@dataclass(frozen=True)
class WorkerLine:
    level: LogLevel
    text: str


_LEVELS = {"debug": LogLevel.DEBUG, "info": LogLevel.INFO, "warning": LogLevel.WARNING,
           "warn": LogLevel.WARNING, "error": LogLevel.ERROR, "critical": LogLevel.ERROR}  # fmt: skip
_SKIPPED_FIELDS = frozenset({"ts", "level", "logger", "message", "exception"})


def parse_worker_line(line: str) -> WorkerLine:
    """A line of `--log-format json` output; anything else (a traceback, a plain line) is INFO text.
    Redacted here again: a line the worker printed before its logging was set up, or a library's
    own output, never went through the worker's redacting log filter."""
    stripped = line.rstrip("\n")
    try:
        entry = json.loads(stripped)
    except ValueError:
        return WorkerLine(LogLevel.INFO, redact_text(stripped))
    if not isinstance(entry, dict) or "message" not in entry:
        return WorkerLine(LogLevel.INFO, redact_text(stripped))
    level = _LEVELS.get(str(entry.get("level", "info")).lower(), LogLevel.INFO)
    text = str(entry["message"])
    extras = [f"{k}={v}" for k, v in entry.items() if k not in _SKIPPED_FIELDS]
    if extras:
        text += f" ({', '.join(extras)})"
    if entry.get("exception"):
        text += f"\n{entry['exception']}"
    return WorkerLine(level, redact_text(text))


def last_error(lines: Sequence[WorkerLine]) -> str:
    """The worker's own one-line reason: its last ERROR line (first line of it), else its last line."""
    errors = [line for line in lines if line.level is LogLevel.ERROR]
    chosen = errors[-1] if errors else (lines[-1] if lines else None)
    return chosen.text.splitlines()[0] if chosen and chosen.text else "no output"


def worker_command(extra_args: Sequence[str] = ()) -> list[str]:
    """The installed `bottledwater` next to this interpreter (the venv's), else the one on PATH."""
    beside = Path(sys.executable).parent / WORKER_EXECUTABLE
    found = str(beside) if beside.exists() else shutil.which(WORKER_EXECUTABLE)
    if found is None:
        raise FileNotFoundError(
            f"no {WORKER_EXECUTABLE} executable next to {sys.executable} or on PATH: "
            "install the project (pip install -e .) in the code location's environment"
        )
    return die_with_parent([found, "--log-format", "json", *extra_args])


def die_with_parent(command: Sequence[str]) -> list[str]:
    """`command` behind util-linux `setpriv --pdeathsig TERM` where there is one (Linux): if the
    Dagster run process dies (kill -9, OOM), the worker gets SIGTERM and shuts down cleanly instead
    of streaming on, orphaned, holding the slot that the relaunched worker needs. (A preexec_fn
    calling prctl would do the same but is unsafe in a process that runs threads, as Dagster's do.)"""
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return list(command)
    return [setpriv, "--pdeathsig", "TERM", "--", *command]


def run_worker(
    command: Sequence[str],
    env: Mapping[str, str],
    on_line: Callable[[WorkerLine], None],
    on_start: Callable[[int], None] = lambda pid: None,
) -> int:
    """Run `command` until it exits; returns its exit code (negative: killed by that signal).

    Any exception while waiting (the Dagster run being terminated raises one in this thread) stops
    the child with SIGTERM, then SIGKILL after `STOP_TIMEOUT_S`, and is re-raised.
    """
    proc = subprocess.Popen(
        list(command),
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
        errors="replace",
    )
    on_start(proc.pid)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.strip():
                on_line(parse_worker_line(line))
        return proc.wait()
    except BaseException:
        stop(proc)
        raise


def stop(proc: subprocess.Popen[str]) -> int:
    """SIGTERM, and SIGCONT so that a frozen (SIGSTOPped) worker handles it now instead of sitting
    on it until the SIGKILL; SIGKILL after `STOP_TIMEOUT_S`."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        proc.send_signal(signal.SIGCONT)
        try:
            return proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait()
