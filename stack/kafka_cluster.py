"""A replicated, secured Kafka cluster on loopback, for the production tier of the tests and the
benchmarks: three KRaft nodes (each a controller and a broker), as our own child processes, with
`default.replication.factor=3` and `min.insync.replicas=2`, and no plaintext port at all.

It is apart from the stack's single plaintext broker on 9092, which stays the default for the demo
and the fast tier; its own ports (from BW_STACK_KAFKA_CLUSTER_PORT, default 29092: clients on
29092-29094, brokers' replication on 29095-29097, controllers on 29098-29100), data and logs.

Security, as a managed cluster does it:
- clients: SASL_SSL with SCRAM-SHA-512 only; the credentials (an admin, the worker, the merge) are
  created when the storage is formatted (`kafka-storage format --add-scram`), their passwords
  random, kept in `kafka-cluster/secrets.json` (mode 0600) and never on a command line but
  that one-off format;
- TLS from a CA the stack makes (stack/kafka_tls.py), the brokers' certificate for 127.0.0.1 only;
- replication and the controllers: SASL_SSL with PLAIN and the admin's password (KRaft controllers
  cannot check SCRAM, whose credentials live in the metadata they serve), the admin a super user;
- the standard authorizer (`StandardAuthorizer`), no ACL meaning no access; `grant_pipeline` gives
  the worker and the merge what a pipeline under one topic prefix needs and nothing more.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import signal
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._acl import AclBinding, AclOperation, AclPermissionType
from confluent_kafka.admin._resource import ResourcePatternType, ResourceType

from kafka_contract.topics import transactional_ids
from stack import process
from stack.config import StackConfig, _port
from stack.errors import StackError
from stack.kafka_tls import TlsFiles, ensure_tls
from stack.services import PROBE_TIMEOUT_S, Kafka

NODES = 3
MECHANISM = "SCRAM-SHA-512"
ADMIN, WORKER, MERGE = "bw-admin", "bw-worker", "bw-merge"
USERS = (ADMIN, WORKER, MERGE)
# The merge reads through Spark's Kafka source, whose consumer groups are named
# spark-kafka-source-<uuid>... (streams) and spark-kafka-relation-<uuid>... (batch reads).
MERGE_GROUP_PREFIX = "spark-kafka-"
# The worker reads its own topics back (a snapshot over topics that already hold rows), as a
# consumer whose group is named after its client id.
WORKER_GROUP_PREFIX = "bottledwater"
CLUSTER_UP_TIMEOUT_S = 240.0
WORKER_TOPIC_OPERATIONS = (
    AclOperation.DESCRIBE,
    AclOperation.DESCRIBE_CONFIGS,
    AclOperation.CREATE,
    AclOperation.WRITE,
    AclOperation.READ,
)
LOG4J2 = (
    "rootLogger.level = INFO\nrootLogger.appenderRef.stdout.ref = STDOUT\n"
    "appender.stdout.type = Console\nappender.stdout.name = STDOUT\n"
    "appender.stdout.layout.type = PatternLayout\n"
    "appender.stdout.layout.pattern = [%d] %p %m (%c)%n\n"
    "logger.kafka.name = kafka\nlogger.kafka.level = WARN\n"
    "logger.state.name = state.change.logger\nlogger.state.level = WARN\n"
)


def base_port() -> int:
    return _port("BW_STACK_KAFKA_CLUSTER_PORT", 29092)


@dataclass(frozen=True)
class Layout:
    """Where node `i` (0-based; its node.id is i + 1) listens and keeps its data. Pure."""

    home: Path
    base_port: int
    nodes: int = NODES

    @classmethod
    def of(cls, cfg: StackConfig) -> Layout:
        return cls(cfg.home, base_port())

    def client_port(self, i: int) -> int:
        return self.base_port + i

    def internal_port(self, i: int) -> int:
        return self.base_port + self.nodes + i

    def controller_port(self, i: int) -> int:
        return self.base_port + 2 * self.nodes + i

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{self.client_port(i)}" for i in range(self.nodes))

    @property
    def directory(self) -> Path:
        return self.home / "kafka-cluster"

    def data_dir(self, i: int) -> Path:
        return self.home / "data" / "kafka-cluster" / f"node-{i + 1}"

    def config_file(self, i: int) -> Path:
        return self.directory / f"node-{i + 1}.properties"


def node_properties(layout: Layout, i: int, tls: TlsFiles, admin_password: str) -> dict[str, str]:
    """Node `i`'s server.properties. Pure: the tests read what the cluster is told."""
    voters = ",".join(f"{n + 1}@127.0.0.1:{layout.controller_port(n)}" for n in range(layout.nodes))
    plain = (
        "org.apache.kafka.common.security.plain.PlainLoginModule required "
        f'username="{ADMIN}" password="{admin_password}" user_{ADMIN}="{admin_password}";'
    )
    replicas = str(min(3, layout.nodes))
    min_isr = str(max(1, min(3, layout.nodes) - 1))
    return {
        "process.roles": "broker,controller",
        "node.id": str(i + 1),
        "controller.quorum.voters": voters,
        "listeners": f"CLIENTS://127.0.0.1:{layout.client_port(i)},INTERNAL://127.0.0.1:{layout.internal_port(i)},"
        f"CONTROLLER://127.0.0.1:{layout.controller_port(i)}",
        "advertised.listeners": f"CLIENTS://127.0.0.1:{layout.client_port(i)},"
        f"INTERNAL://127.0.0.1:{layout.internal_port(i)}",
        "listener.security.protocol.map": "CLIENTS:SASL_SSL,INTERNAL:SASL_SSL,CONTROLLER:SASL_SSL",
        "inter.broker.listener.name": "INTERNAL",
        "controller.listener.names": "CONTROLLER",
        "sasl.mechanism.inter.broker.protocol": "PLAIN",
        "sasl.mechanism.controller.protocol": "PLAIN",
        "listener.name.clients.sasl.enabled.mechanisms": MECHANISM,
        "listener.name.clients.scram-sha-512.sasl.jaas.config": (
            "org.apache.kafka.common.security.scram.ScramLoginModule required;"
        ),
        "listener.name.internal.sasl.enabled.mechanisms": "PLAIN",
        "listener.name.internal.plain.sasl.jaas.config": plain,
        "listener.name.controller.sasl.enabled.mechanisms": "PLAIN",
        "listener.name.controller.plain.sasl.jaas.config": plain,
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(tls.server_pem),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(tls.ca_cert),
        "ssl.endpoint.identification.algorithm": "https",
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": f"User:{ADMIN}",
        "allow.everyone.if.no.acl.found": "false",
        "log.dirs": str(layout.data_dir(i)),
        "num.partitions": "3",
        "default.replication.factor": replicas,
        "min.insync.replicas": min_isr,
        "offsets.topic.replication.factor": replicas,
        "transaction.state.log.replication.factor": replicas,
        "transaction.state.log.min.isr": min_isr,
        "share.coordinator.state.topic.replication.factor": replicas,
        "share.coordinator.state.topic.min.isr": min_isr,
        "group.initial.rebalance.delay.ms": "0",
        "auto.create.topics.enable": "false",
        "unclean.leader.election.enable": "false",
        "log.cleaner.backoff.ms": "1000",
    }


def load_secrets(layout: Layout) -> dict[str, str]:
    """Each user's password, made once and kept (mode 0600) so that a restart keeps them."""
    path = layout.directory / "secrets.json"
    if path.exists():
        stored: dict[str, str] = json.loads(path.read_text())
        return stored
    made = {user: secrets.token_urlsafe(24) for user in USERS}
    layout.directory.mkdir(parents=True, exist_ok=True)
    path.touch(mode=0o600)
    path.write_text(json.dumps(made))
    return made


def tls_files(cfg: StackConfig) -> TlsFiles:
    return ensure_tls(Layout.of(cfg).directory / "tls")


def client_settings(cfg: StackConfig, user: str) -> dict[str, str]:
    """librdkafka settings (`-C`) for `user` on this cluster, bootstrap servers apart."""
    return {
        "security.protocol": "SASL_SSL",
        "sasl.mechanisms": MECHANISM,
        "sasl.username": user,
        "sasl.password": load_secrets(Layout.of(cfg))[user],
        "ssl.ca.location": str(tls_files(cfg).ca_cert),
    }


def spark_options(cfg: StackConfig, user: str) -> dict[str, str]:
    """The same for Spark's Kafka source (the JVM client, `--kafka-option`)."""
    password = load_secrets(Layout.of(cfg))[user]
    return {
        "kafka.security.protocol": "SASL_SSL",
        "kafka.sasl.mechanism": MECHANISM,
        "kafka.sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule required "
        f'username="{user}" password="{password}";',
        "kafka.ssl.truststore.type": "PEM",
        "kafka.ssl.truststore.location": str(tls_files(cfg).ca_cert),
    }


class KafkaNode(Kafka):
    """One node of the cluster; a `Kafka` but for its configuration, identity and health."""

    port_env_var = "BW_STACK_KAFKA_CLUSTER_PORT"

    def __init__(self, cfg: StackConfig, index: int) -> None:
        super().__init__(cfg)
        self.index = index
        self.layout = Layout.of(cfg)
        self.name = f"kafka-node-{index + 1}"

    @property
    def node_id(self) -> int:
        return self.index + 1

    @property
    def port(self) -> int:
        return self.layout.client_port(self.index)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port} (SASL_SSL)"

    @property
    def config_file(self) -> Path:
        return self.layout.config_file(self.index)

    def pid(self) -> int | None:
        return process.read_pid(self.cfg.pid_file(self.name), str(self.config_file))

    def launch(self) -> None:
        tls = tls_files(self.cfg)
        passwords = load_secrets(self.layout)
        props = node_properties(self.layout, self.index, tls, passwords[ADMIN])
        self.config_file.parent.mkdir(parents=True, exist_ok=True)
        self.config_file.touch(mode=0o600)
        self.config_file.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        self._write_log_config()
        if not (self.layout.data_dir(self.index) / "meta.properties").exists():
            scram = [f"--add-scram={MECHANISM}=[name={u},password={p}]" for u, p in passwords.items()]
            args = ["format", "-t", cluster_id(self.layout), "-c", str(self.config_file), *scram]
            process.run_retrying_once(
                None,
                self._java("kafka.tools.StorageTool", *args),
                f"formatting {self.name}'s storage",
                retry_cmd=self._java("kafka.tools.StorageTool", *args, "--ignore-formatted"),
            )
        process.spawn(
            self._java("kafka.Kafka", str(self.config_file)), self.log_file, self.cfg.pid_file(self.name)
        )

    def _write_log_config(self) -> None:
        # The nodes' _java() points at the stack's log4j2 configuration (warnings and errors only).
        path = self.cfg.home / "kafka" / "log4j2.properties"
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists():
            path.write_text(LOG4J2)

    def healthy(self) -> bool:
        """The cluster answers as the admin and lists this node among its brokers."""
        return self.node_id in cluster_brokers(self.cfg)

    def signal(self, sig: signal.Signals) -> None:
        """SIGKILL, SIGSTOP or SIGCONT to this node (the fault tests); nothing if it is not running."""
        pid = self.pid()
        if pid is not None:
            os.kill(pid, sig)


def cluster_id(layout: Layout) -> str:
    path = layout.directory / "cluster.id"
    if not path.exists():
        layout.directory.mkdir(parents=True, exist_ok=True)
        path.write_text(base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode())
    return path.read_text().strip()


def nodes(cfg: StackConfig) -> list[KafkaNode]:
    return [KafkaNode(cfg, i) for i in range(NODES)]


def admin_client(cfg: StackConfig, user: str = ADMIN) -> AdminClient:
    return AdminClient(
        {"bootstrap.servers": Layout.of(cfg).bootstrap, **client_settings(cfg, user), "log_level": 0}
    )


def cluster_brokers(cfg: StackConfig) -> set[int]:
    """The node ids the cluster's metadata lists as brokers now; empty when it does not answer."""
    admin = admin_client(cfg)
    try:
        return set(admin.list_topics(timeout=PROBE_TIMEOUT_S).brokers)
    except Exception:
        return set()


def up(cfg: StackConfig, timeout_s: float = CLUSTER_UP_TIMEOUT_S) -> str:
    """Start every node not running and wait until each is a broker of the cluster; returns the
    bootstrap servers. The ports are checked before anything is launched."""
    members = nodes(cfg)
    for node in members:
        if node.pid() is None:
            for port in (
                node.port,
                node.layout.internal_port(node.index),
                node.layout.controller_port(node.index),
            ):
                process.refuse_busy_port(port, node.name, node.port_env_var)
    for node in members:
        node.start()
    for node in members:
        node.wait_healthy(timeout_s)
    return Layout.of(cfg).bootstrap


def down(cfg: StackConfig) -> None:
    """Stops every node at once: one by one, the last waits out its controlled shutdown (30 s)."""
    pids = [pid for node in nodes(cfg) if (pid := node.pid()) is not None]
    for pid in pids:
        os.kill(pid, signal.SIGCONT)  # a node a test left stopped would not hear SIGTERM
    process.terminate_together(pids)


def running(cfg: StackConfig) -> bool:
    return any(node.pid() is not None for node in nodes(cfg))


def grant_pipeline(cfg: StackConfig, prefix: str, *, transactions: bool = True) -> None:
    """ACLs for one pipeline whose topics (and control topic) are named `<prefix>.…`: the worker
    may describe, create, write and read back (its re-snapshot's reconciliation) those topics,
    with its own consumer group, and (`transactions`) write and describe its slots' transactional
    ids, `bottledwater-<prefix>-<slot>` (`--delivery exactly-once`), and delete their groups; the
    merge may only describe and read them, with Spark's groups. Nothing else: no other topic, no
    cluster-wide right."""
    if not prefix or "*" in prefix:
        raise StackError(
            "grant_pipeline needs a topic prefix (the worker's -p), not an empty one or a wildcard"
        )
    topics = f"{prefix}."

    def allow(user: str, kind: ResourceType, name: str, operation: AclOperation) -> AclBinding:
        return AclBinding(
            kind, name, ResourcePatternType.PREFIXED, f"User:{user}", "*", operation, AclPermissionType.ALLOW
        )

    bindings = [
        *(allow(WORKER, ResourceType.TOPIC, topics, op) for op in WORKER_TOPIC_OPERATIONS),
        allow(WORKER, ResourceType.GROUP, WORKER_GROUP_PREFIX, AclOperation.READ),
        allow(MERGE, ResourceType.TOPIC, topics, AclOperation.DESCRIBE),
        allow(MERGE, ResourceType.TOPIC, topics, AclOperation.READ),
        allow(MERGE, ResourceType.GROUP, MERGE_GROUP_PREFIX, AclOperation.READ),
    ]
    if transactions:
        bindings += [
            allow(WORKER, ResourceType.TRANSACTIONAL_ID, transactional_ids(prefix), operation)
            for operation in (AclOperation.WRITE, AclOperation.DESCRIBE)
        ]
        # A new slot deletes the group of an earlier snapshot's points (`<transactional id>-snapshot`).
        bindings.append(allow(WORKER, ResourceType.GROUP, transactional_ids(prefix), AclOperation.DELETE))
    admin = admin_client(cfg)
    for future in admin.create_acls(bindings, request_timeout=30).values():
        future.result(timeout=30)


def environment(cfg: StackConfig) -> Mapping[str, str]:
    """What `bw-stack kafka-cluster env` prints: addresses and files, never a password."""
    tls = tls_files(cfg)
    return {
        "BW_KAFKA_CLUSTER_BOOTSTRAP": Layout.of(cfg).bootstrap,
        "BW_KAFKA_CLUSTER_CA": str(tls.ca_cert),
        "BW_KAFKA_CLUSTER_SECRETS": str(Layout.of(cfg).directory / "secrets.json"),
    }
