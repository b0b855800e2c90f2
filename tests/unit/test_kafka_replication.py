"""How the worker replicates the topics it creates, and what the stack's secured cluster is told:
pure functions, no broker."""

from __future__ import annotations

from pathlib import Path

import pytest
from cryptography import x509

from cdc_worker.shell.kafka_topic_specs import TopicSpec, new_topic, replication_for
from stack.kafka_cluster import ADMIN, Layout, node_properties
from stack.kafka_tls import SERVER_IP, ensure_tls


@pytest.mark.parametrize(
    ("brokers", "factor", "min_insync"),
    [(1, 1, 1), (2, 2, 1), (3, 3, 2), (6, 3, 2), (None, None, None)],
)
def test_min_3_copies_and_one_fewer_in_sync(
    brokers: int | None, factor: int | None, min_insync: int | None
) -> None:
    assert replication_for(brokers, {}) == type(replication_for(1, {}))(factor, min_insync)


def test_topic_config_wins() -> None:
    chosen = replication_for(3, {"replication.factor": "2", "min.insync.replicas": "2"})
    assert (chosen.factor, chosen.min_insync) == (2, 2)
    assert replication_for(5, {"replication.factor": "3"}).min_insync == 2
    assert replication_for(5, {"min.insync.replicas": "1"}).factor == 3


def test_new_topic_carries_the_replication() -> None:
    topic = new_topic(TopicSpec("p.t", keyed=True), {"partitions": "6"}, brokers=3)
    assert (topic.replication_factor, topic.num_partitions) == (3, 6)
    assert topic.config == {"cleanup.policy": "compact", "min.insync.replicas": "2"}
    unknown = new_topic(TopicSpec("p.t", keyed=False), {})
    assert unknown.replication_factor == -1 and "min.insync.replicas" not in unknown.config


def test_describe_says_what_the_topics_get() -> None:
    assert replication_for(3, {}).describe() == "replication factor 3, min.insync.replicas 2"
    assert "default.replication.factor" in replication_for(None, {}).describe()


def test_every_listener_of_the_cluster_is_sasl_ssl_on_its_own_port(tmp_path: Path) -> None:
    layout = Layout(tmp_path, 29092)
    tls = ensure_tls(tmp_path / "tls")
    nodes = [node_properties(layout, i, tls, "pw") for i in range(3)]
    ports = {
        p
        for i in range(3)
        for p in (layout.client_port(i), layout.internal_port(i), layout.controller_port(i))
    }
    assert len(ports) == 9 and 9092 not in ports
    for i, props in enumerate(nodes):
        assert props["node.id"] == str(i + 1)
        assert set(props["listener.security.protocol.map"].split(",")) == {
            "CLIENTS:SASL_SSL", "INTERNAL:SASL_SSL", "CONTROLLER:SASL_SSL",
        }  # fmt: skip
        assert props["listener.name.clients.sasl.enabled.mechanisms"] == "SCRAM-SHA-512"
        assert props["authorizer.class.name"].endswith("StandardAuthorizer")
        assert props["allow.everyone.if.no.acl.found"] == "false"
        assert props["super.users"] == f"User:{ADMIN}"
        assert (props["default.replication.factor"], props["min.insync.replicas"]) == ("3", "2")
    assert len({props["log.dirs"] for props in nodes}) == 3
    assert layout.bootstrap == "127.0.0.1:29092,127.0.0.1:29093,127.0.0.1:29094"


def test_the_brokers_certificate_names_only_the_loopback_address(tmp_path: Path) -> None:
    tls = ensure_tls(tmp_path)
    pem = tls.server_pem.read_bytes()
    assert b"PRIVATE KEY" in pem and tls.server_pem.stat().st_mode & 0o077 == 0
    server = x509.load_pem_x509_certificates(pem)[0]
    names = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in names.get_values_for_type(x509.IPAddress)] == [SERVER_IP]
    assert names.get_values_for_type(x509.DNSName) == []
    ca = x509.load_pem_x509_certificate(tls.ca_cert.read_bytes())
    server.verify_directly_issued_by(ca)
    assert ensure_tls(tmp_path).ca_cert.read_bytes() == tls.ca_cert.read_bytes()  # made once
