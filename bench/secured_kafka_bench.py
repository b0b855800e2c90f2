"""The worker on the stack's secured three-node cluster (SASL_SSL with SCRAM-SHA-512, RF 3,
min.insync.replicas 2, acks=all) against the single plaintext broker, in the same run:

- snapshot: the worker's snapshot (native producer, JSON, 4 partitions) of a table, from its
  "snapshot of" line to its "snapshot complete" line, against the pipe on the same Kafka:
  `COPY orders TO STDOUT | kcat -P` (lz4, linger 20 ms, acks=all, the same security settings,
  on confluent-kafka's librdkafka: Debian's 2.0.2 fails SCRAM against Kafka 4.1), until kcat
  exits, i.e. until Kafka acknowledged every message; and what the brokers spend per row of
  each (whole runs, start-up included);
- stream: the worker draining N mixed changes from a slot created before them (from its
  "streaming slot" line until the slot acknowledged the last), against `pg_recvlogical` into
  /dev/null from a slot created at the same point (it does not depend on Kafka: one baseline).
  In each stream window it reads the CPU of the worker, of Postgres and of the brokers (on this
  machine the three brokers share its cores), and prints the rate that CPU bounds the 2 cores at.

Targets: the worker's ratio to the pipe on the secured cluster
within 10 % of its ratio on the plaintext broker; the stream on the secured cluster >= 0.9x
pg_recvlogical. Run: `.venv/bin/python bench/secured_kafka_bench.py [--rows N] [--changes N]`
(1M each by default); it starts the stack's secured cluster if it is not running (as
`bw-stack kafka-cluster up`) and stops it again. Prints figures and ratios, asserts nothing, ends
with one `RESULT` line.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
import time
from pathlib import Path

from confluent_kafka.admin import AdminClient, NewTopic
from stream_bench import make_changes, recvlogical_seconds
from worker_bench_common import (
    BROKER,
    Worker,
    broker_cpu_seconds,
    broker_pid,
    core_bound,
    current_lsn,
    execute,
    log_time,
    postgres_cpu_seconds,
    postmaster_pid,
    report,
    result,
    scratch_database,
    unique,
    wait_caught_up,
)

from stack import kafka_cluster
from stack.config import StackConfig

# Large enough that the worker's start-up (TLS handshakes with three brokers, the idempotent
# producer's id, metadata) and the final acknowledgement are a small part of each window.
DEFAULT_ROWS = 1_000_000
DEFAULT_CHANGES = 1_000_000
PARTITIONS = 4
KAFKA_CONFIG_ENV = "BOTTLEDWATER_KAFKA_CONFIG"


class Target:
    """One Kafka: its bootstrap servers, the worker's librdkafka settings for it and the pids of its
    brokers (whose CPU the stream window counts: on this machine they share its cores)."""

    def __init__(self, name: str, bootstrap: str, settings: dict[str, str], broker_pids: list[int]) -> None:
        self.name, self.bootstrap, self.settings = name, bootstrap, settings
        self.broker_pids = broker_pids

    def broker_cpu_seconds(self) -> float:
        return sum(broker_cpu_seconds(pid) for pid in self.broker_pids)

    def admin(self) -> AdminClient:
        return AdminClient({"bootstrap.servers": self.bootstrap, **self.settings})

    def worker(self, dsn: str, slot: str, prefix: str, log_dir: Path, *extra: str) -> Worker:
        # -C through the environment, as a deployment passes secrets.
        os.environ[KAFKA_CONFIG_ENV] = ";".join(f"{k}={v}" for k, v in self.settings.items())
        try:
            return Worker(dsn, slot, prefix, "-b", self.bootstrap, "-f", "json", "--producer", "native",
                          "-T", f"partitions={PARTITIONS}", *extra, log_dir=log_dir)  # fmt: skip
        finally:
            del os.environ[KAFKA_CONFIG_ENV]

    def pipe_seconds(self, dsn: str, topic: str, scratch: Path) -> float:
        admin = self.admin()
        for future in admin.create_topics([NewTopic(topic, PARTITIONS)]).values():
            future.result(timeout=60)
        # The security settings from a file (mode 0600), not -X: the process list would show them.
        config = scratch / f"{topic}.conf"
        config.touch(mode=0o600)
        config.write_text("".join(f"{k}={v}\n" for k, v in self.settings.items()))
        kcat = ["kcat", "-P", "-F", str(config), "-b", self.bootstrap, "-t", topic, "-z", "lz4",
                "-X", "linger.ms=20", "-X", "acks=all"]  # fmt: skip
        started = time.monotonic()
        copy = subprocess.Popen(
            ["psql", "-q", "-d", dsn, "-c", "COPY orders TO STDOUT"], stdout=subprocess.PIPE
        )
        subprocess.run(kcat, stdin=copy.stdout, check=True, env=kcat_environment(scratch))
        copy.wait()
        return time.monotonic() - started

    def delete_prefix(self, prefix: str, admin_settings: dict[str, str]) -> None:
        """With `admin_settings`: the worker's principal may not delete topics."""
        admin = AdminClient({"bootstrap.servers": self.bootstrap, **admin_settings})
        names = [t for t in admin.list_topics(timeout=30).topics if t.startswith(prefix + ".")]
        for future in admin.delete_topics(names).values() if names else ():
            future.result(timeout=60)


def kcat_environment(scratch: Path) -> dict[str, str]:
    """kcat on confluent-kafka's librdkafka (2.16) rather than Debian's (2.0.2), whose SCRAM
    handshake Kafka 4.1 refuses as invalid credentials; the same library for both targets."""
    import confluent_kafka

    libs = Path(confluent_kafka.__file__).parent.parent / "confluent_kafka.libs"
    bundled = sorted(libs.glob("librdkafka-*.so.1"))
    if not bundled:
        return dict(os.environ)
    link = scratch / "librdkafka" / "librdkafka.so.1"
    if not link.exists():
        link.parent.mkdir(exist_ok=True)
        link.symlink_to(bundled[0])
    return {**os.environ, "LD_LIBRARY_PATH": str(link.parent)}


def stream_cpu(worker: Worker, postmaster: int, target: Target) -> tuple[float, float, float]:
    """CPU seconds so far of the worker, the Postgres cluster and the target's brokers."""
    return worker.cpu_seconds(), postgres_cpu_seconds(postmaster), target.broker_cpu_seconds()


def snapshot_seconds(target: Target, dsn: str, prefix: str, log_dir: Path) -> float:
    worker = target.worker(dsn, unique("snap"), prefix, log_dir)
    try:
        begun = log_time(worker.wait_log("snapshot of "))
        done = log_time(worker.wait_log("snapshot complete"))
    finally:
        worker.stop()
    return (done - begun).total_seconds()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=DEFAULT_ROWS)
    parser.add_argument("--changes", type=int, default=DEFAULT_CHANGES)
    args = parser.parse_args()
    cfg = StackConfig.from_env()
    started_here = not kafka_cluster.running(cfg)
    if started_here:  # as `bw-stack kafka-cluster up` would; stopped again at the end
        print("starting the stack's secured cluster (bw-stack kafka-cluster up) ...", flush=True)
        kafka_cluster.up(cfg)
    try:
        run(cfg, args)
    finally:
        if started_here:
            kafka_cluster.down(cfg)


def run(cfg: StackConfig, args: argparse.Namespace) -> None:
    prefix = unique("bench")
    kafka_cluster.grant_pipeline(cfg, prefix)
    targets = [
        Target("plaintext, 1 broker, RF 1", BROKER, {}, [broker_pid()]),
        Target(
            "SASL_SSL, 3 brokers, RF 3",
            kafka_cluster.Layout.of(cfg).bootstrap,
            kafka_cluster.client_settings(cfg, kafka_cluster.WORKER),
            [pid for node in kafka_cluster.nodes(cfg) if (pid := node.pid()) is not None],
        ),
    ]
    cleanup = {
        targets[0].name: {},
        targets[1].name: kafka_cluster.client_settings(cfg, kafka_cluster.ADMIN),
    }
    rows: list[tuple[str, str]] = []
    figures: dict[str, object] = {}
    cpu_us: dict[str, tuple[float, ...]] = {}  # worker, Postgres, brokers: CPU us per change
    with scratch_database() as dsn, tempfile.TemporaryDirectory() as tmp:
        log_dir = Path(tmp)
        execute(
            dsn,
            "CREATE TABLE orders (id bigint PRIMARY KEY, customer int, status text, amount numeric(12,2), "
            "created timestamptz)",
            ("INSERT INTO orders SELECT g, g %% 1000, 'status ' || (g %% 7), g * 1.25, now() "
             "FROM generate_series(1, %s) g", (args.rows,)),
            "CREATE TABLE events (id bigint PRIMARY KEY, v int, note text) WITH (autovacuum_enabled = off)",
        )  # fmt: skip
        # Snapshot: the pipe, then the worker, on each Kafka.
        snapshot: dict[str, tuple[float, float]] = {}
        snapshot_brokers_us: dict[str, tuple[float, float]] = {}  # the pipe's, the worker's
        for n, target in enumerate(targets):
            brokers_before = target.broker_cpu_seconds()
            pipe = target.pipe_seconds(dsn, f"{prefix}.pipe{n}", log_dir)
            brokers_between = target.broker_cpu_seconds()
            worker = snapshot_seconds(target, dsn, prefix, log_dir)
            snapshot[target.name] = (pipe, worker)
            # Whole runs, start-up included: what the brokers spend per row of each producer's messages.
            snapshot_brokers_us[target.name] = (
                (brokers_between - brokers_before) / args.rows * 1e6,
                (target.broker_cpu_seconds() - brokers_between) / args.rows * 1e6,
            )
            target.delete_prefix(prefix, cleanup[target.name])
        # Stream: every slot made before the changes, so all read the same WAL.
        slots = {target.name: unique("stream") for target in targets}
        execute(dsn, "DROP TABLE orders")
        for target in targets:
            first = target.worker(dsn, slots[target.name], prefix, log_dir, "-x", "--tables", "public.events")
            first.wait_log("streaming slot")
            first.stop()
        recv_slot = unique("recv")
        execute(dsn, ("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (recv_slot,)))
        made = make_changes(dsn, args.changes)
        end = current_lsn(dsn)
        execute(dsn, "CHECKPOINT")
        recv_rate = made / recvlogical_seconds(dsn, recv_slot, slots[targets[0].name], end)
        stream: dict[str, float] = {}
        postmaster = postmaster_pid(dsn)
        for target in targets:
            streaming = target.worker(dsn, slots[target.name], prefix, log_dir, "--tables", "public.events")
            try:
                streaming.wait_log("streaming slot")
                begun, before = time.monotonic(), stream_cpu(streaming, postmaster, target)
                stream[target.name] = made / (wait_caught_up(dsn, slots[target.name], end) - begun)
                after = stream_cpu(streaming, postmaster, target)
                cpu_us[target.name] = tuple((a - b) / made * 1e6 for a, b in zip(after, before, strict=True))
            finally:
                streaming.stop()
                target.delete_prefix(prefix, cleanup[target.name])
        execute(dsn, *(("SELECT pg_drop_replication_slot(%s)", (s,)) for s in [*slots.values(), recv_slot]))

    ratios = []
    cores = os.cpu_count() or 1
    for n, target in enumerate(targets):
        worker_us, postgres_us, brokers_us = cpu_us[target.name]
        bound = core_bound(cores, worker_us, postgres_us, brokers_us)
        pipe, worker = snapshot[target.name]
        pipe_brokers_us, worker_brokers_us = snapshot_brokers_us[target.name]
        ratio = pipe / worker
        ratios.append(ratio)
        rows += [
            (f"{target.name}: snapshot, the pipe", f"{args.rows / pipe:12,.0f} rows/s  (baseline)"),
            (f"{target.name}: snapshot, the worker",
             f"{args.rows / worker:12,.0f} rows/s  ({ratio:.3f}x the pipe)"),
            (f"{target.name}: snapshot, brokers' CPU per row",
             f"the pipe's {pipe_brokers_us:.2f} us, the worker's {worker_brokers_us:.2f} us"),
            (f"{target.name}: stream, the worker", f"{stream[target.name]:12,.0f} changes/s  "
             f"({stream[target.name] / recv_rate:.3f}x pg_recvlogical)"),
            (f"{target.name}: stream CPU per change",
             f"worker {worker_us:.2f} us, Postgres {postgres_us:.2f} us, brokers {brokers_us:.2f} us"),
            (f"{target.name}: {cores}-core bound of that CPU",
             f"{bound:12,.0f} changes/s  ({bound / recv_rate:.3f}x pg_recvlogical)"),
        ]  # fmt: skip
        key = "plain" if n == 0 else "secured"
        figures |= {
            f"{key}_pipe_rows_s": round(args.rows / pipe),
            f"{key}_pipe_brokers_us_per_row": pipe_brokers_us,
            f"{key}_snapshot_brokers_us_per_row": worker_brokers_us,
            f"{key}_snapshot_rows_s": round(args.rows / worker),
            f"{key}_snapshot_vs_pipe": ratio, f"{key}_stream_changes_s": round(stream[target.name]),
            f"{key}_stream_vs_recvlogical": stream[target.name] / recv_rate,
            f"{key}_worker_us_per_change": worker_us, f"{key}_postgres_us_per_change": postgres_us,
            f"{key}_brokers_us_per_change": brokers_us, f"{key}_core_bound_vs_recvlogical": bound / recv_rate,
        }  # fmt: skip
    rows.append(("pg_recvlogical > /dev/null", f"{recv_rate:12,.0f} changes/s  (stream baseline)"))
    rows.append(
        ("secured ratio / plaintext ratio (snapshot)", f"{ratios[1] / ratios[0]:.3f}  (target >= 0.9)")
    )
    report(f"secured Kafka: snapshot of {args.rows:,} rows, stream of {made:,} changes, JSON", rows)
    result("secured_kafka", rows=args.rows, changes=made, recvlogical_changes_s=round(recv_rate),
           secured_vs_plain_snapshot_ratio=ratios[1] / ratios[0], **figures)  # fmt: skip


if __name__ == "__main__":
    main()
