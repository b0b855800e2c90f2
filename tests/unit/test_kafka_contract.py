"""The shared Kafka contract read back: what the worker's serializers write, `kafka_contract` reads
(the merge and Dagster decode control events with it)."""

from __future__ import annotations

import dataclasses

import pytest

from cdc_worker.core.encoding.avro_serializer import AvroEventSerializer
from cdc_worker.core.encoding.json_serializer import JsonEventSerializer
from kafka_contract import control, framing, headers
from tests.unit.test_encoding import SNAPSHOT_DONE_EVENT, TRUNCATE, RecordingRegistry


def test_control_decoder_reads_the_workers_avro_events() -> None:
    registry = RecordingRegistry()
    serializer = AvroEventSerializer(registry, {}, topic_prefix="p")
    decode = control.ControlDecoder(
        "avro", lambda schema_id: registry.client.get_schema(schema_id).schema_str
    )
    truncate = decode(serializer.truncate(TRUNCATE)[1].value or b"")
    assert (truncate["op"], truncate["topic"], truncate["cascade"]) == (
        control.TRUNCATE,
        "p.sales.items",
        True,
    )
    report = decode(serializer.snapshot_control(SNAPSHOT_DONE_EVENT).value or b"")
    assert report["op"] in control.SNAPSHOT_OPS and (report["snapshot_id"], report["rows"]) == ("r1", 1234)


def test_control_decoder_reads_the_workers_json_events() -> None:
    failed = dataclasses.replace(SNAPSHOT_DONE_EVENT, op=control.SNAPSHOT_FAILED, reason="table gone")
    message = JsonEventSerializer({}).snapshot_control(failed)
    assert message.key == b'"' + control.snapshot_key("public.orders").encode() + b'"'
    record = control.ControlDecoder("json")(message.value or b"")
    assert (record["op"], record["reason"]) == (control.SNAPSHOT_FAILED, "table gone")


def test_control_decoder_refuses_what_it_cannot_read() -> None:
    with pytest.raises(ValueError, match="writer schemas by id"):
        control.ControlDecoder("avro")
    with pytest.raises(ValueError, match="avro or json"):
        control.ControlDecoder("protobuf")
    with pytest.raises(headers.WireFormatError, match="is the topic JSON"):
        control.ControlDecoder("avro", lambda _: "{}")(b'{"op": "t"}')


def test_frame_prefix_round_trips() -> None:
    prefix = framing.frame_prefix(0x01020304)
    assert prefix == b"\x00\x01\x02\x03\x04"
    assert framing.parse_frame(prefix + b"body") == (0x01020304, framing.FRAME_HEADER_LENGTH)


def test_headers_parse_what_the_worker_writes() -> None:
    message = JsonEventSerializer({}).truncate(TRUNCATE)[0]
    parsed = headers.parse_headers(headers.header_map(list(message.headers)))
    assert (parsed.op, parsed.lsn, parsed.seq) == (headers.OP_TRUNCATE, TRUNCATE.commit_lsn, TRUNCATE.seq)
    assert headers.iso_micros(headers.iso_utc(TRUNCATE.commit_ts)) == parsed.commit_ts_micros
