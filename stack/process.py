"""Starting, finding and stopping the stack's background processes through pid files."""

from __future__ import annotations

import contextlib
import os
import pwd
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from stack.errors import StackError

STOP_TIMEOUT_S = 30.0
# How long `spawn` waits for a child's exec to finish (normally well under a millisecond).
EXEC_TIMEOUT_S = 5.0
POLL_INTERVAL_S = 0.2


def read_pid(pid_file: Path, cmdline_marker: str) -> int | None:
    """The live pid in `pid_file`, if its command line still contains `cmdline_marker`.

    The marker guards against a stale pid file whose pid now belongs to an unrelated process.
    """
    try:
        pid = int(pid_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None
    return pid if cmdline_marker in cmdline else None


def pids_running(cmdline_marker: str) -> list[int]:
    """Every live process whose command line contains `cmdline_marker`: a daemon of ours whose pid
    file was lost or overwritten, found by what it runs (its class and ports), not by a pid."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # gone meanwhile
            continue
        if cmdline_marker in cmdline and _alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def exit_status(pid: int) -> int | None:
    """How a child of this process ended (negative: the signal that killed it), None while it
    runs. Asks the kernel about our own child, so no pid file or /proc read can mislead it."""
    try:
        done, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:  # not our child, or reaped already: it is not running as ours
        return 0 if not _alive(pid) else None
    if done == 0:
        return None
    return os.waitstatus_to_exitcode(status)


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def refuse_busy_port(port: int, service: str, env_var: str) -> None:
    if port_open(port):
        raise StackError(
            f"port {port} is in use by another process, so {service} cannot start: "
            f"stop that process or set {env_var} to a free port"
        )


def spawn(
    cmd: Sequence[str],
    log_file: Path,
    pid_file: Path,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> int:
    """Start `cmd` in its own session (so `down` can signal its whole group), output to `log_file`."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    pid_file.parent.mkdir(parents=True, exist_ok=True)
    with log_file.open("ab") as log:
        proc = subprocess.Popen(
            list(cmd),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            start_new_session=True,
        )
    _wait_until_exec_done(proc.pid)
    pid_file.write_text(f"{proc.pid}\n")
    return proc.pid


def _wait_until_exec_done(pid: int) -> None:
    """Until the child's command line can be read. Popen returns once the kernel has closed the
    child's close-on-exec pipe, which happens before the new program's arguments are set up: for
    a moment (longer on a loaded machine) /proc/<pid>/cmdline is empty and `read_pid` took a live
    daemon for a dead one (the Spark cluster's start-up check, in full CI runs)."""
    deadline = time.monotonic() + EXEC_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes() or _state(pid) in (None, "Z"):
                return
        except OSError:  # gone: the caller's health check says so
            return
        time.sleep(0.001)


def terminate(pid: int, timeout_s: float = STOP_TIMEOUT_S) -> None:
    """SIGTERM the process group, wait, then SIGKILL whatever is left: no orphans."""
    terminate_together([pid], timeout_s)


def terminate_together(pids: Sequence[int], timeout_s: float = STOP_TIMEOUT_S) -> None:
    """`terminate` for processes that must stop at once: all SIGTERMed, then one deadline. Nodes
    of one cluster stopped one after the other wait on each other (a Kafka broker's controlled
    shutdown asks a controller quorum that its earlier peers took away) until the SIGKILL."""
    groups: dict[int, int] = {}
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            groups[pid] = os.getpgid(pid)
    for pgid in groups.values():
        _signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not any(_alive(pid) for pid in groups):
            break
        time.sleep(POLL_INTERVAL_S)
    for pid, pgid in groups.items():
        _signal_group(pgid, signal.SIGKILL)
        _reap(pid)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _alive(pid: int) -> bool:
    _reap(pid)
    state = _state(pid)
    return state is not None and state != "Z"


def _state(pid: int) -> str | None:
    """The process's state letter (R, S, Z...), None when there is no such process."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def wait_until(check: Callable[[], bool], timeout_s: float, what: str, log_file: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(POLL_INTERVAL_S * 5)
    raise StackError(f"{what} did not become healthy within {timeout_s:.0f}s: see {log_file}")


def run_as(
    user: str | None, cmd: Sequence[str], timeout_s: float = 120.0
) -> subprocess.CompletedProcess[str]:
    """Run `cmd` as `user` when we are root (Postgres refuses to run as root), else as ourselves."""
    full = ["runuser", "-u", user, "--", *cmd] if user and os.geteuid() == 0 else list(cmd)
    return subprocess.run(full, capture_output=True, text=True, timeout=timeout_s)


# How much of a failed command's output an error line carries: its end, where the reason is.
OUTPUT_TAIL_CHARS = 600
# Lines every JVM tool of the stack prints to stderr and that never explain a failure.
_NOISE_PREFIXES = ("SLF4J:",)


def output_of(result: subprocess.CompletedProcess[str]) -> str:
    """What a command said, stderr then stdout, on one line, its tail: Java tools (Kafka's
    StorageTool among them) print their errors on stderr and their progress on stdout."""
    lines = [
        line.strip()
        for stream in (result.stderr or "", result.stdout or "")
        for line in stream.splitlines()
        if line.strip() and not line.strip().startswith(_NOISE_PREFIXES)
    ]
    said = " | ".join(lines)[-OUTPUT_TAIL_CHARS:]
    return f"exit code {result.returncode}: {said}" if said else f"exit code {result.returncode}, no output"


def run_retrying_once(
    user: str | None,
    cmd: Sequence[str],
    what: str,
    *,
    retry_cmd: Sequence[str] | None = None,
    say: Callable[[str], None] = lambda line: print(line, file=sys.stderr),
) -> subprocess.CompletedProcess[str]:
    """Run `cmd`; if it fails, say why and run it (or `retry_cmd`) once more, because a first start
    on a fresh machine meets transient failures (a JVM short of memory while others start). A
    second failure raises `StackError` with everything the command printed."""
    result = run_as(user, cmd)
    if result.returncode == 0:
        return result
    say(f"bw-stack: {what} failed ({output_of(result)}); retrying once")
    result = run_as(user, retry_cmd or cmd)
    if result.returncode != 0:
        raise StackError(f"{what} failed twice ({output_of(result)})")
    return result


def reachable_by(user: str, path: Path) -> bool:
    """Whether `user` may traverse every directory down to `path` (which may not exist yet)."""
    if os.geteuid() != 0:
        return True
    entry = pwd.getpwnam(user)
    groups = set(os.getgrouplist(user, entry.pw_gid))
    for directory in [*reversed(path.parents), path]:
        if not directory.exists():
            break
        st = directory.stat()
        if st.st_uid == entry.pw_uid:
            allowed = st.st_mode & stat.S_IXUSR
        elif st.st_gid in groups:
            allowed = st.st_mode & stat.S_IXGRP
        else:
            allowed = st.st_mode & stat.S_IXOTH
        if not allowed:
            return False
    return True


def chown_to(user: str, *paths: Path) -> None:
    if os.geteuid() != 0:
        return
    entry = pwd.getpwnam(user)
    for path in paths:
        os.chown(path, entry.pw_uid, entry.pw_gid)
