"""The records a streamed transaction is spooled as: its changes already encoded for Kafka.

A change is encoded when its chunk arrives; only what depends on the commit is left for Stream
Commit: the `bw.lsn` and `bw.commit_ts` headers (the commit's LSN and time are unknown before), and
`bw.seq`, numbered at the commit in spool order so that a subtransaction abort leaves no gap. The
topic is not stored either: it follows from the relation, whose Relation record comes first.

One record is one spool payload; its first byte says its kind:

- `E` a change: op, relation OID, Kafka key and value, the `bw.unchanged` header's value, and the
  key's text values when the re-snapshot needs them (`StreamEncoder.keep_keys`);
- `S` an event that takes a `seq` and publishes nothing (the delete of an unkeyed table);
- `X` a change the serializer refused: its relation and message, reported at the commit under
  `--on-error` (a refused change of an aborted transaction is never reported);
- `F` a message the transaction's encoder could not assemble: raised at the commit (index into the
  encoder's list of exceptions), fatal then as it would have been without streaming;
- `M` a pgoutput message kept as it came (Relation, Truncate, logical message): handled at the
  commit by the general path, at its place among the changes.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from cdc_worker.core.errors import DataError, InfrastructureError

CHANGE = ord("E")
SKIP = ord("S")
ENCODING_ERROR = ord("X")
FATAL = ord("F")
MESSAGE = ord("M")

SKIP_RECORD = bytes([SKIP])
# kind, op, relation OID, key length, value length, unchanged length, key text count (-1 = None).
_CHANGE = struct.Struct(">BBIiiHh")
_ERROR = struct.Struct(">BIB")
_FATAL = struct.Struct(">BI")
_TEXT = struct.Struct(">i")

KeyText = tuple[str | None, ...]


class SpooledEncodingError(DataError):
    """A change the serializer refused when its chunk arrived, reported at the commit."""


class SpooledRegistryError(InfrastructureError):
    """The registry failed while a chunk's change was encoded, reported at the commit."""


@dataclass(frozen=True, slots=True)
class SpooledChange:
    op: str
    relation_oid: int
    key: bytes | None
    value: bytes | None
    unchanged: bytes  # the `bw.unchanged` header's value, empty when none
    key_text: KeyText | None


def change_record(  # noqa: PLR0917 - one call per change: positional on the hot path
    op: str,
    relation_oid: int,
    key: bytes | None,
    value: bytes | None,
    unchanged: tuple[str, ...] = (),
    key_text: KeyText | None = None,
) -> bytes:
    joined = ",".join(unchanged).encode() if unchanged else b""
    parts = [
        _CHANGE.pack(
            CHANGE,
            ord(op),
            relation_oid,
            -1 if key is None else len(key),
            -1 if value is None else len(value),
            len(joined),
            -1 if key_text is None else len(key_text),
        )
    ]
    if key is not None:
        parts.append(key)
    if value is not None:
        parts.append(value)
    parts.append(joined)
    for text in key_text or ():
        if text is None:
            parts.append(_TEXT.pack(-1))
        else:
            data = text.encode()
            parts.append(_TEXT.pack(len(data)))
            parts.append(data)
    return b"".join(parts)


def read_change(record: bytes) -> SpooledChange:
    op, oid, key, value, unchanged, key_text = read_change_fields(record)
    return SpooledChange(chr(op), oid, key, value, unchanged, key_text)


def read_change_fields(record: bytes) -> tuple[int, int, bytes | None, bytes | None, bytes, KeyText | None]:
    """`read_change` as a plain tuple, the op as its byte: the commit's hot path."""
    _, op, oid, key_len, value_len, unchanged_len, texts = _CHANGE.unpack_from(record)
    pos = _CHANGE.size
    key = None
    if key_len >= 0:
        key = record[pos : pos + key_len]
        pos += key_len
    value = None
    if value_len >= 0:
        value = record[pos : pos + value_len]
        pos += value_len
    unchanged = record[pos : pos + unchanged_len] if unchanged_len else b""
    if texts < 0:
        return op, oid, key, value, unchanged, None
    pos += unchanged_len
    values: list[str | None] = []
    for _ in range(texts):
        (size,) = _TEXT.unpack_from(record, pos)
        pos += _TEXT.size
        if size < 0:
            values.append(None)
        else:
            values.append(record[pos : pos + size].decode())
            pos += size
    return op, oid, key, value, unchanged, tuple(values)


def error_record(relation_oid: int, exc: Exception) -> bytes:
    return _ERROR.pack(ENCODING_ERROR, relation_oid, isinstance(exc, InfrastructureError)) + str(exc).encode()


def read_error(record: bytes) -> tuple[int, Exception]:
    """The relation and the error to report (its text as the serializer gave it)."""
    _, oid, registry = _ERROR.unpack_from(record)
    text = record[_ERROR.size :].decode()
    return oid, SpooledRegistryError(text) if registry else SpooledEncodingError(text)


def fatal_record(index: int) -> bytes:
    return _FATAL.pack(FATAL, index)


def read_fatal(record: bytes) -> int:
    return int(_FATAL.unpack_from(record)[1])


def message_record(payload: bytes) -> bytes:
    return bytes([MESSAGE]) + payload


def is_relation_record(record: bytes, relation_type: int) -> bool:
    return len(record) > 1 and record[0] == MESSAGE and record[1] == relation_type
