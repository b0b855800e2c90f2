"""A Spark standalone cluster on loopback: one master and one worker, from the pyspark distribution's
own jars (`org.apache.spark.deploy.master.Master` / `...worker.Worker`, what sbin/start-master.sh
runs, started as our own child processes rather than through the daemon scripts), for
`bw-stack spark-cluster up` and the tests that submit work to it.

Optional and off by default: the jobs run on `local[2]` everywhere else. Memory is capped (the
daemons 256 MB each, the worker offers 1 core and 1 GB to executors) because the development
machine is small and shared.

The cluster is one per stack home and port set, shared by everyone who uses that checkout: two
starts interleaving on its pid files launched two masters and had one caller stop the other's
daemons, which the other then reported as "exited during start-up". So every start, stop and use
(`using`) holds an exclusive lock on `run/spark-cluster.lock`, a start checks every port before
launching anything, start-up watches the child it launched (its exit status, not a pid file), and
a stop also ends any daemon of ours whose pid file was lost, found by its class and ports.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from stack import java, process
from stack.config import StackConfig, _port
from stack.errors import StackError
from stack.install import say
from stack.services import PROBE_TIMEOUT_S, Service

DAEMON_HEAP = "256m"
WORKER_CORES = 1
WORKER_MEMORY = "1g"
CLUSTER_UP_TIMEOUT_S = 120.0
# How long a start, a stop or a test waits for another user of the cluster to finish with it.
LOCK_TIMEOUT_S = 1200.0
READY_POLL_S = 0.5
LOG_TAIL_CHARS = 400
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
SCALA_VERSION = "2.13"
# All the daemons take from the caller's environment. The rest (SPARK_CONF_DIR, SPARK_HOME,
# PYSPARK_*, CLASSPATH, JAVA_TOOL_OPTIONS, _JAVA_OPTIONS, JDK_JAVA_OPTIONS: whatever a shell or a
# test session has set) would change what the daemons, and the executors they launch, run.
INHERITED_ENV = ("PATH", "HOME", "USER", "LANG", "LC_ALL", "TZ", "TMPDIR")


def spark_home() -> Path:
    """The pyspark distribution: its jars/ hold Spark itself, and executors are launched from it."""
    import pyspark

    return Path(pyspark.__file__).parent


def _java() -> str:
    found = java.find_java(java.KAFKA_MIN_JAVA)
    if found is None:
        raise StackError("no Java found: run `bw-stack install`, or set BW_STACK_JAVA")
    return found


class _SparkDaemon(Service):
    main_class: str

    def arguments(self) -> list[str]:
        raise NotImplementedError

    @property
    def marker(self) -> str:
        """What only this daemon's command line holds: its class and its own ports."""
        return " ".join([self.main_class, *self.arguments()])

    def _command(self, java_bin: str) -> list[str]:
        # The REST submission server (port 6066, unauthenticated) is not needed: jobs are submitted
        # through the master's RPC port.
        jvm = [f"-Xmx{DAEMON_HEAP}", "-Dspark.master.rest.enabled=false"]
        return [java_bin, *jvm, "-cp", f"{spark_home() / 'jars'}/*", self.main_class, *self.arguments()]

    def _environment(self, java_bin: str) -> dict[str, str]:
        # Executors are started by the worker from SPARK_HOME with JAVA_HOME's java (else the one
        # on PATH, possibly too old): the daemons' own. The launcher reads the Scala version from
        # the environment (spark-class's load-spark-env.sh sets it) and otherwise looks for a
        # source build's directories, which pyspark has not.
        kept = {name: os.environ[name] for name in INHERITED_ENV if name in os.environ}
        return {
            **kept,
            "JAVA_HOME": str(Path(java_bin).resolve().parent.parent),
            "SPARK_HOME": str(spark_home()),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_SCALA_VERSION": SCALA_VERSION,
        }

    def spawn(self) -> int:
        java_bin = _java()
        return process.spawn(
            self._command(java_bin),
            self.log_file,
            self.cfg.pid_file(self.name),
            env=self._environment(java_bin),
        )

    def launch(self) -> None:
        self.spawn()

    def pid(self) -> int | None:
        return process.read_pid(self.cfg.pid_file(self.name), self.marker)

    def running(self) -> set[int]:
        """Its pid-file pid and any other process running this daemon: one a lost race left."""
        pids = set(process.pids_running(self.marker))
        recorded = self.pid()
        return pids | {recorded} if recorded is not None else pids

    def stop(self) -> None:
        for pid in sorted(self.running()):
            process.terminate(pid)

    def installed(self) -> bool:
        return (spark_home() / "jars").is_dir()

    @property
    def master_ui_port(self) -> int:
        return _port("BW_STACK_SPARK_MASTER_UI_PORT", 18080)

    def master_state(self) -> dict[str, object] | None:
        try:
            url = f"http://127.0.0.1:{self.master_ui_port}/json/"
            with urllib.request.urlopen(url, timeout=PROBE_TIMEOUT_S) as response:
                state: dict[str, object] = json.load(response)
                return state
        except (OSError, ValueError):
            return None


class SparkMaster(_SparkDaemon):
    name = "spark-master"
    port_env_var = "BW_STACK_SPARK_MASTER_PORT"
    main_class = MASTER_CLASS

    @property
    def port(self) -> int:
        return _port(self.port_env_var, 7077)

    @property
    def address(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def arguments(self) -> list[str]:
        return ["--host", "127.0.0.1", "--port", str(self.port), "--webui-port", str(self.master_ui_port)]

    def healthy(self) -> bool:
        state = self.master_state()
        # The URL too: whatever answers on the UI port must be this master, not another one.
        return state is not None and state.get("status") == "ALIVE" and state.get("url") == self.address


class SparkWorker(_SparkDaemon):
    name = "spark-worker"
    port_env_var = "BW_STACK_SPARK_WORKER_UI_PORT"
    main_class = WORKER_CLASS

    def __init__(self, cfg: StackConfig, master: SparkMaster) -> None:
        super().__init__(cfg)
        self.master = master

    @property
    def port(self) -> int:
        return _port(self.port_env_var, 18081)

    @property
    def address(self) -> str:
        return f"worker of {self.master.address}"

    @property
    def work_dir(self) -> Path:
        return self.cfg.home / "spark-cluster" / "work"

    def arguments(self) -> list[str]:
        return [
            self.master.address, "--host", "127.0.0.1", "--webui-port", str(self.port),
            "--cores", str(WORKER_CORES), "--memory", WORKER_MEMORY, "--work-dir", str(self.work_dir),
        ]  # fmt: skip

    def spawn(self) -> int:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        return super().spawn()

    def healthy(self) -> bool:
        """Registered with the master, as this worker (its UI port), and ALIVE there."""
        if not self.master.healthy():
            return False
        state = self.master.master_state()
        workers = state.get("workers", []) if state else []
        return isinstance(workers, list) and any(
            isinstance(w, dict)
            and w.get("state") == "ALIVE"
            and str(w.get("webuiaddress", "")).endswith(f":{self.port}")
            for w in workers
        )


def cluster_services(cfg: StackConfig) -> list[_SparkDaemon]:
    master = SparkMaster(cfg)
    return [master, SparkWorker(cfg, master)]


@contextlib.contextmanager
def _locked(cfg: StackConfig, timeout_s: float = LOCK_TIMEOUT_S) -> Iterator[None]:
    """The cluster's lock: one start, stop or use at a time, across processes."""
    cfg.run_dir.mkdir(parents=True, exist_ok=True)
    path = cfg.run_dir / "spark-cluster.lock"
    with path.open("a") as lock:
        deadline = time.monotonic() + timeout_s
        waited = False
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not waited:
                    say(f"waiting for the Spark cluster's other user to finish (it holds {path})")
                    waited = True
                if time.monotonic() > deadline:
                    raise StackError(
                        f"the Spark cluster is still in use by another process after {timeout_s:.0f}s "
                        f"(it holds {path}): wait for it to finish, or stop it"
                    ) from None
                time.sleep(READY_POLL_S)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _is_up(services: list[_SparkDaemon]) -> bool:
    return all(s.pid() is not None for s in services) and services[-1].healthy()


def _log_tail(log_file: Path, offset: int) -> str:
    try:
        with log_file.open("rb") as log:
            log.seek(offset)
            said = log.read().decode(errors="replace")
    except OSError:
        return "no log"
    lines = [line.strip() for line in said.splitlines() if line.strip()]
    return " | ".join(lines)[-LOG_TAIL_CHARS:] or "no output"


def _start(services: list[_SparkDaemon]) -> None:
    for service in services:
        process.refuse_busy_port(service.port, service.name, service.port_env_var)
    master = services[0]
    process.refuse_busy_port(master.master_ui_port, master.name, "BW_STACK_SPARK_MASTER_UI_PORT")
    for service in services:
        if not service.installed():
            raise StackError(f"{service.name} is not installed: run `make install` (pyspark) first")
        offset = service.log_file.stat().st_size if service.log_file.exists() else 0
        pid = service.spawn()
        deadline = time.monotonic() + CLUSTER_UP_TIMEOUT_S
        while not service.healthy():
            status = process.exit_status(pid)
            if status is not None:
                raise StackError(
                    f"{service.name} exited with status {status} during start-up "
                    f"({_log_tail(service.log_file, offset)}): see {service.log_file}"
                )
            if time.monotonic() > deadline:
                raise StackError(
                    f"{service.name} did not become healthy within {CLUSTER_UP_TIMEOUT_S:.0f}s: "
                    f"see {service.log_file}"
                )
            time.sleep(READY_POLL_S)


def _up_locked(cfg: StackConfig) -> tuple[str, bool]:
    services = cluster_services(cfg)
    if _is_up(services):
        return services[0].address, False
    _down_locked(services)  # a half-started cluster, or daemons a lost pid file left running
    try:
        _start(services)
    except BaseException:
        _down_locked(services)
        raise
    return services[0].address, True


def _down_locked(services: list[_SparkDaemon]) -> None:
    for service in reversed(services):
        service.stop()


def up(cfg: StackConfig) -> str:
    """Start the master and its worker (idempotent) and wait until the worker registered; returns
    the master URL for `--master`. A start that fails stops what it started and says why."""
    with _locked(cfg):
        return _up_locked(cfg)[0]


def down(cfg: StackConfig) -> None:
    with _locked(cfg):
        _down_locked(cluster_services(cfg))


@contextlib.contextmanager
def using(cfg: StackConfig) -> Iterator[str]:
    """The cluster for the duration of the block, with no other start, stop or use meanwhile; yields
    the master URL. A cluster that was up before (`bw-stack spark-cluster up`) is left up; one
    started here is stopped at the end, even after a failure, leaving no JVM behind."""
    with _locked(cfg):
        address, started = _up_locked(cfg)
        try:
            yield address
        finally:
            if started:
                _down_locked(cluster_services(cfg))
