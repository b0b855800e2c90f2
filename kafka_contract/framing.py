"""The Confluent wire format of Avro keys and values: magic byte 0, the registered schema id as a
4-byte big-endian unsigned int, then the Avro binary body."""

from __future__ import annotations

import struct

from kafka_contract.headers import WireFormatError

CONFLUENT_MAGIC = 0
FRAME_HEADER_LENGTH = 5
_SCHEMA_ID = struct.Struct(">I")


def frame_prefix(schema_id: int) -> bytes:
    """The five bytes in front of every Avro body written with schema `schema_id`."""
    return bytes((CONFLUENT_MAGIC,)) + _SCHEMA_ID.pack(schema_id)


def parse_frame(data: bytes) -> tuple[int, int]:
    """(schema id, offset of the Avro body) of a framed message."""
    if len(data) < FRAME_HEADER_LENGTH or data[0] != CONFLUENT_MAGIC:
        first = data[:1].hex() or "nothing"
        raise WireFormatError(
            f"not a Confluent-framed Avro message (first byte {first}, {len(data)} bytes): "
            "is the topic JSON? pass --format json"
        )
    (schema_id,) = _SCHEMA_ID.unpack_from(data, 1)
    return schema_id, FRAME_HEADER_LENGTH


def frame_schema_id(data: bytes | None) -> int | None:
    return None if data is None else parse_frame(data)[0]
