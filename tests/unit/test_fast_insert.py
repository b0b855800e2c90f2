"""The fused Insert path gives exactly the general path's messages, or declines and changes nothing.

Each test runs the same pgoutput bytes through two independent pipelines: the general one
(decode -> assemble -> serialize) and the fused one (`FastInsertPath`, falling back to the general
path when it declines, as the stream loop does), and compares every message byte for byte: topic,
key, value and headers, including `bw.seq` across fused and general events of one transaction.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Callable, Iterable
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from hypothesis import given, settings
from hypothesis import strategies as st

from cdc_worker.core.changes.assembler import ChangeAssembler, replica_identity_key_columns
from cdc_worker.core.changes.fast_insert import FastInsertPath
from cdc_worker.core.encoding.avro_serializer import AvroEventSerializer
from cdc_worker.core.encoding.json_serializer import JsonEventSerializer
from cdc_worker.core.encoding.serializers import EncodedMessage
from cdc_worker.core.model import ChangeEvent, TableSchema, TransactionCommitted
from cdc_worker.core.pgoutput.decoder import MessageType, PgOutputDecodeError, PgOutputDecoder
from cdc_worker.core.pgoutput.insert_reader import INSERT_TUPLE_READING
from cdc_worker.core.pgtypes.oids import VARHDRSZ, PgType

OID = 16_384
POSTGRES_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
NUMERIC_12_2 = ((12 << 16) | 2) + VARHDRSZ
TEXT_ARRAY = 1009
# name, type OID, typmod: one column per kind of reader and writer code (raw string, decoded text
# with a converter, text without a converter that is not a string, nested arrays).
COLUMNS = (
    ("id", PgType.INT8, -1),
    ("qty", PgType.INT4, -1),
    ("name", PgType.TEXT, -1),
    ("email", PgType.VARCHAR, 200 + VARHDRSZ),
    ("amount", PgType.NUMERIC, NUMERIC_12_2),
    ("exact", PgType.NUMERIC, -1),
    ("created_at", PgType.TIMESTAMPTZ, -1),
    ("day", PgType.DATE, -1),
    ("payload", PgType.JSONB, -1),
    ("active", PgType.BOOL, -1),
    ("ref", PgType.UUID, -1),
    ("photo", PgType.BYTEA, -1),
    ("ratio", PgType.FLOAT8, -1),
    ("tags", TEXT_ARRAY, -1),
)
KEYS: dict[str, Callable[[TableSchema], tuple[str, ...]]] = {
    "id": lambda table: ("id",),
    "name,id": lambda table: ("name", "id"),
    "unkeyed": lambda table: (),
}


def cstring(text: str) -> bytes:
    return text.encode() + b"\x00"


def column(value: str | bytes | None) -> bytes:
    if value is None:
        return b"n"
    raw = value.encode() if isinstance(value, str) else value
    return b"t" + struct.pack(">I", len(raw)) + raw


def relation(columns: tuple[tuple[str, int, int], ...] = COLUMNS) -> bytes:
    body = b"".join(
        bytes([name == "id"]) + cstring(name) + struct.pack(">Ii", oid, mod)  # id: the replica identity
        for name, oid, mod in columns
    )
    return (
        bytes([MessageType.RELATION]) + struct.pack(">I", OID) + cstring("public") + cstring("orders")
        + b"d" + struct.pack(">H", len(columns)) + body
    )  # fmt: skip


def insert(values: Iterable[str | bytes | None], count: int | None = None, oid: int = OID) -> bytes:
    columns = [column(v) for v in values]
    header = bytes([MessageType.INSERT]) + struct.pack(">I", oid) + b"N"
    return header + struct.pack(">H", len(columns) if count is None else count) + b"".join(columns)


def begin(xid: int, lsn: int) -> bytes:
    micros = (datetime(2024, 5, 1, 12, tzinfo=UTC) - POSTGRES_EPOCH) // timedelta(microseconds=1) + xid
    return bytes([MessageType.BEGIN]) + struct.pack(">QqI", lsn, micros, xid)


def commit(lsn: int) -> bytes:
    micros = (datetime(2024, 5, 1, 12, tzinfo=UTC) - POSTGRES_EPOCH) // timedelta(microseconds=1)
    return bytes([MessageType.COMMIT]) + struct.pack(">BQQq", 0, lsn, lsn + 40, micros)


def delete(key_value: str) -> bytes:
    old = [key_value] + [None] * (len(COLUMNS) - 1)
    return (
        bytes([MessageType.DELETE])
        + struct.pack(">I", OID)
        + b"K"
        + struct.pack(">H", len(old))
        + b"".join(column(v) for v in old)
    )


def serializer(kind: str) -> AvroEventSerializer | JsonEventSerializer:
    if kind == "json":
        return JsonEventSerializer({})
    # A fresh in-memory registry each: both pipelines register in the same order, so ids match.
    return AvroEventSerializer(SchemaRegistryClient.new_client({"url": f"mock://{uuid.uuid4().hex}"}), {})


Published = list[EncodedMessage | TransactionCommitted | str]


def general(payloads: list[bytes], kind: str, keys: str) -> Published:
    decoder, assembler, serialize = PgOutputDecoder(), ChangeAssembler(KEYS[keys]), serializer(kind)
    return [out for payload in payloads for out in _general_step(decoder, assembler, serialize, payload)]


def fused(payloads: list[bytes], kind: str, keys: str) -> tuple[Published, int]:
    """The stream loop with the fused path first; also how many messages it took."""
    decoder, assembler, serialize = PgOutputDecoder(), ChangeAssembler(KEYS[keys]), serializer(kind)
    fast = FastInsertPath(decoder, assembler, serialize)
    published: Published = []
    taken = 0
    for payload in payloads:
        result = fast(payload)
        if result is not None:
            message, table = result
            assert table is assembler.schema(OID)
            published.append(message)
            taken += 1
        else:
            published += _general_step(decoder, assembler, serialize, payload)
    return published, taken


def _general_step(
    decoder: PgOutputDecoder,
    assembler: ChangeAssembler,
    serialize: AvroEventSerializer | JsonEventSerializer,
    payload: bytes,
) -> Published:
    try:
        events = list(assembler.feed(decoder.decode(payload)))
    except PgOutputDecodeError as exc:
        return [f"decode error: {exc}"]
    out: Published = []
    for event in events:
        if isinstance(event, ChangeEvent):
            try:
                message = serialize(event)
            except Exception as exc:  # the stream loop's policy applies to any of them
                out.append(f"data error: {type(exc).__name__}: {exc}")
                continue
            if message is not None:
                out.append(message)
        elif isinstance(event, TransactionCommitted):
            out.append(event)
    return out


def assert_same(payloads: list[bytes], kind: str, keys: str) -> int:
    expected = general(payloads, kind, keys)
    got, taken = fused(payloads, kind, keys)
    assert got == expected
    return taken


# -- values Postgres's output functions write ---------------------------------------------------

texts = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=40)
timestamps = st.datetimes(datetime(1, 1, 1), datetime(9999, 12, 31)).map(
    lambda moment: (
        moment.isoformat(sep=" ").rstrip("0").rstrip(".") + "+00"
        if moment.microsecond
        else moment.isoformat(sep=" ") + "+00"
    )
)


def _cents(n: int) -> str:
    return f"{'-' if n < 0 else ''}{abs(n) // 100}.{abs(n) % 100:02d}"


def _json_object(d: dict[str, int]) -> str:
    return str(d).replace("'", '"')


def _text_array(items: list[str]) -> str:
    return "{" + ",".join(items) + "}"


SPECIAL_TIMESTAMPS = ["infinity", "-infinity", "0044-03-15 10:00:00+00 BC"]
SPECIAL_FLOATS = ["NaN", "Infinity", "-Infinity"]
COLUMN_VALUES: dict[str, st.SearchStrategy[str]] = {
    "id": st.integers(-(2**63), 2**63 - 1).map(str),
    "qty": st.integers(-(2**31), 2**31 - 1).map(str),
    "name": texts,
    "email": st.emails(),
    "amount": st.integers(-(10**12) + 1, 10**12 - 1).map(_cents),
    "exact": st.decimals(allow_nan=False, allow_infinity=False).map(str),
    "created_at": st.one_of(timestamps, st.sampled_from(SPECIAL_TIMESTAMPS)),
    "day": st.dates(date(1, 1, 1), date(9999, 12, 31)).map(str),
    "payload": st.dictionaries(st.text(max_size=5), st.integers(), max_size=3).map(_json_object),
    "active": st.sampled_from(["t", "f"]),
    "ref": st.uuids().map(str),
    "photo": st.binary(max_size=8).map(lambda b: "\\x" + b.hex()),
    "ratio": st.one_of(st.floats(allow_nan=False).map(repr), st.sampled_from(SPECIAL_FLOATS)),
    "tags": st.lists(st.from_regex(r"[a-z]{1,5}", fullmatch=True), max_size=3).map(_text_array),
}


@st.composite
def rows(draw: st.DrawFn) -> list[str | None]:
    row: list[str | None] = []
    for name, _, _ in COLUMNS:
        nullable = name not in ("id", "name")  # key columns: a NULL key is a data error, tested apart
        row.append(None if nullable and draw(st.booleans()) else draw(COLUMN_VALUES[name]))
    return row


@pytest.mark.parametrize("kind", ["avro", "json"])
@pytest.mark.parametrize("keys", list(KEYS))
@settings(max_examples=25, deadline=None)
@given(transactions=st.lists(st.lists(rows(), min_size=1, max_size=4), min_size=1, max_size=3))
def test_fused_inserts_are_the_general_paths_messages(
    kind: str, keys: str, transactions: list[list[list[str | None]]]
) -> None:
    payloads = [relation()]
    for xid, transaction in enumerate(transactions, start=700):
        payloads.append(begin(xid, 1000 * xid))
        payloads += [insert(row) for row in transaction]
        payloads.append(commit(1000 * xid))
    assert assert_same(payloads, kind, keys) == sum(len(t) for t in transactions)


@pytest.mark.parametrize("kind", ["avro", "json"])
def test_seq_runs_on_across_fused_and_general_events(kind: str) -> None:
    row = ["1", "2", "Zoë 🚀", "z@example.com", "-12.50", "-0.000001", "2024-01-02 03:04:05.123456+00",
           "2024-01-02", '{"a": 1}', "t", str(uuid.UUID(int=7)), "\\x00ff", "1.5", "{a,b}"]  # fmt: skip
    toasted = _with_raw_column(row, 9, b"u")
    payloads = [
        relation(), begin(700, 7000),
        insert(row), delete("1"), insert(row), toasted, insert(row),
        relation(COLUMNS[:3]), insert(row[:3]),  # a new relation version mid-transaction
        commit(7000),
    ]  # fmt: skip
    assert assert_same(payloads, kind, "id") == 4


def _with_raw_column(values: list[Any], index: int, raw: bytes) -> bytes:
    """An Insert whose column `index` is the raw `raw` (kind byte included) instead of text."""
    columns = [column(v) for v in values]
    columns[index] = raw
    header = bytes([MessageType.INSERT]) + struct.pack(">I", OID) + b"N" + struct.pack(">H", len(columns))
    return header + b"".join(columns)


ROW = ["1", "2", "name", "e@example.com", "1.00", "1e-7", "2024-01-02 03:04:05+00", "2024-01-02", "{}", "f",
       str(uuid.UUID(int=1)), "\\x00", "0.5", "{}"]  # fmt: skip
DECLINED = {
    "unchanged TOAST": _with_raw_column(ROW, 9, b"u"),
    "binary column": _with_raw_column(ROW, 2, b"b" + struct.pack(">I", 1) + b"x"),
    "unknown column kind": _with_raw_column(ROW, 2, b"?"),
    "too few columns for its count": insert(ROW, count=len(COLUMNS) + 1),
    "more columns than its count": insert(ROW, count=len(COLUMNS) - 1),
    "truncated": insert(ROW)[:-3],
    "trailing byte": insert(ROW) + b"\x00",
    "length past the end": insert(ROW)[:-2] + b"t\x7f\xff\xff\xff",
    "invalid UTF-8 in a raw string column": _with_raw_column(ROW, 2, column(b"\xc3\x28")),
    "invalid UTF-8 in a converted column": _with_raw_column(ROW, 4, column(b"\xff1")),
    "unknown relation": insert(ROW, oid=OID + 1),
    "old tuple kind": insert(ROW).replace(b"N", b"K", 1),
    "NULL key": insert([None, *ROW[1:]]),
    "unrepresentable decimal": insert([*ROW[:4], "12345678901.00", *ROW[5:]]),
    "unreadable timestamp": insert([*ROW[:6], "yesterday", *ROW[7:]]),
    "unreadable date": insert([*ROW[:7], "2024-13-45", *ROW[8:]]),
}  # fmt: skip


JSON_PUBLISHES_AS_IS = {"unrepresentable decimal", "unreadable date"}


@pytest.mark.parametrize("kind", ["avro", "json"])
@pytest.mark.parametrize("case", list(DECLINED))
def test_declined_inserts_change_nothing_and_fail_as_before(kind: str, case: str) -> None:
    payloads = [relation(), begin(700, 7000), insert(ROW), DECLINED[case], insert(ROW), commit(7000)]
    try:
        expected: Published | Exception = general(payloads, kind, "id")
    except Exception as exc:  # e.g. the assembler's errors: the fused path must raise them too
        expected = exc
    try:
        got: Published | Exception
        got, taken = fused(payloads, kind, "id")
    except Exception as exc:
        got, taken = exc, 0
    if isinstance(expected, Exception):
        assert type(got) is type(expected) and str(got) == str(expected)
    else:
        assert got == expected
        # The two good Inserts around it; the declined one went the general way. JSON publishes
        # numeric and 10-character date text as they are, so it has nothing to decline there.
        assert taken == (3 if kind == "json" and case in JSON_PUBLISHES_AS_IS else 2)


def test_outside_a_transaction_and_inside_a_stream_the_fused_path_declines() -> None:
    decoder, assembler = PgOutputDecoder(2), ChangeAssembler(replica_identity_key_columns)
    fast = FastInsertPath(decoder, assembler, serializer("json"))
    assembler.feed(decoder.decode(relation()))
    assert fast(insert(ROW)) is None  # no Begin yet
    stream_start = bytes([MessageType.STREAM_START]) + struct.pack(">IB", 900, 1)
    assembler.feed(decoder.decode(stream_start))
    assert decoder.in_stream and fast(insert(ROW)) is None
    assert fast(b"") is None and fast(b"I") is None


def test_a_cleared_serializer_cache_is_not_outlived_by_the_fused_paths() -> None:
    decoder, assembler, serialize = PgOutputDecoder(), ChangeAssembler(KEYS["id"]), serializer("json")
    fast = FastInsertPath(decoder, assembler, serialize)
    for payload in (relation(), begin(700, 7000)):
        assembler.feed(decoder.decode(payload))
    first = fast(insert(ROW))
    assert first is not None
    compiled = serialize.insert_encoder(assembler.schema(OID), INSERT_TUPLE_READING)[1]
    serialize.clear_cache()
    second = fast(insert(ROW))
    assert second is not None and second[0].value == first[0].value
    assert serialize.insert_encoder(assembler.schema(OID), INSERT_TUPLE_READING)[1] is not compiled
    assert (
        fast._targets[OID].encode is serialize.insert_encoder(assembler.schema(OID), INSERT_TUPLE_READING)[1]
    )


def test_a_bytearray_or_memoryview_payload_is_read_as_its_bytes() -> None:
    decoder, assembler, serialize = PgOutputDecoder(), ChangeAssembler(KEYS["id"]), serializer("avro")
    fast = FastInsertPath(decoder, assembler, serialize)
    for payload in (relation(), begin(700, 7000)):
        assembler.feed(decoder.decode(payload))
    as_bytes = fast(insert(ROW))
    as_bytearray = fast(bytearray(insert(ROW)))
    as_memoryview = fast(memoryview(insert(ROW)))
    assert as_bytes is not None and as_bytearray is not None and as_memoryview is not None
    assert as_bytes[0].value == as_bytearray[0].value == as_memoryview[0].value
    assert [m[0].headers[2] for m in (as_bytes, as_bytearray, as_memoryview)] == [
        ("bw.seq", b"0"),
        ("bw.seq", b"1"),
        ("bw.seq", b"2"),
    ]
