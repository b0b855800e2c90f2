"""How `bw-stack spark-cluster` keeps its daemons apart from the caller and from other users of the
same stack: what they inherit, how each is recognised, the lock, and a child's exit status. The
cluster itself is started in tests/integration/test_spark_cluster.py."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from stack import process, spark_cluster
from stack.config import StackConfig
from stack.errors import StackError


@pytest.fixture
def cfg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> StackConfig:
    monkeypatch.setenv("BW_STACK_HOME", str(tmp_path))
    return StackConfig.from_env()


def test_the_daemons_inherit_no_spark_python_or_jvm_settings_of_the_caller(
    cfg: StackConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    leaked = {
        "SPARK_CONF_DIR": "/elsewhere/conf",
        "SPARK_HOME": "/elsewhere/spark",
        "PYSPARK_SUBMIT_ARGS": "--master local[1] pyspark-shell",
        "PYSPARK_PYTHON": "/elsewhere/python",
        "JAVA_TOOL_OPTIONS": "-Xmx8g",
        "_JAVA_OPTIONS": "-Xmx8g",
        "CLASSPATH": "/elsewhere/*",
    }
    for name, value in leaked.items():
        monkeypatch.setenv(name, value)
    master, worker = spark_cluster.cluster_services(cfg)
    env = master._environment("/usr/lib/jvm/some-jdk/bin/java")
    assert not {"SPARK_CONF_DIR", "PYSPARK_SUBMIT_ARGS", "PYSPARK_PYTHON", "JAVA_TOOL_OPTIONS"} & env.keys()
    assert not {"_JAVA_OPTIONS", "CLASSPATH"} & env.keys()
    assert env["SPARK_HOME"] == str(spark_cluster.spark_home())
    # Executors are launched with JAVA_HOME's java: the daemons' own.
    assert env["JAVA_HOME"] == str(Path("/usr/lib/jvm/some-jdk").resolve())
    assert env["PATH"]


def test_each_daemon_is_recognised_by_its_class_and_its_own_ports(
    cfg: StackConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    master, worker = (s.marker for s in spark_cluster.cluster_services(cfg))
    assert "org.apache.spark.deploy.master.Master --host 127.0.0.1 --port 7077 --webui-port" in master
    assert worker.startswith("org.apache.spark.deploy.worker.Worker spark://127.0.0.1:7077 ")
    monkeypatch.setenv("BW_STACK_SPARK_MASTER_PORT", "17077")
    other_master, other_worker = (s.marker for s in spark_cluster.cluster_services(cfg))
    assert master not in other_master
    assert worker not in other_worker


def test_a_second_user_of_the_cluster_waits_and_then_is_told_who_holds_it(cfg: StackConfig) -> None:
    with (
        spark_cluster._locked(cfg),
        pytest.raises(StackError) as raised,
        spark_cluster._locked(cfg, timeout_s=0.3),
    ):
        pass
    assert "still in use by another process" in str(raised.value)
    assert str(cfg.run_dir / "spark-cluster.lock") in str(raised.value)
    with spark_cluster._locked(cfg, timeout_s=0.3):  # released by the first holder
        pass


def test_a_childs_exit_status_comes_from_the_kernel_not_from_a_pid_file(tmp_path: Path) -> None:
    pid = process.spawn(
        [sys.executable, "-c", "import time; time.sleep(0.5); raise SystemExit(3)"],
        tmp_path / "child.log",
        tmp_path / "child.pid",
    )
    (tmp_path / "child.pid").write_text("1\n")  # a pid file overwritten by someone else
    assert process.exit_status(pid) is None
    deadline = time.monotonic() + 30
    while (status := process.exit_status(pid)) is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert status == 3


def test_a_daemon_is_found_by_its_pid_file_as_soon_as_it_is_started(tmp_path: Path) -> None:
    """Right after Popen returns, /proc/<pid>/cmdline can still be empty (the exec is not done):
    the start-up check used to take the daemon for dead then. `spawn` returns after the exec."""
    marker = f"bw-new-daemon-{tmp_path.name}"
    for attempt in range(20):
        pid_file = tmp_path / f"{attempt}.pid"
        pid = process.spawn(
            [sys.executable, "-c", "import time; time.sleep(60)", marker], tmp_path / "log", pid_file
        )
        try:
            assert process.read_pid(pid_file, marker) == pid
        finally:
            process.terminate(pid)


def test_a_daemon_whose_pid_file_was_lost_is_found_by_its_command_line(tmp_path: Path) -> None:
    marker = f"bw-lost-daemon-{tmp_path.name}"
    pid = process.spawn(
        [sys.executable, "-c", "import time; time.sleep(60)", marker], tmp_path / "log", tmp_path / "pid"
    )
    (tmp_path / "pid").unlink()
    try:
        assert process.pids_running(marker) == [pid]
    finally:
        process.terminate(pid)
    assert process.pids_running(marker) == []


# Like a Kafka broker's controlled shutdown: on SIGTERM it leaves a mark, then ends cleanly only
# once every peer has left one too.
_PEER = """
import pathlib, signal, sys, time
here, peers = pathlib.Path(sys.argv[1]), [pathlib.Path(p) for p in sys.argv[2:]]
def stop(*_):
    (here / "term").touch()
    while not all((p / "term").exists() for p in peers):
        time.sleep(0.05)
    (here / "clean").touch()
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
(here / "ready").touch()
time.sleep(60)
"""


def _peers(tmp_path: Path, run: str) -> list[tuple[int, Path]]:
    homes = [tmp_path / f"{run}-{i}" for i in range(3)]
    for home in homes:
        home.mkdir()
    started = [
        (
            process.spawn(
                [sys.executable, "-c", _PEER, str(home), *(str(h) for h in homes if h != home)],
                home / "log",
                home / "pid",
            ),
            home,
        )
        for home in homes
    ]
    # Their SIGTERM handlers are set once they are ready.
    process.wait_until(lambda: all((h / "ready").exists() for h in homes), 30, "the peers", tmp_path)
    return started


def test_peers_that_wait_on_each_other_stop_cleanly_together_not_one_by_one(tmp_path: Path) -> None:
    one_by_one = _peers(tmp_path, "one-by-one")
    for pid, _ in one_by_one:
        process.terminate(pid, timeout_s=1.0)
    assert not all((home / "clean").exists() for _, home in one_by_one)

    together = _peers(tmp_path, "together")
    process.terminate_together([pid for pid, _ in together], timeout_s=30.0)
    assert all((home / "clean").exists() for _, home in together)
