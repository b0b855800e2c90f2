"""Decoder for the `pgoutput` logical replication protocol, versions 1 and 2.

Input: the payload of one XLogData message (one logical replication message). Output: one frozen
dataclass per message. No sockets, no catalog: type OIDs stay OIDs and values stay the text that
Postgres' output functions produced (the converters turn them into typed values).

Version 2 adds streaming of large in-progress transactions: between Stream Start and Stream Stop,
the data messages (Relation, Type, Insert, Update, Delete, Truncate, Message) carry the xid of
their (sub)transaction right after the type byte. The buffer alone does not say whether that xid is
there, so `PgOutputDecoder` tracks Stream Start/Stop; `decode_message` takes `in_stream` explicitly.

Decoding tuples is the hot path of the whole worker (Insert has its own shortcut): tuple data is
read with a bound `struct.Struct.unpack_from` and byte indexing on one `bytes` object, and each
column becomes a plain `str` (or None / bytes / UNCHANGED_TOAST) in a preallocated list; no
per-column objects beyond the value itself. About 2.8 us for a 10-column Insert on the dev box.

Text values are decoded as UTF-8: pgoutput sends them in the database encoding, so the worker
supports UTF8 databases only (the shell is to check `server_encoding` at start and refuse others).
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from cdc_worker.core.model import UNCHANGED_TOAST, Column, ColumnValue, ReplicaIdentity, TableSchema
from cdc_worker.core.pgoutput.messages import (
    POSTGRES_EPOCH,
    Begin,
    ColumnFlag,
    ColumnKind,
    Commit,
    Delete,
    Insert,
    LogicalMessage,
    LogicalMessageFlag,
    MessageType,
    Origin,
    PgOutputMessage,
    Relation,
    Row,
    StreamAbort,
    StreamCommit,
    StreamStart,
    StreamStartFlag,
    StreamStop,
    Truncate,
    TruncateOption,
    TupleKind,
    Type,
    Update,
    timestamp_from_postgres,
)

__all__ = [
    "POSTGRES_EPOCH",
    "SUPPORTED_PROTOCOL_VERSIONS",
    "Begin",
    "ColumnFlag",
    "ColumnKind",
    "Commit",
    "Delete",
    "Insert",
    "LogicalMessage",
    "LogicalMessageFlag",
    "MessageType",
    "Origin",
    "PgOutputDecodeError",
    "PgOutputDecoder",
    "PgOutputMessage",
    "Relation",
    "Row",
    "StreamAbort",
    "StreamCommit",
    "StreamStart",
    "StreamStartFlag",
    "StreamStop",
    "Truncate",
    "TruncateOption",
    "TupleKind",
    "Type",
    "Update",
    "decode_message",
    "timestamp_from_postgres",
]

SUPPORTED_PROTOCOL_VERSIONS = (1, 2)
# A Relation message names pg_catalog's tables with an empty namespace.
_CATALOG_NAMESPACE = "pg_catalog"


class PgOutputDecodeError(ValueError):
    """A buffer that is not one well-formed pgoutput message (truncated, garbage, trailing bytes)."""

    def __init__(self, reason: str, *, message_type: str, offset: int, size: int) -> None:
        super().__init__(
            f"cannot decode pgoutput {message_type} message: {reason} at byte {offset} of {size}"
        )
        self.message_type = message_type
        self.offset = offset


_U8 = struct.Struct(">B").unpack_from
_U16 = struct.Struct(">H").unpack_from
_U32 = struct.Struct(">I").unpack_from
_U64 = struct.Struct(">Q").unpack_from
_U32_U8 = struct.Struct(">IB").unpack_from
_BEGIN = struct.Struct(">QqI")
_COMMIT = struct.Struct(">BQQq")
_STREAM_COMMIT = struct.Struct(">IBQQq")
_RELATION_COLUMN = struct.Struct(">Ii")  # type OID, typmod
_OID_SIZE = 4
_TUPLE_HEADER = struct.Struct(">IBH")  # relation OID, tuple kind, column count
_INSERT_CODE = MessageType.INSERT.value
_NEW_TUPLE = TupleKind.NEW.value
_INSERT_HEADER_END = 1 + _TUPLE_HEADER.size
_UTF8 = "utf-8"
# Plain ints for the hot loop: comparing with an IntEnum member goes through its __eq__.
_TEXT = ColumnKind.TEXT.value
_NULL = ColumnKind.NULL.value
_TOAST = ColumnKind.UNCHANGED_TOAST.value
_BINARY = ColumnKind.BINARY.value
_NUL = b"\x00"


def _read_string(buf: bytes, pos: int) -> tuple[str, int]:
    """A NUL-terminated UTF-8 String; returns it and the offset after the NUL."""
    end = buf.index(_NUL, pos)  # ValueError when unterminated: reported by decode_message
    return buf[pos:end].decode(_UTF8), end + 1


def _read_columns(buf: bytes, pos: int, count: int) -> tuple[Row, int]:
    """TupleData's columns after its Int16 count. The hot loop: locals only, one str per column."""
    values: list[ColumnValue] = [None] * count  # preallocated: NULLs need no store at all
    u32 = _U32
    text, null, toast, binary = _TEXT, _NULL, _TOAST, _BINARY
    for index in range(count):
        kind = buf[pos]
        if kind == text:
            # A length past the end makes the slice short and `pos` overshoot; decode_message's
            # final "whole buffer consumed" check turns that into an error, so no check per column.
            start = pos + 5
            pos = start + u32(buf, pos + 1)[0]
            values[index] = buf[start:pos].decode()  # UTF-8; no argument is faster
        elif kind == null:
            pos += 1
        elif kind == toast:
            values[index] = UNCHANGED_TOAST
            pos += 1
        elif kind == binary:
            start = pos + 5
            pos = start + u32(buf, pos + 1)[0]
            values[index] = buf[start:pos]
        else:
            raise ValueError(f"unknown column kind {kind!r} ({chr(kind)!r})")
    return tuple(values), pos


_object_new = object.__new__
# Slot setters of the frozen Insert: building one through them skips the generated __init__'s
# object.__setattr__ per field, which costs as much as decoding two columns.
_set_insert_oid = getattr(Insert, "relation_oid").__set__  # noqa: B009 (class attribute is a slot)
_set_insert_new = getattr(Insert, "new").__set__  # noqa: B009
_set_insert_xid = getattr(Insert, "xid").__set__  # noqa: B009


def _new_insert(relation_oid: int, new: Row) -> Insert:
    """`Insert(relation_oid, new)` (outside a stream), faster; tests check they compare equal."""
    message: Insert = _object_new(Insert)
    _set_insert_oid(message, relation_oid)
    _set_insert_new(message, new)
    _set_insert_xid(message, None)
    return message


def _read_tuple(buf: bytes, pos: int) -> tuple[Row, int]:
    """TupleData: Int16 column count, then the columns."""
    return _read_columns(buf, pos + 2, _U16(buf, pos)[0])


def _decode_begin(buf: bytes, pos: int, xid: int | None) -> tuple[PgOutputMessage, int]:
    final_lsn, ts, txid = _BEGIN.unpack_from(buf, pos)
    return Begin(final_lsn, timestamp_from_postgres(ts), ts, txid), pos + _BEGIN.size


def _decode_commit(buf: bytes, pos: int, xid: int | None) -> tuple[PgOutputMessage, int]:
    flags, commit_lsn, end_lsn, ts = _COMMIT.unpack_from(buf, pos)
    return Commit(flags, commit_lsn, end_lsn, timestamp_from_postgres(ts), ts), pos + _COMMIT.size


def _decode_origin(buf: bytes, pos: int, xid: int | None) -> tuple[PgOutputMessage, int]:
    (origin_lsn,) = _U64(buf, pos)
    name, pos = _read_string(buf, pos + 8)
    return Origin(origin_lsn, name), pos


def _decode_relation(buf: bytes, pos: int, xid: int | None) -> tuple[PgOutputMessage, int]:
    (oid,) = _U32(buf, pos)
    namespace, pos = _read_string(buf, pos + 4)
    name, pos = _read_string(buf, pos)
    identity = ReplicaIdentity(chr(buf[pos]))
    (count,) = _U16(buf, pos + 1)
    pos += 3
    columns: list[Column] = []
    flags: list[int] = []
    for _ in range(count):
        flag = buf[pos]
        column_name, pos = _read_string(buf, pos + 1)
        type_oid, typmod = _RELATION_COLUMN.unpack_from(buf, pos)
        pos += _RELATION_COLUMN.size
        columns.append(Column(column_name, type_oid, typmod, bool(flag & ColumnFlag.KEY)))
        flags.append(flag)
    schema = TableSchema(oid, namespace or _CATALOG_NAMESPACE, name, tuple(columns), identity)
    return Relation(schema, tuple(flags), xid), pos


def _decode_type(buf: bytes, pos: int, xid: int | None) -> tuple[PgOutputMessage, int]:
    (oid,) = _U32(buf, pos)
    namespace, pos = _read_string(buf, pos + 4)
    name, pos = _read_string(buf, pos)
    return Type(oid, namespace or _CATALOG_NAMESPACE, name, xid), pos


def _expect_kind(kind: int, allowed: tuple[TupleKind, ...]) -> TupleKind:
    if kind not in allowed:
        expected = " or ".join(repr(chr(k)) for k in allowed)
        raise ValueError(f"expected tuple kind {expected}, got {kind!r} ({chr(kind)!r})")
    return TupleKind(kind)


def _decode_insert(buf: bytes, pos: int, xid: int | None) -> tuple[PgOutputMessage, int]:
    oid, kind, count = _TUPLE_HEADER.unpack_from(buf, pos)
    if kind != TupleKind.NEW:
        _expect_kind(kind, (TupleKind.NEW,))
    new, pos = _read_columns(buf, pos + _TUPLE_HEADER.size, count)
    return Insert(oid, new, xid), pos


def _decode_update(buf: bytes, pos: int, xid: int | None) -> tuple[PgOutputMessage, int]:
    oid, kind = _U32_U8(buf, pos)
    pos += 5
    old_kind: TupleKind | None = None
    old: Row | None = None
    if kind != TupleKind.NEW:
        old_kind = _expect_kind(kind, (TupleKind.KEY, TupleKind.OLD, TupleKind.NEW))
        old, pos = _read_tuple(buf, pos)
        _expect_kind(buf[pos], (TupleKind.NEW,))
        pos += 1
    new, pos = _read_tuple(buf, pos)
    return Update(oid, old_kind, old, new, xid), pos


def _decode_delete(buf: bytes, pos: int, xid: int | None) -> tuple[PgOutputMessage, int]:
    oid, kind = _U32_U8(buf, pos)
    old_kind = _expect_kind(kind, (TupleKind.KEY, TupleKind.OLD))
    old, pos = _read_tuple(buf, pos + 5)
    return Delete(oid, old_kind, old, xid), pos


def _decode_truncate(buf: bytes, pos: int, xid: int | None) -> tuple[PgOutputMessage, int]:
    count, options = _U32_U8(buf, pos)
    pos += 5
    if count * _OID_SIZE > len(buf) - pos:  # check before building a format for a garbage count
        raise ValueError(f"{count} relation OIDs do not fit in the buffer")
    oids = struct.unpack_from(f">{count}I", buf, pos)
    pos += _OID_SIZE * count
    cascade = bool(options & TruncateOption.CASCADE)
    restart = bool(options & TruncateOption.RESTART_IDENTITY)
    return Truncate(tuple(oids), cascade, restart, xid), pos


def _decode_message(buf: bytes, pos: int, xid: int | None) -> tuple[PgOutputMessage, int]:
    (flags,) = _U8(buf, pos)
    (lsn,) = _U64(buf, pos + 1)
    prefix, pos = _read_string(buf, pos + 9)
    (length,) = _U32(buf, pos)
    pos += 4
    content = buf[pos : pos + length]
    transactional = bool(flags & LogicalMessageFlag.TRANSACTIONAL)
    return LogicalMessage(transactional, lsn, prefix, content, xid), pos + length


def _decode_stream_start(buf: bytes, pos: int, xid: int | None) -> tuple[PgOutputMessage, int]:
    txid, flags = _U32_U8(buf, pos)
    return StreamStart(txid, bool(flags & StreamStartFlag.FIRST_SEGMENT)), pos + 5


def _decode_stream_stop(buf: bytes, pos: int, xid: int | None) -> tuple[PgOutputMessage, int]:
    return StreamStop(), pos


def _decode_stream_commit(buf: bytes, pos: int, xid: int | None) -> tuple[PgOutputMessage, int]:
    txid, flags, commit_lsn, end_lsn, ts = _STREAM_COMMIT.unpack_from(buf, pos)
    message = StreamCommit(txid, flags, commit_lsn, end_lsn, timestamp_from_postgres(ts), ts)
    return message, pos + _STREAM_COMMIT.size


def _decode_stream_abort(buf: bytes, pos: int, xid: int | None) -> tuple[PgOutputMessage, int]:
    txid, subxid = struct.unpack_from(">II", buf, pos)
    return StreamAbort(txid, subxid), pos + 8


_Decoder = Callable[[bytes, int, "int | None"], tuple[PgOutputMessage, int]]
_DECODERS: dict[int, _Decoder] = {
    MessageType.BEGIN: _decode_begin,
    MessageType.COMMIT: _decode_commit,
    MessageType.ORIGIN: _decode_origin,
    MessageType.RELATION: _decode_relation,
    MessageType.TYPE: _decode_type,
    MessageType.INSERT: _decode_insert,
    MessageType.UPDATE: _decode_update,
    MessageType.DELETE: _decode_delete,
    MessageType.TRUNCATE: _decode_truncate,
    MessageType.MESSAGE: _decode_message,
    MessageType.STREAM_START: _decode_stream_start,
    MessageType.STREAM_STOP: _decode_stream_stop,
    MessageType.STREAM_COMMIT: _decode_stream_commit,
    MessageType.STREAM_ABORT: _decode_stream_abort,
}
# Messages that carry their (sub)transaction's xid after the type byte when sent inside a stream.
_XID_IN_STREAM = frozenset(
    {
        MessageType.RELATION,
        MessageType.TYPE,
        MessageType.INSERT,
        MessageType.UPDATE,
        MessageType.DELETE,
        MessageType.TRUNCATE,
        MessageType.MESSAGE,
    }
)
_STREAM_CONTROL = frozenset(
    {MessageType.STREAM_START, MessageType.STREAM_STOP, MessageType.STREAM_COMMIT, MessageType.STREAM_ABORT}
)


def _type_name(code: int) -> str:
    try:
        return MessageType(code).name
    except ValueError:
        return f"unknown type {code!r} ({chr(code)!r})"


def decode_message(
    data: bytes | bytearray | memoryview, *, in_stream: bool = False, protocol_version: int = 1
) -> PgOutputMessage:
    """Decode one pgoutput message. `in_stream`: between Stream Start and Stream Stop (protocol 2).

    Raises `PgOutputDecodeError` naming the message type and offset when the buffer is truncated,
    malformed, or not consumed to its last byte (a length or format we misread must not pass).
    """
    buf = data if type(data) is bytes else bytes(data)
    size = len(buf)
    # Hot path: an Insert outside a stream, well formed. Anything unusual falls through to the
    # general path below, which decodes it again and reports the error precisely.
    if size > _INSERT_HEADER_END and buf[0] == _INSERT_CODE and not in_stream:
        oid, kind, count = _TUPLE_HEADER.unpack_from(buf, 1)
        if kind == _NEW_TUPLE:
            try:
                new, pos = _read_columns(buf, _INSERT_HEADER_END, count)
            except (struct.error, IndexError, ValueError):
                pos = -1
            if pos == size:
                return _new_insert(oid, new)
    if size == 0:
        raise PgOutputDecodeError("empty buffer", message_type="(none)", offset=0, size=0)
    code = buf[0]
    decoder = _DECODERS.get(code)
    if decoder is None:
        raise PgOutputDecodeError("unknown message type", message_type=_type_name(code), offset=0, size=size)
    if code in _STREAM_CONTROL and protocol_version < 2:
        raise PgOutputDecodeError(
            f"streaming messages need protocol 2, this stream is protocol {protocol_version}",
            message_type=_type_name(code),
            offset=0,
            size=size,
        )
    pos = 1
    xid: int | None = None
    try:
        if in_stream and code in _XID_IN_STREAM:
            xid = _U32(buf, pos)[0]
            pos += 4
        message, pos = decoder(buf, pos, xid)
    except (struct.error, IndexError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
        raise PgOutputDecodeError(
            f"{type(exc).__name__}: {exc}", message_type=_type_name(code), offset=pos, size=size
        ) from exc
    if pos != size:
        reason = "truncated (a length runs past the end)" if pos > size else f"{size - pos} trailing byte(s)"
        raise PgOutputDecodeError(reason, message_type=_type_name(code), offset=min(pos, size), size=size)
    return message


class PgOutputDecoder:
    """Decodes a session's messages in order, tracking whether it is inside a stream (protocol 2)."""

    def __init__(self, protocol_version: int = 1) -> None:
        if protocol_version not in SUPPORTED_PROTOCOL_VERSIONS:
            raise ValueError(
                f"pgoutput protocol_version {protocol_version} is not supported; "
                f"use one of {SUPPORTED_PROTOCOL_VERSIONS}"
            )
        self.protocol_version = protocol_version
        self._in_stream = False

    @property
    def in_stream(self) -> bool:
        return self._in_stream

    def decode(self, data: bytes | bytearray | memoryview) -> PgOutputMessage:
        message = decode_message(data, in_stream=self._in_stream, protocol_version=self.protocol_version)
        if type(message) is StreamStart:
            self._in_stream = True
        elif type(message) is StreamStop:
            self._in_stream = False
        return message
