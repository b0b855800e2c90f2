"""Helpers for the CDC worker's integration tests: run the real `bottledwater` command, read topics
back from Kafka, and wait on the slot, all against the stack's real services."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from io import BytesIO
from pathlib import Path
from typing import Any

import fastavro
import psycopg2
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.schema_registry import SchemaRegistryClient

from kafka_contract import control
from kafka_contract.headers import produced_before_commit, resolved_headers

BOTTLEDWATER = str(Path(sys.executable).parent / "bottledwater")
DEFAULT_TIMEOUT_S = 30.0
POLL_S = 0.1


def wait_for(predicate: Callable[[], Any], what: str, timeout: float = DEFAULT_TIMEOUT_S) -> Any:
    """The first truthy value of `predicate()`, or a failure naming `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(POLL_S)


class LoadThread:
    """Transactions on one connection in a thread until stopped, each `transaction(cur, rng)` (the
    subclass's), `pause(rng)` seconds apart; `transactions` counts those committed, `stop` raises
    what the thread met."""

    def __init__(self, dsn: str, seed: int) -> None:
        self.dsn = dsn
        self.seed = seed
        self.transactions = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._error: BaseException | None = None

    def start(self) -> Any:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        if self._error is not None:
            raise self._error

    def transaction(self, cur: Any, rng: random.Random) -> None:
        raise NotImplementedError

    def pause(self, rng: random.Random) -> float:
        return 0.0

    def _run(self) -> None:
        rng = random.Random(self.seed)
        conn = psycopg2.connect(self.dsn)
        try:
            while not self._stop.is_set():
                with conn, conn.cursor() as cur:
                    self.transaction(cur, rng)
                self.transactions += 1
                time.sleep(self.pause(rng))
        except BaseException as exc:
            self._error = exc
        finally:
            conn.close()


# -- the worker process ------------------------------------------------------------------------


class WorkerProcess:
    """`bottledwater ...` as a subprocess, its stderr in a file the test can search."""

    def __init__(self, args: Sequence[str], log_path: Path, env: dict[str, str] | None = None) -> None:
        self.args = [BOTTLEDWATER, *args]
        self.log_path = log_path
        # Only what the test gives: the stack's BOTTLEDWATER_* variables would otherwise leak in.
        base = {k: v for k, v in os.environ.items() if not k.startswith("BOTTLEDWATER_")}
        self.env = {**base, **(env or {})}
        self.process: subprocess.Popen[bytes] | None = None
        self._log_offset = 0

    def start(self) -> WorkerProcess:
        self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with self.log_path.open("ab") as log_file:
            self.process = subprocess.Popen(
                self.args, stdout=log_file, stderr=subprocess.STDOUT, env=self.env
            )
        return self

    def log(self) -> str:
        """This run's output so far."""
        if not self.log_path.exists():
            return ""
        with self.log_path.open("rb") as log_file:
            log_file.seek(self._log_offset)
            return log_file.read().decode(errors="replace")

    @property
    def returncode(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def wait_log(self, text: str, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        def seen() -> bool:
            if text in self.log():
                return True
            if self.returncode is not None:
                raise AssertionError(
                    f"worker exited ({self.returncode}) before {text!r}:\n{self.log()[-4000:]}"
                )
            return False

        try:
            wait_for(seen, f"{text!r} in the worker's log", timeout)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.log()[-4000:]}") from None

    def wait_streaming(self, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        self.wait_log("streaming slot", timeout)

    def wait_exit(self, timeout: float = DEFAULT_TIMEOUT_S) -> int:
        assert self.process is not None
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise AssertionError(f"worker did not exit within {timeout}s:\n{self.log()[-4000:]}") from None

    def stop(self, timeout: float = DEFAULT_TIMEOUT_S) -> int:
        """SIGTERM, then the exit code."""
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.wait_exit(timeout)

    def kill9(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def kill9_all(self) -> None:
        """SIGKILL the worker and every process under it (its snapshot readers) at once, as a
        crash of the machine would: nothing of them gets to clean up."""
        assert self.process is not None
        for pid in [*descendants(self.process.pid), self.process.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.process.wait(10)

    def ensure_stopped(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)


def descendants(pid: int) -> list[int]:
    """The processes under `pid` (children, theirs, ...), from /proc."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            # "pid (comm) state ppid ...": the command may hold spaces and parentheses.
            fields = stat.read_text().rsplit(")", 1)[1].split()
            parents[int(stat.parent.name)] = int(fields[1])
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        children = [child for child, ppid in parents.items() if ppid == parent]
        found.extend(children)
        frontier.extend(children)
    return found


class WorkerStarter:
    """Starts `bottledwater` processes with the arguments every start of a test shares, each
    logging to its own file under `log_dir`; `stop_all` (the fixture's teardown) ends them."""

    def __init__(self, args: Sequence[str], log_dir: Path) -> None:
        self.args = list(args)
        self.log_dir = log_dir
        self.started: list[WorkerProcess] = []

    def start(self, *extra: str, env: dict[str, str] | None = None) -> WorkerProcess:
        log_path = self.log_dir / f"worker-{len(self.started)}.log"
        worker = WorkerProcess([*self.args, *extra], log_path, env=env).start()
        self.started.append(worker)
        return worker

    def stop_all(self) -> None:
        for worker in self.started:
            worker.ensure_stopped()


# A transaction produced before its commit: xid -> (commit LSN, `bw.commit_ts` text).
Commits = dict[int, tuple[int, str]]


def commit_events(messages: Iterable[Any]) -> Commits:
    """The control topic's commit events of transactions produced before their commit, by xid: what
    a consumer reads their changes' commit LSN and time from."""
    commits: Commits = {}
    for message in messages:
        headers = {k: (v or b"").decode() for k, v in message.headers() or []}
        if headers.get("bw.op") == control.STREAMED_COMMIT:
            commits[int(headers["bw.xid"])] = (int(headers["bw.lsn"]), headers["bw.commit_ts"])
    return commits


def ordinary_headers(message: Any, commits: Commits) -> tuple[dict[str, str], bool]:
    """A message's headers as text, a change produced before its commit given its commit event's
    `bw.lsn` and `bw.commit_ts` (`kafka_contract.headers.resolved_headers`), as a consumer does; and
    whether it was such a change."""
    raw = message.headers() or []
    early = produced_before_commit(raw)
    if early:
        xid = int(raw[2][1])
        assert xid in commits, f"a change of transaction {xid} without its commit event"
        raw = resolved_headers(raw, *commits[xid])
    return {k: (v or b"").decode() for k, v in raw}, early


def topic_prefix(kafka_bootstrap: str, name: str) -> Iterator[str]:
    """For a fixture: a fresh topic prefix, its topics deleted afterwards."""
    prefix = f"{name}_{uuid.uuid4().hex[:12]}"
    yield prefix
    delete_topics_with_prefix(kafka_bootstrap, prefix)


def topic_reader(kafka_bootstrap: str) -> Iterator[TopicReader]:
    """For a fixture: a `TopicReader`, closed afterwards."""
    reader = TopicReader(kafka_bootstrap)
    yield reader
    reader.close()


def run_command(args: Sequence[str], timeout: float = DEFAULT_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BOTTLEDWATER_")}
    return subprocess.run(
        [BOTTLEDWATER, *args], capture_output=True, text=True, timeout=timeout, env=env, check=False
    )


# -- Postgres ----------------------------------------------------------------------------------


def execute(dsn: str, *statements: Any) -> None:
    """Each statement (text or psycopg2.sql, optionally with parameters) in its own transaction."""
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


def query(dsn: str, statement: Any, params: Any = None) -> list[tuple[Any, ...]]:
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute(statement, params)
            return list(cur.fetchall())
    finally:
        conn.close()


def lsn_of(text: str) -> int:
    high, low = text.split("/")
    return (int(high, 16) << 32) | int(low, 16)


def confirmed_flush(dsn: str, slot: str) -> int | None:
    rows = query(
        dsn, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s", (slot,)
    )
    return lsn_of(rows[0][0]) if rows and rows[0][0] else None


def current_lsn(dsn: str) -> int:
    return lsn_of(query(dsn, "SELECT pg_current_wal_lsn()::text")[0][0])


def wait_caught_up(dsn: str, slot: str, timeout: float = DEFAULT_TIMEOUT_S) -> None:
    """Until the slot has acknowledged everything written so far: with acks only after Kafka's
    delivery reports, every change made before this call is then readable from Kafka."""
    target = current_lsn(dsn)
    wait_for(
        lambda: (confirmed_flush(dsn, slot) or 0) >= target, f"slot {slot} to acknowledge {target}", timeout
    )


# -- Kafka -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Record:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: dict[str, str]

    @property
    def op(self) -> str:
        return self.headers["bw.op"]

    @property
    def lsn(self) -> int:
        return int(self.headers["bw.lsn"])

    @property
    def seq(self) -> int:
        return int(self.headers["bw.seq"])

    def json_key(self) -> Any:
        return None if self.key is None else json.loads(self.key)

    def json_value(self) -> Any:
        return None if self.value is None else json.loads(self.value)


class TopicReader:
    """Reads whole topics from the beginning without a consumer group (assign, no subscribe)."""

    def __init__(
        self, bootstrap: str, settings: dict[str, str] | None = None, group_prefix: str = "bwtest"
    ) -> None:
        """`settings`: extra librdkafka settings (a secured cluster's); `group_prefix`: the start of
        the group id, which a cluster's ACLs may constrain."""
        self.bootstrap = bootstrap
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"{group_prefix}-{os.getpid()}-{id(self)}",
                "enable.auto.commit": False,
                # The end of a partition whose last offsets are transaction markers (no message has
                # them) comes as an EOF event at the high watermark; one before it is the last stable
                # offset of a transaction whose markers are still being written (read_committed).
                "enable.partition.eof": True,
                **(settings or {}),
            }
        )

    def close(self) -> None:
        self.consumer.close()

    def topics(self) -> set[str]:
        return set(self.consumer.list_topics(timeout=10).topics)

    def partitions(self, topic: str) -> list[int]:
        metadata = self.consumer.list_topics(topic, timeout=10).topics.get(topic)
        if metadata is None or metadata.error is not None:
            return []
        return sorted(metadata.partitions)

    def high_watermarks(self, topic: str) -> dict[int, int]:
        return {
            p: self.consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)[1]
            for p in self.partitions(topic)
        }

    def count(self, topic: str) -> int:
        """Messages in `topic`; 0 while it does not exist or has no leader yet (just created)."""
        try:
            return sum(self.high_watermarks(topic).values())
        except KafkaException:
            return 0

    def control_events(
        self, topic: str, min_events: int = 0, timeout: float = DEFAULT_TIMEOUT_S
    ) -> list[Record]:
        """The events of a control topic but the progress events, once there are at least
        `min_events` of them: a worker sends progress on its own clock (kafka_contract.control)."""

        def events() -> list[Record]:
            return [r for r in self.read(topic) if r.op != control.PROGRESS]

        if min_events:
            wait_for(lambda: len(events()) >= min_events, f"{min_events} events in {topic}", timeout)
        return events()

    def read(self, topic: str, min_messages: int = 0, timeout: float = DEFAULT_TIMEOUT_S) -> list[Record]:
        """Every message of `topic`, once it holds at least `min_messages` (partition by partition,
        each in offset order)."""
        if min_messages:
            wait_for(
                lambda: self.count(topic) >= min_messages, f"{min_messages} messages in {topic}", timeout
            )
        highs = {p: h for p, h in self.high_watermarks(topic).items() if h > 0}
        if not highs:
            return []
        self.consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in highs])
        records: list[Record] = []
        done: set[int] = set()
        deadline = time.monotonic() + timeout
        while len(done) < len(highs) and time.monotonic() < deadline:
            message = self.consumer.poll(0.5)
            if message is None:
                # Past the markers of the last transaction without a message or an EOF after them.
                waiting = [TopicPartition(topic, p) for p in highs if p not in done]
                done.update(
                    tp.partition for tp in self.consumer.position(waiting) if tp.offset >= highs[tp.partition]
                )
                continue
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    if (message.offset() or 0) >= highs[message.partition() or 0]:
                        done.add(message.partition() or 0)
                    continue
                raise AssertionError(f"reading {topic}: {error}")
            partition, offset = message.partition(), message.offset()
            headers = {k: v.decode() for k, v in (message.headers() or [])}
            records.append(Record(topic, partition, offset, message.key(), message.value(), headers))
            if offset + 1 >= highs[partition]:
                done.add(partition)
        self.consumer.unassign()
        assert len(done) == len(highs), f"could not read {topic} to its end within {timeout}s"
        return sorted(records, key=lambda r: (r.partition, r.offset))


def compacted(records: Sequence[Record], decode: Callable[[bytes], Any] = json.loads) -> dict[str, Any]:
    """What a compacted topic converges to: the last value per key, deleted keys gone. Keys are
    compared as canonical JSON text so that they can be dict keys."""
    view: dict[str, Any] = {}
    for record in sorted(records, key=lambda r: (r.lsn, r.seq, r.partition, r.offset)):
        assert record.key is not None, f"null key in a keyed topic: {record}"
        key = json.dumps(decode(record.key), sort_keys=True)
        if record.value is None:
            view.pop(key, None)
        else:
            view[key] = decode(record.value)
    return view


def delete_topics_with_prefix(bootstrap: str, prefix: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    names = [t for t in admin.list_topics(timeout=10).topics if t.startswith(prefix + ".")]
    if names:
        for future in admin.delete_topics(names, operation_timeout=30).values():
            with contextlib.suppress(Exception):  # already gone: this is cleanup only
                future.result(30)


class AvroDecoder:
    """Confluent-framed Avro -> Python values, with writer schemas fetched by id from the registry."""

    def __init__(self, registry_url: str) -> None:
        self.client = SchemaRegistryClient({"url": registry_url})
        self._schemas: dict[int, Any] = {}

    def schema_id(self, data: bytes) -> int:
        assert data[0] == 0, f"not Confluent framing: {data[:8]!r}"
        return int.from_bytes(data[1:5], "big")

    def __call__(self, data: bytes) -> Any:
        schema_id = self.schema_id(data)
        if schema_id not in self._schemas:
            self._schemas[schema_id] = fastavro.parse_schema(
                json.loads(self.client.get_schema(schema_id).schema_str)
            )
        return fastavro.schemaless_reader(BytesIO(data[5:]), self._schemas[schema_id])


# -- a TCP forwarder that a test can cut, to take the registry away mid-stream ------------------


class TcpForwarder:
    """Listens on a free local port and forwards to `target`; `cut()` closes every connection and
    refuses new ones until `restore()`. A real network fault, not a mock of the registry."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self._open = True
        self._connections: list[socket.socket] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            with self._lock:
                if not self._open:
                    client.close()
                    continue
                try:
                    upstream = socket.create_connection(self.target, timeout=5)
                except OSError:
                    client.close()
                    continue
                self._connections += [client, upstream]
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        with self._lock:
            self._open = False
            for connection in self._connections:
                with contextlib.suppress(OSError):
                    connection.shutdown(socket.SHUT_RDWR)
                connection.close()
            self._connections.clear()

    def restore(self) -> None:
        with self._lock:
            self._open = True

    def close(self) -> None:
        self.cut()
        self.server.close()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def lines(text: str, needle: str) -> Iterator[str]:
    return (line for line in text.splitlines() if needle in line)


def worker_args(dsn: str, slot: str, *, prefix: str, bootstrap: str, registry: str, fmt: str) -> list[str]:
    """The worker's arguments for a test on one database: 1 s status updates, two snapshot workers,
    topics of one partition."""
    return ["-d", dsn, "-s", slot, "-p", prefix, "-b", bootstrap, "-r", registry, "-f", fmt,
            "--status-interval", "1", "--snapshot-workers", "2", "-T", "partitions=1"]  # fmt: skip
