"""The native codec's stream path gives exactly the general path's messages, or declines.

The same pgoutput bytes go through the general pipeline (decode -> assemble -> serialize) and
through `NativeChangePath` first (falling back to the general path when it declines, as the stream
loop does); every message is compared byte for byte, `bw.seq` and `bw.unchanged` included.
"""

from __future__ import annotations

import os
import struct
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdc_worker.core.changes.assembler import ChangeAssembler, OpenTransaction
from cdc_worker.core.changes.native_changes import NativeChangePath
from cdc_worker.core.encoding import native
from cdc_worker.core.pgoutput.decoder import MessageType, PgOutputDecoder
from tests.unit.test_fast_insert import (
    COLUMNS,
    DECLINED,
    KEYS,
    OID,
    ROW,
    Published,
    _general_step,
    begin,
    column,
    commit,
    delete,
    general,
    insert,
    relation,
    rows,
    serializer,
)

if not native.NATIVE_AVAILABLE:
    reason = f"the native codec is not built: {native.codec_description()}"
    if os.environ.get("BW_REQUIRE_NATIVE") == "1":
        pytest.fail(reason + " (BW_REQUIRE_NATIVE=1)", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def update(
    new: list[Any], old: list[Any] | None = None, old_kind: bytes = b"K", toast: int | None = None
) -> bytes:
    """An Update; `toast`: that column of the new tuple is unchanged TOAST ('u')."""
    parts = [bytes([MessageType.UPDATE]), struct.pack(">I", OID)]
    if old is not None:
        parts += [old_kind, struct.pack(">H", len(old)), b"".join(column(v) for v in old)]
    new_columns = [column(v) for v in new]
    if toast is not None:
        new_columns[toast] = b"u"
    parts += [b"N", struct.pack(">H", len(new_columns)), b"".join(new_columns)]
    return b"".join(parts)


def delete_row(row: list[Any]) -> bytes:
    """A Delete carrying the whole old row (REPLICA IDENTITY FULL): it has every key."""
    old = b"".join(column(v) for v in row)
    return bytes([MessageType.DELETE]) + struct.pack(">I", OID) + b"O" + struct.pack(">H", len(row)) + old


def through_native(payloads: list[bytes], kind: str, keys: str) -> tuple[Published, int]:
    """The stream loop with the native path first; also how many messages it took."""
    decoder, assembler, serialize = PgOutputDecoder(), ChangeAssembler(KEYS[keys]), serializer(kind)
    path = NativeChangePath(decoder, assembler, serialize)
    published: Published = []
    taken = 0
    for payload in payloads:
        result = path(payload)
        if result is None:
            published += _general_step(decoder, assembler, serialize, payload)
            continue
        items, table = result
        assert table is assembler.schema(OID)
        taken += 1
        for message, _ in items:
            published.append(
                f"data error: {type(message).__name__}: {message}"
                if isinstance(message, Exception)
                else message
            )
    return published, taken


def assert_same(payloads: list[bytes], kind: str, keys: str) -> int:
    expected = general(payloads, kind, keys)
    got, taken = through_native(payloads, kind, keys)
    assert got == expected
    return taken


@pytest.mark.parametrize("kind", ["avro", "json"])
@pytest.mark.parametrize("keys", list(KEYS))
@settings(max_examples=20, deadline=None)
@given(transactions=st.lists(st.lists(rows(), min_size=1, max_size=4), min_size=1, max_size=3))
def test_native_row_changes_are_the_general_paths_messages(
    kind: str, keys: str, transactions: list[list[list[str | None]]]
) -> None:
    payloads = [relation()]
    changes = 0
    for xid, transaction in enumerate(transactions, start=700):
        payloads.append(begin(xid, 1000 * xid))
        for row in transaction:
            payloads += [insert(row), update(row), update(row, old=row, old_kind=b"O"), delete_row(row)]
            changes += 4
        payloads.append(commit(1000 * xid))
    assert assert_same(payloads, kind, keys) == changes


@pytest.mark.parametrize("kind", ["avro", "json"])
def test_key_changes_toast_and_seq_across_native_and_general_events(kind: str) -> None:
    moved = ["2", *ROW[1:]]
    payloads = [
        relation(), begin(700, 7000),
        insert(ROW),
        update(moved, old=["1", *[None] * (len(COLUMNS) - 1)]),  # a key change: tombstone, then the row
        update(moved, toast=9),  # an unchanged TOASTed column: null, named in bw.unchanged
        update(moved, old=moved, old_kind=b"O", toast=9),  # FULL identity: taken from the old row
        delete("2"),
        relation(COLUMNS[:3]), insert(ROW[:3]),  # a new relation version mid-transaction
        commit(7000),
    ]  # fmt: skip
    assert assert_same(payloads, kind, "id") == 6
    messages = [m for m in through_native(payloads, kind, "id")[0] if not isinstance(m, str | bytes)]
    headers = [dict(m.headers) for m in messages if hasattr(m, "headers")]
    assert [h["bw.seq"] for h in headers] == [str(i).encode() for i in range(len(headers))]
    assert headers[3]["bw.unchanged"] == b"active"


def assert_same_outcome(payloads: list[bytes], kind: str, publish: Callable[[], Published]) -> None:
    """`publish` gives what the general path publishes for `payloads`, or raises the same error
    (the assembler's errors: the native path and the runs must raise them too)."""
    try:
        expected: Published | Exception = general(payloads, kind, "id")
    except Exception as exc:
        expected = exc
    try:
        got: Published | Exception = publish()
    except Exception as exc:
        got = exc
    if isinstance(expected, Exception):
        assert type(got) is type(expected) and str(got) == str(expected)
    else:
        assert got == expected


@pytest.mark.parametrize("kind", ["avro", "json"])
@pytest.mark.parametrize("case", list(DECLINED))
def test_declined_or_refused_messages_fail_exactly_as_on_the_general_path(kind: str, case: str) -> None:
    payloads = [relation(), begin(700, 7000), insert(ROW), DECLINED[case], insert(ROW), commit(7000)]
    assert_same_outcome(payloads, kind, lambda: through_native(payloads, kind, "id")[0])


def test_outside_a_transaction_and_inside_a_stream_the_native_path_declines() -> None:
    decoder, assembler = PgOutputDecoder(2), ChangeAssembler(KEYS["id"])
    path = NativeChangePath(decoder, assembler, serializer("json"))
    assembler.feed(decoder.decode(relation()))
    assert path(insert(ROW)) is None  # no Begin yet
    stream_start = bytes([MessageType.STREAM_START]) + struct.pack(">IB", 900, 1)
    assembler.feed(decoder.decode(stream_start))
    assert decoder.in_stream and path(insert(ROW)) is None
    assert path(b"") is None and path(b"I") is None and path(begin(1, 1)) is None


def test_avro_values_carry_the_registered_schema_ids() -> None:
    payloads = [
        relation(),
        begin(700, 7000),
        insert([str(uuid.UUID(int=3).int % 1000), *ROW[1:]]),
        commit(7000),
    ]
    got, taken = through_native(payloads, "avro", "id")
    message = got[0]
    assert taken == 1 and not isinstance(message, str) and hasattr(message, "value")
    assert message.value[:1] == b"\x00" and message.key is not None and message.key[:1] == b"\x00"  # type: ignore[union-attr]


# -- runs: consecutive row changes of a relation encoded with one call (the stream's `handle`) ------


def through_runs(payloads: list[bytes], kind: str, keys: str, run_changes: int) -> Published:
    """The stream loop's run batching: consecutive row changes of one relation taken by
    `starts_run` are collected and encoded with one `encode_run` at the next message of another
    kind or relation, or every `run_changes`; a run the codec refuses goes one payload at a time."""
    decoder, assembler, serialize = PgOutputDecoder(), ChangeAssembler(KEYS[keys]), serializer(kind)
    path = NativeChangePath(decoder, assembler, serialize)
    published: Published = []
    run: list[bytes] = []

    def one(payload: bytes) -> None:
        result = path(payload)
        if result is None:
            published.extend(_general_step(decoder, assembler, serialize, payload))
        else:
            published.extend(_item(message) for message, _ in result[0])

    def flush() -> None:
        taken = run[:]
        run.clear()
        if not taken:
            return
        encoded = path.encode_run(taken)
        if encoded is None:
            for payload in taken:
                one(payload)
            return
        items, table, messages = encoded
        assert table is assembler.schema(OID)
        assert messages == sum(not isinstance(m, Exception) for m, _ in items)
        published.extend(_item(message) for message, _ in items)

    for payload in payloads:
        if run and payload[1:5] == run[0][1:5] and payload[0] in b"IUD":
            run.append(payload)
            if len(run) >= run_changes:
                flush()
            continue
        flush()
        if path.starts_run(payload):
            run.append(payload)
        else:
            one(payload)
    flush()
    return published


def _item(message: object) -> Any:
    return f"data error: {type(message).__name__}: {message}" if isinstance(message, Exception) else message


@pytest.mark.parametrize("kind", ["avro", "json"])
@pytest.mark.parametrize("keys", list(KEYS))
@settings(max_examples=15, deadline=None)
@given(
    transactions=st.lists(st.lists(rows(), min_size=1, max_size=4), min_size=1, max_size=3),
    run_changes=st.sampled_from([1, 2, 3, 5, 1000]),
)
def test_runs_flushed_anywhere_give_the_general_paths_messages(
    kind: str, keys: str, transactions: list[list[list[str | None]]], run_changes: int
) -> None:
    # "unkeyed": every delete inside a run takes its seq without publishing anything.
    payloads = [relation()]
    for xid, transaction in enumerate(transactions, start=700):
        payloads.append(begin(xid, 1000 * xid))
        for row in transaction:
            payloads += [insert(row), update(row), delete_row(row), update(row, old=row, old_kind=b"O")]
        payloads.append(commit(1000 * xid))
    assert through_runs(payloads, kind, keys, run_changes) == general(payloads, kind, keys)


@pytest.mark.parametrize("kind", ["avro", "json"])
def test_a_run_keeps_seq_across_an_unkeyed_delete_and_a_new_relation_version(kind: str) -> None:
    payloads = [
        relation(), begin(700, 7000),
        insert(ROW), delete_row(ROW), insert(ROW), update(ROW),
        relation(COLUMNS[:3]), insert(ROW[:3]), delete_row(ROW[:3]), insert(ROW[:3]),
        commit(7000),
    ]  # fmt: skip
    got = through_runs(payloads, kind, "unkeyed", 1000)
    assert got == general(payloads, kind, "unkeyed")
    headers = [dict(m.headers) for m in got if hasattr(m, "headers")]
    # The deletes publish nothing but take their number: 0, 2, 3, then 4, 6 after the new version.
    assert [h["bw.seq"] for h in headers] == [b"0", b"2", b"3", b"4", b"6"]


@pytest.mark.parametrize("kind", ["avro", "json"])
@pytest.mark.parametrize("case", list(DECLINED))
@pytest.mark.parametrize("run_changes", [2, 1000])
def test_errors_inside_a_run_come_at_their_place_or_fail_as_on_the_general_path(
    kind: str, case: str, run_changes: int
) -> None:
    payloads = [
        relation(), begin(700, 7000),
        insert(ROW), update(ROW), DECLINED[case], insert(ROW), delete_row(ROW),
        commit(7000),
    ]  # fmt: skip
    assert_same_outcome(payloads, kind, lambda: through_runs(payloads, kind, "id", run_changes))


def test_a_run_the_codec_refuses_changes_nothing() -> None:
    decoder, assembler = PgOutputDecoder(), ChangeAssembler(KEYS["id"])
    path = NativeChangePath(decoder, assembler, serializer("json"))
    for payload in (relation(), begin(700, 7000)):
        assembler.feed(decoder.decode(payload))
    assert path.starts_run(insert(ROW))
    target = assembler.insert_target(OID)
    assert target is not None
    txn = target[1]
    assert path.encode_run([insert(ROW), DECLINED["truncated"], insert(ROW)]) is None
    assert txn.next_seq == 0
    encoded = path.encode_run([insert(ROW), update(ROW)])
    assert encoded is not None and encoded[2] == 2 and txn.next_seq == 2


# -- runs produced from Rust (`produce_run`): the native producer's stream path -------------------


@pytest.fixture(scope="module")
def unreachable_producer() -> native.NativeProducer:
    """The real native producer with no broker behind it: it queues what it is handed (and would
    fail it after message.timeout.ms), which is all these tests need of it."""
    return native.build_native_producer({"bootstrap.servers": "127.0.0.1:9", "message.timeout.ms": "60000"})


def opened(kind: str, keys: str = "id") -> tuple[NativeChangePath, OpenTransaction]:
    decoder, assembler = PgOutputDecoder(), ChangeAssembler(KEYS[keys])
    path = NativeChangePath(decoder, assembler, serializer(kind))
    for payload in (relation(), begin(700, 7000)):
        assembler.feed(decoder.decode(payload))
    assert path.starts_run(insert(ROW))
    target = assembler.insert_target(OID)
    assert target is not None
    return path, target[1]


@pytest.mark.parametrize("kind", ["avro", "json"])
@pytest.mark.parametrize("case", list(DECLINED))
@pytest.mark.parametrize("stop_on_problem", [False, True], ids=["log", "exit"])
def test_a_run_produced_from_rust_takes_what_encode_run_takes(
    unreachable_producer: native.NativeProducer, kind: str, case: str, stop_on_problem: bool
) -> None:
    run = [insert(ROW), update(ROW), DECLINED[case], insert(ROW), delete_row(ROW)]
    reference_path, reference_txn = opened(kind)
    encoded = reference_path.encode_run(run)
    path, txn = opened(kind)
    produced = path.produce_run(run, unreachable_producer, lambda _table: 1, stop_on_problem=stop_on_problem)
    assert produced is not None
    done, table, topic = produced
    assert table.oid == OID and topic
    if encoded is None:
        # The reference raises on the declined payload: it and what follows are the general path's.
        assert (done.rest, done.events, done.messages, done.problems) == (2, 2, 2, [])
        assert txn.next_seq == 2
        return
    items, _, messages = encoded
    errors = [str(m) for m, _ in items if isinstance(m, Exception)]
    if errors and stop_on_problem:
        # Nothing after the first problem is handed to the producer.
        before = next(i for i, (m, _) in enumerate(items) if isinstance(m, Exception))
        assert done.messages == before and [str(p) for p in done.problems] == errors[:1]
        return
    assert (done.rest, done.messages, sum(done.ops.values())) == (len(run), messages, messages)
    assert [str(p) for p in done.problems] == errors
    assert txn.next_seq == reference_txn.next_seq == done.events


@pytest.mark.parametrize("kind", ["avro", "json"])
def test_a_run_produced_from_rust_numbers_an_unkeyed_delete_without_producing_it(
    unreachable_producer: native.NativeProducer, kind: str
) -> None:
    path, txn = opened(kind, "unkeyed")
    run = [insert(ROW), delete_row(ROW), update(ROW), insert(ROW)]
    produced = path.produce_run(run, unreachable_producer, lambda _table: 1, stop_on_problem=True)
    assert produced is not None
    done = produced[0]
    assert (done.events, done.messages, done.ops, done.problems) == (4, 3, {"c": 2, "u": 1}, [])
    assert txn.next_seq == 4 and done.size > 0
