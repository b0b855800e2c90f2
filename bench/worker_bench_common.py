"""What the worker benchmarks share: a scratch database, the real `bottledwater` process, waiting
for the slot to catch up, cleanup of topics, and a description of the machine.

Addresses come from the product's own variables (`eval "$(bw-stack env)"`), defaulting to the
local stack's. Every benchmark prints figures and ratios to a baseline measured in the same run and
asserts nothing.
"""

from __future__ import annotations

import os
import platform
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg2
from confluent_kafka.admin import AdminClient, NewTopic
from psycopg2 import sql

POSTGRES = os.environ.get("BOTTLEDWATER_POSTGRES", "postgresql://postgres@127.0.0.1:55432/postgres")
BROKER = os.environ.get("BOTTLEDWATER_BROKER", "127.0.0.1:9092")
REGISTRY = os.environ.get("BOTTLEDWATER_SCHEMA_REGISTRY", "http://127.0.0.1:8081/apis/ccompat/v7")
BOTTLEDWATER = str(Path(sys.executable).parent / "bottledwater")
PG_BIN = Path("/usr/lib/postgresql/15/bin")
_LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


def dsn_for(dbname: str) -> str:
    return POSTGRES.rsplit("/", 1)[0] + "/" + dbname


def execute(dsn: str, *statements: Any) -> None:
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            for statement in statements:
                if isinstance(statement, tuple):
                    cur.execute(*statement)
                else:
                    cur.execute(statement)
    finally:
        conn.close()


def scalar(dsn: str, statement: Any, params: Any = None) -> Any:
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute(statement, params)
            row = cur.fetchone()
            return None if row is None else row[0]
    finally:
        conn.close()


@contextmanager
def scratch_database(prefix: str = "bench") -> Iterator[str]:
    """A new database; dropped afterwards with any slot left in it."""
    name = unique(prefix)
    execute(POSTGRES, sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield dsn_for(name)
    finally:
        execute(
            POSTGRES,
            (
                "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE database = %s "
                "AND active_pid IS NOT NULL",
                (name,),
            ),
        )
        time.sleep(0.5)
        execute(
            POSTGRES,
            (
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = %s",
                (name,),
            ),
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)),
        )


def lsn_of(text: str) -> int:
    high, low = text.split("/")
    return (int(high, 16) << 32) | int(low, 16)


def current_lsn(dsn: str) -> int:
    return lsn_of(scalar(dsn, "SELECT pg_current_wal_lsn()::text"))


def confirmed_flush(dsn: str, slot: str) -> int:
    text = scalar(
        dsn, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s", (slot,)
    )
    return lsn_of(text) if text else 0


def wait_caught_up(dsn: str, slot: str, target: int | None = None, timeout: float = 3600.0) -> float:
    """Wait until the slot acknowledged `target` (default: the WAL position now); returns when."""
    goal = current_lsn(dsn) if target is None else target
    deadline = time.monotonic() + timeout
    while confirmed_flush(dsn, slot) < goal:
        if time.monotonic() > deadline:
            raise TimeoutError(f"slot {slot} did not reach {goal} within {timeout}s")
        time.sleep(0.05)
    return time.monotonic()


def stat_cpu_seconds(stat: Path, *, with_children: bool = False) -> float:
    """User + system CPU seconds from a `/proc/<pid>/stat` (or a thread's `task/<tid>/stat`) file,
    with those of the process's waited-for children if asked. The fields are counted after the
    command name's closing parenthesis: the name itself may hold spaces and parentheses."""
    fields = stat.read_text().rsplit(")", 1)[1].split()
    ticks = fields[11:15] if with_children else fields[11:13]
    return sum(int(f) for f in ticks) / os.sysconf("SC_CLK_TCK")


class Worker:
    """`bottledwater` as a subprocess with its log in a file."""

    def __init__(
        self, dsn: str, slot: str, prefix: str, *extra: str, log_dir: Path, profile: Path | None = None
    ) -> None:
        """`profile`: run the worker under cProfile, which writes its stats there when it stops."""
        self.log_path = log_dir / f"{slot}.log"
        args = [BOTTLEDWATER, "-d", dsn, "-s", slot, "-p", prefix, "-b", BROKER, "-r", REGISTRY, *extra]
        if profile is not None:
            args = [sys.executable, "-m", "cProfile", "-o", str(profile), *args]
        self.started = time.monotonic()
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        self.prefix = prefix

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_log(self, text: str, timeout: float = 3600.0) -> str:
        """The first log line containing `text`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.log().splitlines():
                if text in line:
                    return line
            if self.process.poll() is not None:
                raise RuntimeError(f"worker exited {self.process.returncode}:\n{self.log()[-3000:]}")
            time.sleep(0.05)
        raise TimeoutError(f"{text!r} not logged within {timeout}s")

    def peak_rss_mb(self) -> float:
        """The process's peak resident set (VmHWM), in MB."""
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        match = re.search(r"VmHWM:\s+(\d+) kB", status)
        return int(match.group(1)) / 1024 if match else float("nan")

    def cpu_seconds(self) -> float:
        """User + system CPU time the worker process has used so far, with that of its ended child
        processes (the snapshot's readers)."""
        return stat_cpu_seconds(Path(f"/proc/{self.process.pid}/stat"), with_children=True)

    def thread_cpu_seconds(self) -> dict[str, float]:
        """User + system CPU time of the worker's live threads so far, summed by thread name with
        its digits dropped (librdkafka's `rdk:broker1`, `rdk:broker-1` -> `rdk:broker`; the Python
        main thread is named after the program)."""
        totals: dict[str, float] = {}
        for task in Path(f"/proc/{self.process.pid}/task").iterdir():
            with suppress(OSError):
                name = re.sub(r"-?\d+$", "", (task / "comm").read_text().strip())
                totals[name] = totals.get(name, 0.0) + stat_cpu_seconds(task / "stat")
        return totals

    def cpu_wait_seconds(self) -> float:
        """Time the worker's threads spent runnable but waiting for a CPU (schedstat), so far: on a
        shared machine, how much of the wall time others' load took from it."""
        total = 0
        for task in Path(f"/proc/{self.process.pid}/task").iterdir():
            with suppress(OSError):
                total += int((task / "schedstat").read_text().split()[1])
        return total / 1e9

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(120)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(30)


def log_time(line: str) -> datetime:
    match = _LOG_TIME.match(line)
    if match is None:
        raise ValueError(f"no timestamp in {line!r}")
    return datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f")


def create_topic(name: str, partitions: int) -> None:
    """A topic for a baseline that produces outside the worker (topic auto-creation is off)."""
    admin = AdminClient({"bootstrap.servers": BROKER})
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(60)


def delete_topics(prefix: str) -> None:
    admin = AdminClient({"bootstrap.servers": BROKER})
    names = [t for t in admin.list_topics(timeout=10).topics if t.startswith(prefix + ".")]
    if names:
        for future in admin.delete_topics(names, operation_timeout=60).values():
            with suppress(Exception):
                future.result(60)


def machine() -> str:
    """One line about the machine: CPU model and count, memory, Python, Postgres."""
    model = "unknown CPU"
    with suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    memory = "?"
    with suppress(OSError):
        kb = int(re.search(r"MemTotal:\s+(\d+)", Path("/proc/meminfo").read_text()).group(1))  # type: ignore[union-attr]
        memory = f"{kb / 1024 / 1024:.0f} GB"
    server = scalar(POSTGRES, "SHOW server_version")
    return (
        f"{model}, {os.cpu_count()} cores, {memory} RAM, {platform.python_implementation()} "
        f"{platform.python_version()}, Postgres {server}"
    )


def result(bench: str, **figures: object) -> None:
    """The machine-readable last line every benchmark ends with: `RESULT bench=... name=value ...`,
    the load average last (compare runs taken under similar load)."""
    fields = " ".join(f"{name}={value:.3f}" if isinstance(value, float) else f"{name}={value}"
                      for name, value in figures.items())  # fmt: skip
    print(f"RESULT bench={bench} {fields} load1={os.getloadavg()[0]:.2f}")


def report(title: str, rows: list[tuple[str, str]]) -> None:
    print(f"\n== {title}")
    print(f"   machine: {machine()}")
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"   {name.ljust(width)}  {value}")
