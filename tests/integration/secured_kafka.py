"""The stack's secured three-node Kafka cluster (stack/kafka_cluster.py) as the tests use it: each
principal's settings, the ACLs of a test's prefix, readers, and the nodes to fail."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from confluent_kafka.admin import AdminClient

from stack import kafka_cluster
from stack.config import StackConfig
from tests.integration.worker_harness import TopicReader


@dataclass(frozen=True)
class SecuredKafka:
    cfg: StackConfig
    bootstrap: str

    def settings(self, user: str) -> dict[str, str]:
        """librdkafka settings (`-C`) for `user`, bootstrap apart."""
        return kafka_cluster.client_settings(self.cfg, user)

    def password(self, user: str) -> str:
        return self.settings(user)["sasl.password"]

    def worker_env(self, user: str = kafka_cluster.WORKER, **overrides: str) -> dict[str, str]:
        """The worker's `-C` through its environment variable, as a deployment passes secrets:
        never on the command line, where the process list would show them."""
        settings = {**self.settings(user), **overrides}
        return {"BOTTLEDWATER_KAFKA_CONFIG": ";".join(f"{k}={v}" for k, v in settings.items())}

    def spark_options(self, user: str = kafka_cluster.MERGE) -> dict[str, str]:
        return kafka_cluster.spark_options(self.cfg, user)

    def grant(self, prefix: str, *, transactions: bool = True) -> None:
        kafka_cluster.grant_pipeline(self.cfg, prefix, transactions=transactions)

    def reader(self, user: str = kafka_cluster.MERGE) -> TopicReader:
        """A reader as the merge's principal, in a group its ACLs allow."""
        return TopicReader(
            self.bootstrap, self.settings(user), group_prefix=f"{kafka_cluster.MERGE_GROUP_PREFIX}test"
        )

    def admin(self) -> AdminClient:
        return kafka_cluster.admin_client(self.cfg)

    def nodes(self) -> list[kafka_cluster.KafkaNode]:
        return kafka_cluster.nodes(self.cfg)

    def quorum_leader(self, among: Sequence[kafka_cluster.KafkaNode] | None = None) -> tuple[int, int] | None:
        """(node id, epoch) of the controller quorum's active leader, as the nodes `among` (default
        all) last persisted it in their Raft state (`__cluster_metadata-0/quorum-state`, written on
        every election). The cluster has no plaintext port and the stack no `kafka-metadata-quorum`
        (kafka-tools is not among its jars), and brokers answer the admin API's DescribeCluster with
        a random broker under KRaft, not the active controller: the nodes' own files are the truth."""
        states = []
        for node in among if among is not None else self.nodes():
            path = node.layout.data_dir(node.index) / "__cluster_metadata-0" / "quorum-state"
            if path.exists():
                states.append(json.loads(path.read_text()))
        return elected_leader(states)

    def delete_prefix(self, prefix: str) -> None:
        admin = self.admin()
        names = [t for t in admin.list_topics(timeout=30).topics if t.startswith(prefix + ".")]
        for future in admin.delete_topics(names).values() if names else ():
            future.result(timeout=60)


def elected_leader(states: Iterable[Mapping[str, object]]) -> tuple[int, int] | None:
    """The leader of the latest epoch any of these Raft states knows a leader for. Pure."""
    known = [
        (int(str(s["leaderEpoch"])), int(str(s["leaderId"])))
        for s in states
        if int(str(s.get("leaderId", -1))) >= 0
    ]
    if not known:
        return None
    epoch, leader = max(known)
    return leader, epoch


class ClusterLease:
    """Whether this run started the cluster, so that it stops only what it started, once: after the
    last test that uses it (`release`, from conftest's teardown hook) or at the session's end."""

    def __init__(self) -> None:
        self.cfg: StackConfig | None = None

    def take(self) -> SecuredKafka:
        cfg = StackConfig.from_env()
        started_here = not kafka_cluster.running(cfg)
        bootstrap = kafka_cluster.up(cfg)
        self.cfg = cfg if started_here else None
        return SecuredKafka(cfg, bootstrap)

    def release(self) -> None:
        if self.cfg is not None:
            cfg, self.cfg = self.cfg, None
            kafka_cluster.down(cfg)


LEASE = ClusterLease()


def secured_cluster() -> Iterator[SecuredKafka]:
    try:
        yield LEASE.take()
    finally:
        LEASE.release()
