"""The merge's `--kafka-option`s (the JVM client's names) as librdkafka settings."""

from __future__ import annotations

import pytest

from spark_jobs.kafka_client import KafkaOptionError, librdkafka_settings


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
