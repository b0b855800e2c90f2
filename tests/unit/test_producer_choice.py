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
    ("setting", "missing"),
    [({"security.protocol": "ssl"}, "OpenSSL"), ({"compression.codec": "zstd"}, "libzstd")],
)
def test_a_setting_the_native_librdkafka_lacks_falls_back_to_confluent_kafka(
    setting: dict[str, str], missing: str
) -> None:
    publisher = opened(setting, native_producer=True)
    assert publisher.native is None
    assert publisher.producer_line.startswith("producer: confluent-kafka, the native producer cannot be used")
    assert missing in publisher.producer_line
    assert publisher.producer is not None  # confluent-kafka's librdkafka has them


def test_version_names_the_producer() -> None:
    assert "confluent-kafka" in native.producer_description()
    if native.NATIVE_AVAILABLE:
        assert "librdkafka" in native.producer_description()
