"""The integration tier as two pytest processes at once, then the tests that need the stack alone.

Most of the tier waits (a worker's start, a merge's trigger, a broker's election): one process left
the two cores idle most of the run. The tests of both lanes share the stack's services, as they
always have (each names its own databases, slots, topics and tables). What a session sets up once
stays in one lane: the lake lane owns the SparkSession of the merge's tests and the secured Kafka
cluster (its three users may stop brokers), the stream lane the Postgres versions' clusters (the
failover drill promotes one of them, the TLS tests reconfigure another) with the few Spark
snapshots they take. Tests marked `exclusive` stop a service every test uses: they run alone after.

    python -m tests.lanes [pytest options…]   # what `make integration` runs

Each line of a lane's output is prefixed with its name; each lane prints its own slowest steps.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

INTEGRATION = Path("tests/integration")

# Spark's merge and everything on the secured cluster; the rest of the folder is the stream lane.
LAKE_FILES = (
    "test_faults_dagster_secret.py",
    "test_faults_merge_kill.py",
    "test_kafka_faults.py",
    "test_kafka_secured.py",
    "test_lakehouse_changelog.py",
    "test_lakehouse_changelog_reads.py",
    "test_lakehouse_changes.py",
    "test_lakehouse_continuous.py",
    "test_lakehouse_ddl.py",
    "test_lakehouse_many_tables.py",
    "test_lakehouse_merge.py",
    "test_lakehouse_partitions.py",
    "test_lakehouse_quality.py",
    "test_lakehouse_read_once.py",
    "test_lakehouse_replay.py",
    "test_lakehouse_watermark.py",
    "test_orchestration_pipeline.py",
    "test_spark_cluster.py",
    "test_spark_decode.py",
)
# pytest's "no tests collected": a lane a `-k` or `-m` of the caller left empty.
NO_TESTS = 5


@dataclass(frozen=True)
class Lane:
    name: str
    selection: tuple[str, ...]

    def command(self, options: Sequence[str]) -> list[str]:
        base = Path(tempfile.gettempdir()) / f"bw-integration-{self.name}"
        return [
            sys.executable,
            "-m",
            "pytest",
            *self.selection,
            f"--basetemp={base}",
            # One cache per lane: two processes writing one `lastfailed` file race.
            "-o",
            f"cache_dir=.pytest_cache/{self.name}",
            *options,
        ]


def lanes() -> tuple[list[Lane], Lane]:
    """The lanes run at once, and the one run after them."""
    missing = [name for name in LAKE_FILES if not (INTEGRATION / name).exists()]
    if missing:
        raise SystemExit(f"tests/lanes.py names test files that do not exist: {', '.join(missing)}")
    lake = tuple(str(INTEGRATION / name) for name in LAKE_FILES)
    stream = (str(INTEGRATION), *(f"--ignore={path}" for path in lake))
    together = [
        Lane("lake", (*lake, "-m", "not exclusive")),
        Lane("stream", (*stream, "-m", "not exclusive")),
    ]
    return together, Lane("alone", (str(INTEGRATION), "-m", "exclusive"))


def _relay(stream: IO[str], prefix: str, lock: threading.Lock) -> None:
    for line in stream:
        with lock:
            sys.stdout.write(f"{prefix}{line}")
            sys.stdout.flush()


def run(group: Sequence[Lane], options: Sequence[str]) -> dict[str, tuple[int, float]]:
    """Runs `group` at once, each line of output prefixed; each lane's exit code and seconds."""
    width = max(len(lane.name) for lane in group)
    lock = threading.Lock()
    started = time.monotonic()
    running = []
    for lane in group:
        child = subprocess.Popen(
            lane.command(options),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        assert child.stdout is not None
        relay = threading.Thread(target=_relay, args=(child.stdout, f"[{lane.name:<{width}}] ", lock))
        relay.start()
        running.append((lane, child, relay))
    results = {}
    for lane, child, relay in running:
        code = child.wait()
        relay.join()
        results[lane.name] = (code, time.monotonic() - started)
    return results


def main(argv: Sequence[str]) -> int:
    together, alone = lanes()
    results = run(together, argv)
    results |= run([alone], argv)
    failed = [name for name, (code, _) in results.items() if code not in (0, NO_TESTS)]
    for name, (code, seconds) in results.items():
        verdict = (
            "passed" if code == 0 else "nothing selected" if code == NO_TESTS else f"FAILED (exit {code})"
        )
        print(f"lane {name}: {verdict} in {seconds:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
