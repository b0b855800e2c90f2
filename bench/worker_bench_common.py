"""What the worker benchmarks share: a scratch database, the real `bottledwater` process, waiting
for the slot to catch up, cleanup of topics, and a description of the machine.

Addresses come from the product's own variables (`eval "$(bw-stack env)"`), defaulting to the
local stack's. Every benchmark prints figures and ratios to a baseline measured in the same run and
asserts nothing.

The worker, Postgres and the Kafka broker share this machine's cores, so the worker benchmarks also
read what Postgres (every backend of the cluster) and the broker (its JVM, every thread) spent in a
run's window (`StackCpu`), and from the CPU per change of all three the rate the cores can carry at
most (`core_bound`, `us_left_at`). That needs both on this machine: the local stack.
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
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg2
from confluent_kafka.admin import AdminClient, NewTopic
from psycopg2 import sql

from stack.config import StackConfig
from stack.process import read_pid

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
def scratch_database(prefix: str = "bench", server: str = POSTGRES) -> Iterator[str]:
    """A new database on `server` (the stack's by default); dropped afterwards with any slot left in it."""
    name = unique(prefix)
    execute(server, sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield server.rsplit("/", 1)[0] + "/" + name
    finally:
        execute(
            server,
            (
                "SELECT pg_terminate_backend(active_pid, 10000) FROM pg_replication_slots "
                "WHERE database = %s AND active_pid IS NOT NULL",
                (name,),
            ),
        )
        execute(
            server,
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
    poll_slot(
        dsn,
        slot,
        "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
        lambda flushed: flushed is not None and lsn_of(flushed) >= goal,
        timeout=timeout,
        failure=f"slot {slot} did not reach {goal} within {timeout}s",
        interval=0.05,
    )
    return time.monotonic()


def poll_slot(
    dsn: str,
    slot: str,
    query: str,
    done: Callable[[Any], bool],
    *,
    timeout: float,
    failure: str,
    interval: float,
) -> None:
    """Run `query` (one value of `slot`'s row in pg_replication_slots, None when there is none)
    every `interval` seconds until `done(value)`; TimeoutError(`failure`) after `timeout`.

    It polls over one connection: a connection per poll would fork a backend 20 times a second,
    CPU that would land in Postgres' share of the window (`StackCpu`)."""
    deadline = time.monotonic() + timeout
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            while True:
                cur.execute(query, (slot,))
                row = cur.fetchone()
                if done(None if row is None else row[0]):
                    return
                if time.monotonic() > deadline:
                    raise TimeoutError(failure)
                time.sleep(interval)
    finally:
        conn.close()


def stat_cpu_seconds(stat: Path, *, with_children: bool = False) -> float:
    """User + system CPU seconds from a `/proc/<pid>/stat` (or a thread's `task/<tid>/stat`) file,
    with those of the process's waited-for children if asked."""
    ticks = _stat_ticks(stat)
    return sum(ticks if with_children else ticks[:2]) / os.sysconf("SC_CLK_TCK")


def _stat_ticks(stat: Path) -> tuple[int, int, int, int]:
    """utime, stime, cutime, cstime (clock ticks) from a `/proc/.../stat` file."""
    fields = _stat_fields(stat)
    utime, stime, cutime, cstime = (int(f) for f in fields[11:15])
    return utime, stime, cutime, cstime


@dataclass(frozen=True)
class CpuSample:
    """CPU seconds used so far by the Postgres cluster and by the Kafka broker; subtract two samples
    for what a window cost."""

    postgres: float
    broker: float

    def __sub__(self, earlier: CpuSample) -> CpuSample:
        return CpuSample(self.postgres - earlier.postgres, self.broker - earlier.broker)


@dataclass(frozen=True)
class StackCpu:
    """The CPU the Postgres cluster and the Kafka broker spend, read from /proc, so a benchmark can
    say what each costs per change next to the worker's own CPU.

    Postgres: the postmaster's own CPU and that of its reaped children (cutime and cstime: a backend
    that ended, such as a walsender whose client disconnected or a COPY's backend, is reaped by the
    postmaster and its CPU moves there), plus its live children's CPU. A before/after difference
    thus counts every backend's CPU in the window, even one born and ended inside it. The broker:
    the JVM process, all its threads.

    Both are whole-cluster and whole-broker figures, so they include what else runs there: the
    checkpointer, the WAL writer, the autovacuum launcher and its workers, the schema registry's
    connections (it keeps its schemas in this Postgres) and Dagster's when it runs (its storage is
    there too), the broker's housekeeping (log flushes, the group coordinator, metadata). The
    benchmarks keep that small: each scratch database holds one table of the bench's, with
    autovacuum off or vacuumed before the windows, a CHECKPOINT precedes the windows, slot polls
    share one connection (`wait_caught_up`), and no other benchmark or integration test runs at the
    same time (the shared lock). The broker's CPU in a window where nothing is produced shows what
    its housekeeping alone costs (0.01-0.02 s per second here).
    """

    postmaster: int
    broker: int

    @classmethod
    def locate(cls, dsn: str) -> StackCpu:
        """Find the postmaster behind `dsn` and the local stack's broker; both must run on this
        machine."""
        return cls(postmaster_pid(dsn), broker_pid())

    def sample(self) -> CpuSample:
        return CpuSample(postgres_cpu_seconds(self.postmaster), broker_cpu_seconds(self.broker))


def postmaster_pid(dsn: str) -> int:
    """The postmaster's pid: the first line of `postmaster.pid` in the data directory, or, when
    that file cannot be read (a cluster run by another OS user), the parent of this connection's
    backend."""
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT current_setting('data_directory'), pg_backend_pid()")
            data_directory, backend = cur.fetchone()
            try:
                pid = int((Path(data_directory) / "postmaster.pid").read_text().split()[0])
            except (OSError, ValueError, IndexError):
                pid = int(_stat_fields(Path(f"/proc/{backend}/stat"))[1])
    except psycopg2.errors.InsufficientPrivilege:
        raise SystemExit(
            f"reading Postgres' CPU needs its data directory (SHOW data_directory): connect as a "
            f"superuser or a member of pg_read_all_settings ({dsn})"
        ) from None
    except OSError:
        raise SystemExit(
            f"Postgres at {dsn} does not run on this machine (no /proc entry for its backend): its "
            f"CPU can only be read locally; run the benchmark against the local stack"
        ) from None
    finally:
        conn.close()
    if "postgres" not in _command_line(pid):
        raise SystemExit(
            f"pid {pid}, the postmaster of {dsn} by its postmaster.pid or its backend's parent, is not "
            f"a running postgres here: run the benchmark on the machine that runs that cluster"
        )
    return pid


def broker_pid() -> int:
    """The local stack's Kafka broker (its pid file), refused if the benchmarks use another broker."""
    cfg = StackConfig.from_env()
    if cfg.kafka_bootstrap != BROKER:
        raise SystemExit(
            f"the broker's CPU is read from the local stack's, at {cfg.kafka_bootstrap}, but "
            f"BOTTLEDWATER_BROKER is {BROKER}: unset it or point it at the stack"
        )
    pid_file = cfg.pid_file("kafka")
    pid = read_pid(pid_file, "kafka")
    if pid is None:
        raise SystemExit(f"no running Kafka broker in {pid_file}: start the stack (.venv/bin/bw-stack up)")
    return pid


def postgres_cpu_seconds(postmaster: int) -> float:
    """CPU seconds of the whole cluster so far: the postmaster's own and reaped children's, plus
    its live children's (with their own reaped children, e.g. an archive command's).

    A child reaped while its siblings are read would be counted twice (live, then reaped) or not at
    all: the read is repeated until the postmaster's reaped-children time is the same before and
    after it."""
    stat = Path(f"/proc/{postmaster}/stat")
    tick = os.sysconf("SC_CLK_TCK")
    for _ in range(_CONSISTENT_READ_ATTEMPTS):
        before = _stat_ticks(stat)
        live = 0.0
        for child in _children(postmaster):
            with suppress(OSError):  # it ended since it was listed: it shows in `after`
                live += stat_cpu_seconds(Path(f"/proc/{child}/stat"), with_children=True)
        after = _stat_ticks(stat)
        if after[2:] == before[2:]:
            return sum(after) / tick + live
    raise RuntimeError(
        f"the postmaster ({postmaster}) reaped a backend during each of {_CONSISTENT_READ_ATTEMPTS} "
        f"reads of its children: is something connecting in a tight loop?"
    )


def broker_cpu_seconds(broker: int) -> float:
    """CPU seconds of the broker's JVM so far: the process's stat sums all its threads, ended ones
    included."""
    return stat_cpu_seconds(Path(f"/proc/{broker}/stat"), with_children=True)


_CONSISTENT_READ_ATTEMPTS = 20


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of a process with its reaped children, plus those of its live descendants (a
    process that ends while the tree is read may be missed or counted twice; the worker's readers
    end before "snapshot complete", when the bench reads)."""
    total = stat_cpu_seconds(Path(f"/proc/{pid}/stat"), with_children=True)
    for child in _children(pid):
        with suppress(OSError):
            total += tree_cpu_seconds(child)
    return total


def _children(pid: int) -> list[int]:
    """The pids of a process's live children: the kernel's per-thread `children` lists, or, on a
    kernel without them, every process whose parent is `pid`."""
    tasks = list(Path(f"/proc/{pid}/task").iterdir())
    if (tasks[0] / "children").exists():
        return [int(child) for task in tasks for child in (task / "children").read_text().split()]
    children = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with suppress(OSError):
                if int(_stat_fields(entry / "stat")[1]) == pid:
                    children.append(int(entry.name))
    return children


def _stat_fields(stat: Path) -> list[str]:
    """The fields of a `/proc/.../stat` file after the command name (state, ppid, ...), counted
    after the name's closing parenthesis: the name itself may hold spaces and parentheses."""
    return stat.read_text().rsplit(")", 1)[1].split()


def _command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def core_bound(cores: int, *us_per_item: float) -> float:
    """The most items per second `cores` CPUs can carry when each item costs the sum of
    `us_per_item` microseconds of CPU, whichever process spends it."""
    return cores / (sum(us_per_item) * 1e-6)


def us_left_at(cores: int, rate: float, *other_us_per_item: float) -> float:
    """The CPU microseconds per item left for one more process if `cores` CPUs are to carry `rate`
    items per second while the others spend `other_us_per_item`: negative when the others alone
    need more than the cores have at that rate."""
    return cores / rate * 1e6 - sum(other_us_per_item)


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
        processes and of its live descendants with theirs: the snapshot's readers are children of
        the worker's fork server, which lives as long as the worker."""
        return tree_cpu_seconds(self.process.pid)

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

    def main_thread_schedstat(self) -> tuple[float, float]:
        """The main thread's seconds so far on a CPU and runnable but waiting for one (schedstat);
        the rest of a window it slept, waiting for input (Postgres' messages, Kafka's reports)."""
        stat = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/schedstat").read_text().split()
        return int(stat[0]) / 1e9, int(stat[1]) / 1e9

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


def snapshot_window_seconds(dsn: str, slot: str, prefix: str, *args: str, log_dir: Path) -> float:
    """One worker's snapshot into fresh topics under `prefix`, timed between its own lines "snapshot
    of ..." and "snapshot complete" (start-up apart); the worker stopped and the topics deleted after."""
    worker = Worker(dsn, slot, prefix, *args, log_dir=log_dir)
    try:
        begin = log_time(worker.wait_log("snapshot of "))
        end = log_time(worker.wait_log("snapshot complete"))
    finally:
        worker.stop()
        delete_topics(prefix)
    return (end - begin).total_seconds()


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


def each_run(seconds: Sequence[float]) -> str:
    """Every run's seconds, in the order taken: "9.3, 9.1, 9.3 s"."""
    return ", ".join(f"{s:.1f}" for s in seconds) + " s"


def report(title: str, rows: list[tuple[str, str]]) -> None:
    print(f"\n== {title}")
    print(f"   machine: {machine()}")
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"   {name.ljust(width)}  {value}")
