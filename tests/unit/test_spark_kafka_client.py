"""The merge's `--kafka-option`s (the JVM client's names) as librdkafka settings."""

from __future__ import annotations

import pytest

from orchestration.continuous_merge import merge_environment
from spark_jobs.connections.kafka_client import KafkaOptionError, jvm_options, librdkafka_settings
from spark_jobs.option_parser import kafka_options
from spark_jobs.options import KAFKA_OPTIONS_ENV


def test_a_sasl_ssl_source_becomes_librdkafka_settings() -> None:
    options = {
        "kafka.security.protocol": "SASL_SSL",
        "kafka.sasl.mechanism": "SCRAM-SHA-512",
        "kafka.sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule required "
        'username="bw-merge" password="p\\"w";',
        "kafka.ssl.truststore.type": "PEM",
        "kafka.ssl.truststore.location": "/etc/ca.pem",
        "kafka.ssl.endpoint.identification.algorithm": "https",
        "startingOffsets": "earliest",
    }
    assert librdkafka_settings(options) == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanisms": "SCRAM-SHA-512",
        "sasl.username": "bw-merge",
        "sasl.password": 'p"w',
        "ssl.ca.location": "/etc/ca.pem",
        "ssl.endpoint.identification.algorithm": "https",
    }


def test_a_jks_truststore_is_refused_with_the_pem_form() -> None:
    with pytest.raises(KafkaOptionError, match="truststore.type=PEM"):
        librdkafka_settings({"kafka.ssl.truststore.location": "/etc/trust.jks"})


def test_plain_options_pass_through() -> None:
    assert librdkafka_settings({"kafka.client.id": "m", "subscribe": "x"}) == {"client.id": "m"}


def test_librdkafka_settings_become_the_jvm_clients_and_back() -> None:
    settings = {
        "bootstrap.servers": "b:9093",
        "security.protocol": "SASL_SSL",
        "sasl.mechanisms": "SCRAM-SHA-512",
        "sasl.username": "bw-merge",
        "sasl.password": 'p"w\\x',
        "ssl.ca.location": "/etc/ca.pem",
    }
    options = jvm_options(settings)
    assert options["kafka.sasl.mechanism"] == "SCRAM-SHA-512"
    assert options["kafka.sasl.jaas.config"].startswith(
        "org.apache.kafka.common.security.scram.ScramLoginModule"
    )
    assert (options["kafka.ssl.truststore.type"], options["kafka.ssl.truststore.location"]) == (
        "PEM",
        "/etc/ca.pem",
    )
    assert not any(
        k in options for k in ("kafka.sasl.username", "kafka.sasl.password", "kafka.ssl.ca.location")
    )
    back = librdkafka_settings(options)
    assert {k: v for k, v in back.items()} == {k: v for k, v in settings.items() if k != "bootstrap.servers"}


def test_credentials_for_a_mechanism_without_a_jaas_module_are_refused() -> None:
    with pytest.raises(KafkaOptionError, match="jaas.config"):
        jvm_options({"sasl.mechanisms": "GSSAPI", "sasl.username": "u"})


def test_the_merge_takes_kafka_options_from_its_environment_one_per_line() -> None:
    jaas = 'org.apache.kafka.common.security.plain.PlainLoginModule required username="u" password="p";'
    environ = {KAFKA_OPTIONS_ENV: f"kafka.sasl.jaas.config={jaas}\nkafka.security.protocol=SASL_SSL\n"}
    chosen = kafka_options(["kafka.security.protocol=SSL"], environ)
    assert chosen == {"kafka.sasl.jaas.config": jaas, "kafka.security.protocol": "SSL"}  # flags win


def test_dagster_gives_the_continuous_merge_its_kafka_secrets_through_the_environment() -> None:
    options = {"kafka.sasl.jaas.config": 'x required username="u" password="s3cret";'}
    env = merge_environment(None, None, options)
    assert kafka_options([], env) == options
