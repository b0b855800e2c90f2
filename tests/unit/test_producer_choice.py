"""Which producer the publisher builds: the native one when asked and possible, else confluent-kafka
with the reason in its one line. Building librdkafka clients connects nothing (that happens in the
background), so no broker is needed: the address below is never reached."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from cdc_worker.core.ack import FailurePolicy
from cdc_worker.core.encoding import native
from cdc_worker.shell.kafka_publisher import KafkaPublisher
from cdc_worker.shell.logs import LogFormat
from cdc_worker.shell.snapshot.chunks import SnapshotSpec
from cdc_worker.shell.snapshot.process import ProcessSettings, snapshot_publisher
from cdc_worker.shell.snapshot.spark_ranges import RangeJob, task_publisher

NOWHERE = "127.0.0.1:1"
SPEC = SnapshotSpec("host=nowhere", "snap", 42, datetime(2026, 1, 1, tzinfo=UTC))


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


@pytest.mark.skipif(not native.NATIVE_AVAILABLE, reason=native.codec_description())
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


def snapshot_process_settings(kafka_config: dict[str, str]) -> ProcessSettings:
    return ProcessSettings(
        SPEC, NOWHERE, kafka_config, {}, "bw", lambda: lambda event: None, LogFormat.TEXT, "INFO", 1
    )


def test_the_snapshot_processes_and_tasks_produce_without_idempotence_still_acks_all() -> None:
    for publisher in (
        snapshot_publisher(snapshot_process_settings({})),
        task_publisher(RangeJob(SPEC, NOWHERE, {}, "avro", {}, "p", {}, FailurePolicy.EXIT), 0),
    ):
        publisher.open(native_producer=False)
        assert (publisher.settings["enable.idempotence"], publisher.settings["acks"]) == ("false", "all")
    stream = opened({}, native_producer=False)  # the worker's own producer: the stream, re-snapshots
    assert (stream.settings["enable.idempotence"], stream.settings["acks"]) == ("true", "all")


def test_a_users_idempotence_setting_wins_in_the_snapshot_processes() -> None:
    publisher = snapshot_publisher(snapshot_process_settings({"enable.idempotence": "true"}))
    publisher.open(native_producer=False)
    assert (publisher.settings["enable.idempotence"], publisher.settings["acks"]) == ("true", "all")
