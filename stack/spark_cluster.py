"""A Spark standalone cluster on loopback: one master and one worker, from the pyspark distribution's
own jars (`org.apache.spark.deploy.master.Master` / `...worker.Worker`, what sbin/start-master.sh
runs), for `bw-stack spark-cluster up` and the test that submits the merge to it.

Optional and off by default: the jobs run on `local[2]` everywhere else. Memory is capped (the
daemons 256 MB each, the worker offers 1 core and 1 GB to executors) because the development
machine is small and shared.
"""

from __future__ import annotations

import json
import os
import urllib.request
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
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
SCALA_VERSION = "2.13"


def spark_home() -> Path:
    """The pyspark distribution: its jars/ hold Spark itself, and executors are launched from it."""
    import pyspark

    return Path(pyspark.__file__).parent


class _SparkDaemon(Service):
    main_class: str

    def _command(self, *args: str) -> list[str]:
        found = java.find_java(java.KAFKA_MIN_JAVA)
        if found is None:
            raise StackError("no Java found: run `bw-stack install`, or set BW_STACK_JAVA")
        home = spark_home()
        return [found, f"-Xmx{DAEMON_HEAP}", "-cp", f"{home / 'jars'}/*", self.main_class, *args]

    def _environment(self) -> dict[str, str]:
        # Executors are started by the worker from SPARK_HOME; everything binds to loopback. The
        # launcher reads the Scala version from the environment (spark-class's load-spark-env.sh
        # sets it) and otherwise looks for a source build's directories, which pyspark has not.
        return {
            **os.environ,
            "SPARK_HOME": str(spark_home()),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_SCALA_VERSION": SCALA_VERSION,
        }

    def pid(self) -> int | None:
        return process.read_pid(self.cfg.pid_file(self.name), self.main_class)

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
        except OSError:
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

    def launch(self) -> None:
        args = ["--host", "127.0.0.1", "--port", str(self.port), "--webui-port", str(self.master_ui_port)]
        process.spawn(
            self._command(*args), self.log_file, self.cfg.pid_file(self.name), env=self._environment()
        )

    def healthy(self) -> bool:
        state = self.master_state()
        return state is not None and state.get("status") == "ALIVE"


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

    def launch(self) -> None:
        work = self.cfg.home / "spark-cluster" / "work"
        work.mkdir(parents=True, exist_ok=True)
        args = [
            self.master.address, "--host", "127.0.0.1", "--webui-port", str(self.port),
            "--cores", str(WORKER_CORES), "--memory", WORKER_MEMORY, "--work-dir", str(work),
        ]  # fmt: skip
        process.spawn(
            self._command(*args), self.log_file, self.cfg.pid_file(self.name), env=self._environment()
        )

    def healthy(self) -> bool:
        state = self.master.master_state()
        workers = state.get("workers", []) if state else []
        return isinstance(workers, list) and any(w.get("state") == "ALIVE" for w in workers)


def cluster_services(cfg: StackConfig) -> list[Service]:
    master = SparkMaster(cfg)
    return [master, SparkWorker(cfg, master)]


def up(cfg: StackConfig) -> str:
    """Start the master and its worker (idempotent) and wait until the worker registered; returns the
    master URL for `--master`. A start that fails (a daemon gone during start-up, seen once in a
    full CI run on a loaded machine) is retried once from scratch, with the reason said."""
    try:
        return _start_cluster(cfg)
    except StackError as exc:
        say(f"the Spark cluster did not come up ({exc}); stopping it and starting it once more")
        down(cfg)
        return _start_cluster(cfg)


def _start_cluster(cfg: StackConfig) -> str:
    services = cluster_services(cfg)
    for service in services:
        service.start()
        service.wait_healthy(CLUSTER_UP_TIMEOUT_S)
    return services[0].address


def down(cfg: StackConfig) -> None:
    for service in reversed(cluster_services(cfg)):
        service.stop()
