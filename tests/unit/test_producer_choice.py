"""Which producer the publisher builds: the native one when asked and possible, else confluent-kafka
with the reason in its one line. Building librdkafka clients connects nothing (that happens in the
background), so no broker is needed: the address below is never reached."""

from __future__ import annotations

import pytest

from cdc_worker.core.encoding import native
from cdc_worker.shell.kafka_publisher import KafkaPublisher

NOWHERE = "127.0.0.1:1"


def opened(settings: dict[str, str], *, native_producer: bool) -> KafkaPublisher:
    publisher = KafkaPublisher(NOWHERE, settings)
    publisher.open(native_producer=native_producer)
    return publisher


def test_the_native_producer_is_built_only_when_asked() -> None:
    assert opened({}, native_producer=False).native is None
    publisher = opened({}, native_producer=True)
    if native.NATIVE_AVAILABLE:
        assert publisher.native is not None
        assert publisher.producer_line.startswith("producer: native")
    else:
        assert publisher.native is None
        assert "native codec not loaded" in publisher.producer_line


@pytest.mark.native
@pytest.mark.parametrize(
    "setting",
    [
        {"security.protocol": "ssl"},
        {"compression.codec": "zstd"},
        {"security.protocol": "sasl_ssl", "sasl.mechanisms": "SCRAM-SHA-512", "sasl.username": "u",
         "sasl.password": "p"},
        {"security.protocol": "sasl_ssl", "sasl.mechanisms": "PLAIN", "sasl.username": "u",
         "sasl.password": "p"},
        {"security.protocol": "sasl_ssl", "sasl.mechanisms": "OAUTHBEARER",
         "enable.sasl.oauthbearer.unsecure.jwt": "true"},
    ],
)  # fmt: skip
def test_the_native_producer_serves_tls_sasl_and_zstd(setting: dict[str, str]) -> None:
    publisher = opened(setting, native_producer=True)
    assert publisher.native is not None, publisher.producer_line
    assert publisher.producer_line.startswith("producer: native")


@pytest.mark.native
def test_oidc_falls_back_to_confluent_kafka_in_one_line_without_the_secret() -> None:
    secret = "s3cr3t-client-secret"
    setting = {
        "security.protocol": "sasl_ssl",
        "sasl.mechanisms": "OAUTHBEARER",
        "sasl.oauthbearer.method": "oidc",
        "sasl.oauthbearer.client.id": "bw",
        "sasl.oauthbearer.client.secret": secret,
        "sasl.oauthbearer.token.endpoint.url": "https://127.0.0.1:1/token",
    }
    publisher = opened(setting, native_producer=True)
    assert publisher.native is None
    assert publisher.producer_line.startswith("producer: confluent-kafka, the native producer cannot be used")
    assert "libcurl" in publisher.producer_line
    assert "\n" not in publisher.producer_line and secret not in publisher.producer_line
    assert publisher.producer is not None  # confluent-kafka's librdkafka has it


def test_a_refused_setting_never_quotes_a_secret() -> None:
    """librdkafka quotes a refused property's value back; a secret's must not reach the line."""
    secret = "s3cr3t-value"
    with pytest.raises(native.NativeProducerUnavailable) as refused:
        native.build_native_producer({"sasl.password": secret, "no.such.property": secret})
    assert secret not in str(refused.value)


def test_version_names_the_producer() -> None:
    assert "confluent-kafka" in native.producer_description()
    if native.NATIVE_AVAILABLE:
        assert "librdkafka" in native.producer_description()
