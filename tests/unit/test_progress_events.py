"""The worker's progress events: their encoding (Avro and JSON, read back by the merge's decoder) and
the publisher's pure decisions (which topics, when)."""

from __future__ import annotations

import json
import struct
from datetime import UTC, datetime
from typing import Any, cast

from confluent_kafka.admin import AdminClient

from cdc_worker.core.encoding.avro_serializer import AvroEventSerializer
from cdc_worker.core.encoding.json_serializer import JsonEventSerializer
from cdc_worker.core.encoding.serializers import EncodedMessage
from cdc_worker.core.errors import RegistryUnavailable
from cdc_worker.shell.stream.progress import ProgressPublisher, due, worker_topics
from kafka_contract import control
from spark_jobs.rules.watermark import Progress, progress_of
from tests.unit.test_encoding import RecordingRegistry

AT = datetime(2026, 11, 25, 19, 0, tzinfo=UTC)
OFFSETS = {("p.orders", 0): 12, ("p.orders", 1): 0, ("p.bottledwater.control", 0): 7}


def test_avro_progress_events_read_back_through_the_control_decoder() -> None:
    registry = RecordingRegistry()
    message = AvroEventSerializer(registry, {}, topic_prefix="p").progress(4242, AT, OFFSETS)
    assert message.topic == "p.bottledwater.control"
    assert dict(message.headers)["bw.op"] == b"progress"

    def schema_by_id(schema_id: int) -> Any:
        return registry.client.get_schema(schema_id).schema_str

    decode = control.ControlDecoder("avro", schema_by_id)
    (key_id,) = struct.unpack(">I", (message.key or b"")[1:5])
    assert message.key is not None and message.key.endswith(control.PROGRESS_KEY.encode())
    event = progress_of(decode(message.value or b""))
    assert event == Progress(4242, OFFSETS, AT)
    assert key_id > 0


def test_json_progress_events_read_back_through_the_control_decoder() -> None:
    message = JsonEventSerializer({}, topic_prefix="p").progress(4242, AT, OFFSETS)
    assert json.loads(message.key or b"") == "#progress"
    record = control.ControlDecoder("json")(message.value or b"")
    assert record["op"] == "progress" and record["lsn"] == 4242
    event = progress_of(record)
    assert event is not None and event.offsets == OFFSETS


def test_older_control_readers_see_no_new_required_field() -> None:
    from cdc_worker.core.encoding import avro_schema

    fields = {f["name"]: f for f in avro_schema.control_value_schema()["fields"]}
    assert fields["progress_offsets"]["default"] is None


def test_the_topics_bounded_are_the_workers() -> None:
    names = ["p.orders", "p.bottledwater.control", "q.orders", "__consumer_offsets", "_schemas"]
    assert worker_topics(names, "p", "p.bottledwater.control") == ["p.bottledwater.control", "p.orders"]
    assert worker_topics(names, None, "bottledwater.control") == [
        "bottledwater.control",
        "p.bottledwater.control",
        "p.orders",
        "q.orders",
    ]


def test_progress_goes_out_when_the_position_moves_and_now_and_then_when_idle() -> None:
    assert not due(0, None, 0.0, 1.0, 30.0)  # nothing acknowledged yet
    assert due(10, None, 0.0, 1.0, 30.0)
    assert not due(20, 10, 0.5, 1.0, 30.0)
    assert due(20, 10, 1.0, 1.0, 30.0)
    assert not due(10, 10, 10.0, 1.0, 30.0)
    assert due(10, 10, 30.0, 1.0, 30.0)


def test_an_unchanged_position_is_published_again_only_while_the_session_is_caught_up() -> None:
    """A repeat of the last position says Postgres still had nothing newer: not while a transaction
    is arriving. A moved position always goes out."""
    published: list[int] = []
    caught_up = [False]
    publisher = ProgressPublisher(
        cast(AdminClient, None),
        lambda lsn, at, offsets: cast(EncodedMessage, lsn),
        lambda message: published.append(cast(int, message)),
        topic_prefix="p",
        control_topic="p.bottledwater.control",
        caught_up=lambda: caught_up[0],
    )

    def ready(lsn: int) -> None:
        publisher._ready = (lsn, datetime.now(UTC), {})
        publisher.publish_ready()

    ready(100)  # the first: nothing published before
    ready(100)  # a repeat while a transaction is open: held back
    ready(200)  # moved: out, caught up or not
    caught_up[0] = True
    ready(200)  # a repeat on an idle source: out
    assert published == [100, 200, 200]
    assert publisher.published == 3


def test_a_progress_event_the_registry_cannot_encode_is_skipped_and_the_next_goes_out() -> None:
    """The registry down at the control topic's first event: a warning, not the worker's end."""
    published: list[int] = []
    registry_up = [False]

    def encode(lsn: int, at: datetime, offsets: dict[tuple[str, int], int]) -> EncodedMessage:
        if not registry_up[0]:
            raise RegistryUnavailable("registering the schema of subject p.bottledwater.control-key failed")
        return cast(EncodedMessage, lsn)

    publisher = ProgressPublisher(
        cast(AdminClient, None),
        encode,
        lambda message: published.append(cast(int, message)),
        topic_prefix="p",
        control_topic="p.bottledwater.control",
    )
    publisher._ready = (100, AT, {})
    publisher.publish_ready()
    registry_up[0] = True
    publisher._ready = (100, AT, {})
    publisher.publish_ready()
    assert published == [100] and publisher.published == 1
