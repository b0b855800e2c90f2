"""pgoutput decoder fed literal bytes, one message type at a time, protocol 1 and 2.

The bytes are written out by hand from the protocol documentation (helpers below only pack
big-endian integers), so a misread field width or order fails here; `test_pgoutput_captured.py`
checks the same decoder against bytes a real Postgres sent.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from cdc_worker.core.model import UNCHANGED_TOAST, Column, ReplicaIdentity, TableSchema
from cdc_worker.core.pgoutput.decoder import (
    Begin,
    Commit,
    Delete,
    Insert,
    LogicalMessage,
    Origin,
    PgOutputDecodeError,
    PgOutputDecoder,
    Relation,
    StreamAbort,
    StreamCommit,
    StreamStart,
    StreamStop,
    Truncate,
    TupleKind,
    Type,
    Update,
    decode_message,
)


def u8(v: int) -> bytes:
    return v.to_bytes(1, "big")


def u16(v: int) -> bytes:
    return v.to_bytes(2, "big")


def u32(v: int) -> bytes:
    return v.to_bytes(4, "big")


def i32(v: int) -> bytes:
    return v.to_bytes(4, "big", signed=True)


def u64(v: int) -> bytes:
    return v.to_bytes(8, "big")


def cstr(s: str) -> bytes:
    return s.encode() + b"\x00"


def text(s: str) -> bytes:
    raw = s.encode()
    return b"t" + u32(len(raw)) + raw


# 2024-05-01 12:34:56.789012 UTC in microseconds since 2000-01-01.
TS = datetime(2024, 5, 1, 12, 34, 56, 789012, tzinfo=UTC)
TS_US = (TS - datetime(2000, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)
OID = 16384

BEGIN = b"B" + u64(0x16_B374_D848) + u64(TS_US) + u32(771)
COMMIT = b"C" + u8(0) + u64(0x16_B374_D848) + u64(0x16_B374_D878) + u64(TS_US)
RELATION = (
    b"R"
    + u32(OID)
    + cstr("public")
    + cstr("users")
    + b"d"
    + u16(3)
    + (u8(1) + cstr("id") + u32(23) + i32(-1))
    + (u8(0) + cstr("name") + u32(1043) + i32(68))  # varchar(64): typmod 64 + 4
    + (u8(0) + cstr("bio") + u32(25) + i32(-1))
)
INSERT = b"I" + u32(OID) + b"N" + u16(3) + text("1") + text("Zoë") + b"n"
SCHEMA = TableSchema(
    OID,
    "public",
    "users",
    (Column("id", 23, -1, True), Column("name", 1043, 68), Column("bio", 25, -1)),
    ReplicaIdentity.DEFAULT,
)


def test_begin() -> None:
    message = decode_message(BEGIN)
    assert message == Begin(final_lsn=0x16_B374_D848, commit_ts=TS, commit_ts_us=TS_US, xid=771)
    assert message.commit_ts.tzinfo is not None


def test_commit() -> None:
    assert decode_message(COMMIT) == Commit(0, 0x16_B374_D848, 0x16_B374_D878, TS, TS_US)


def test_origin() -> None:
    assert decode_message(b"O" + u64(42) + cstr("upstream")) == Origin(42, "upstream")


def test_relation_carries_schema_and_raw_flags() -> None:
    message = decode_message(RELATION)
    assert message == Relation(SCHEMA, (1, 0, 0))
    assert isinstance(message, Relation)
    assert message.schema.key_columns == ()  # the assembler decides the key


@pytest.mark.parametrize("identity", list(ReplicaIdentity))
def test_relation_replica_identities(identity: ReplicaIdentity) -> None:
    raw = b"R" + u32(1) + cstr("s") + cstr("t") + identity.value.encode() + u16(0)
    message = decode_message(raw)
    assert isinstance(message, Relation) and message.schema.replica_identity is identity


def test_relation_of_pg_catalog_has_empty_namespace_on_the_wire() -> None:
    message = decode_message(b"R" + u32(1) + cstr("") + cstr("t") + b"d" + u16(0))
    assert isinstance(message, Relation) and message.schema.namespace == "pg_catalog"


def test_type() -> None:
    assert decode_message(b"Y" + u32(90001) + cstr("public") + cstr("mood")) == Type(90001, "public", "mood")


def test_insert_each_column_marker() -> None:
    raw = b"I" + u32(OID) + b"N" + u16(4) + text("1") + b"n" + b"u" + b"b" + u32(3) + b"\x00\xff\x10"
    assert decode_message(raw) == Insert(OID, ("1", None, UNCHANGED_TOAST, b"\x00\xff\x10"))


def test_insert_text_is_utf8_and_empty_text_is_not_null() -> None:
    raw = b"I" + u32(OID) + b"N" + u16(3) + text("1") + text("Zoë 🚀") + text("")
    assert decode_message(raw) == Insert(OID, ("1", "Zoë 🚀", ""))


def test_insert_fast_path_equals_constructor() -> None:
    message = decode_message(INSERT)
    assert message == Insert(OID, ("1", "Zoë", None), None)
    assert (
        type(message) is Insert
        and message.xid is None
        and hash(message) == hash(Insert(OID, ("1", "Zoë", None)))
    )


def test_update_without_old_tuple() -> None:
    raw = b"U" + u32(OID) + b"N" + u16(3) + text("1") + text("a") + b"u"
    assert decode_message(raw) == Update(OID, None, None, ("1", "a", UNCHANGED_TOAST))


@pytest.mark.parametrize("kind", [TupleKind.KEY, TupleKind.OLD])
def test_update_with_old_tuple(kind: TupleKind) -> None:
    old = u16(3) + text("1") + b"n" + b"n"
    raw = b"U" + u32(OID) + bytes([kind]) + old + b"N" + u16(3) + text("2") + text("b") + b"n"
    assert decode_message(raw) == Update(OID, kind, ("1", None, None), ("2", "b", None))


@pytest.mark.parametrize("kind", [TupleKind.KEY, TupleKind.OLD])
def test_delete(kind: TupleKind) -> None:
    raw = b"D" + u32(OID) + bytes([kind]) + u16(3) + text("7") + b"n" + b"n"
    assert decode_message(raw) == Delete(OID, kind, ("7", None, None))


def test_truncate_options() -> None:
    raw = b"T" + u32(2) + u8(3) + u32(OID) + u32(OID + 1)
    assert decode_message(raw) == Truncate((OID, OID + 1), cascade=True, restart_identity=True)
    raw = b"T" + u32(1) + u8(0) + u32(OID)
    assert decode_message(raw) == Truncate((OID,), cascade=False, restart_identity=False)


def test_logical_message() -> None:
    raw = b"M" + u8(1) + u64(0x1_0000_0010) + cstr("bw.test") + u32(5) + b"hello"
    assert decode_message(raw) == LogicalMessage(True, 0x1_0000_0010, "bw.test", b"hello")
    raw = b"M" + u8(0) + u64(5) + cstr("p") + u32(0)
    assert decode_message(raw) == LogicalMessage(False, 5, "p", b"")


def test_protocol_2_stream_messages_and_in_stream_xids() -> None:
    decoder = PgOutputDecoder(protocol_version=2)
    assert decoder.decode(b"S" + u32(900) + u8(1)) == StreamStart(900, first_segment=True)
    assert decoder.in_stream
    # Inside a stream each data message carries its (sub)transaction's xid after the type byte.
    assert decoder.decode(b"R" + u32(901) + RELATION[1:]) == Relation(SCHEMA, (1, 0, 0), xid=901)
    assert decoder.decode(b"I" + u32(901) + INSERT[1:]) == Insert(OID, ("1", "Zoë", None), xid=901)
    raw_update = b"U" + u32(900) + u32(OID) + b"N" + u16(1) + text("x")
    assert decoder.decode(raw_update) == Update(OID, None, None, ("x",), xid=900)
    raw_delete = b"D" + u32(900) + u32(OID) + b"K" + u16(1) + text("x")
    assert decoder.decode(raw_delete) == Delete(OID, TupleKind.KEY, ("x",), xid=900)
    assert decoder.decode(b"T" + u32(900) + u32(1) + u8(1) + u32(OID)) == Truncate((OID,), True, False, 900)
    assert decoder.decode(b"Y" + u32(900) + u32(5) + cstr("s") + cstr("t")) == Type(5, "s", "t", 900)
    raw_message = b"M" + u32(900) + u8(1) + u64(9) + cstr("p") + u32(1) + b"!"
    assert decoder.decode(raw_message) == LogicalMessage(True, 9, "p", b"!", 900)
    assert decoder.decode(b"E") == StreamStop()
    assert not decoder.in_stream
    # Outside the stream the same Insert has no xid.
    assert decoder.decode(INSERT) == Insert(OID, ("1", "Zoë", None))
    assert decoder.decode(b"S" + u32(900) + u8(0)) == StreamStart(900, first_segment=False)
    decoder.decode(b"E")
    commit = b"c" + u32(900) + u8(0) + u64(0x20) + u64(0x48) + u64(TS_US)
    assert decoder.decode(commit) == StreamCommit(900, 0, 0x20, 0x48, TS, TS_US)
    assert decoder.decode(b"A" + u32(900) + u32(902)) == StreamAbort(900, 902)


def test_protocol_1_rejects_stream_messages() -> None:
    with pytest.raises(PgOutputDecodeError, match="STREAM_START.*protocol 2"):
        PgOutputDecoder(protocol_version=1).decode(b"S" + u32(900) + u8(1))


def test_unsupported_protocol_version() -> None:
    with pytest.raises(ValueError, match="protocol_version 4"):
        PgOutputDecoder(protocol_version=4)


def test_memoryview_and_bytearray_inputs() -> None:
    assert decode_message(memoryview(INSERT)) == decode_message(bytearray(INSERT)) == decode_message(INSERT)


# -- malformed buffers: every one must raise PgOutputDecodeError naming the type and offset ------

ALL_WELL_FORMED = [BEGIN, COMMIT, RELATION, INSERT, b"O" + u64(1) + cstr("o"), b"T" + u32(1) + u8(0) + u32(1)]


@pytest.mark.parametrize("raw", ALL_WELL_FORMED)
def test_every_truncation_is_an_error(raw: bytes) -> None:
    for cut in range(1, len(raw)):
        with pytest.raises(PgOutputDecodeError):
            decode_message(raw[:cut])


@pytest.mark.parametrize("raw", ALL_WELL_FORMED)
def test_trailing_bytes_are_an_error(raw: bytes) -> None:
    with pytest.raises(PgOutputDecodeError, match="1 trailing byte"):
        decode_message(raw + b"\x00")


def test_error_names_type_and_offset() -> None:
    with pytest.raises(PgOutputDecodeError) as caught:
        decode_message(INSERT + b"zz")
    assert caught.value.message_type == "INSERT"
    assert caught.value.offset == len(INSERT)
    assert "INSERT" in str(caught.value) and f"byte {len(INSERT)}" in str(caught.value)


def test_text_length_past_the_end() -> None:
    raw = b"I" + u32(OID) + b"N" + u16(1) + b"t" + u32(1000) + b"abc"
    with pytest.raises(PgOutputDecodeError, match="INSERT.*truncated"):
        decode_message(raw)


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        (b"", "empty"),
        (b"Z" + u32(1), "unknown type"),
        (b"I" + u32(OID) + b"N" + u16(1) + b"q", "unknown column kind"),
        (b"I" + u32(OID) + b"X" + u16(0), "tuple kind"),
        (b"U" + u32(OID) + b"K" + u16(0) + b"X" + u16(0), "tuple kind"),
        (b"D" + u32(OID) + b"N" + u16(0), "tuple kind"),
        (b"I" + u32(OID) + b"N" + u16(1) + b"t" + u32(2) + b"\xff\xfe", "UnicodeDecodeError"),
        (b"R" + u32(1) + cstr("s") + cstr("t") + b"z" + u16(0), "RELATION"),
        (b"R" + u32(1) + b"no terminator", "RELATION"),
        (b"T" + u32(0xFFFFFFFF) + u8(0) + u32(1), "do not fit"),
    ],
)
def test_garbage_is_an_error(raw: bytes, match: str) -> None:
    with pytest.raises(PgOutputDecodeError, match=match):
        decode_message(raw)
