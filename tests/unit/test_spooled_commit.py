"""A committed streamed transaction published in bulk (`core.changes.spooled_commit` and the native
producer's `produce_spooled`, seen through its test face `spooled_messages`): the same messages,
byte for byte and in the same order, as the reference that replays each record in Python; and the
spool read back in bulk (`SpooledTransaction.drain`) in whole records."""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from cdc_worker.core.changes import spool as spool_module
from cdc_worker.core.changes.assembler import OpenTransaction
from cdc_worker.core.changes.early_records import KeptRelation, NeedsTopic, WaitForCommit, judge
from cdc_worker.core.changes.spool import PER_RECORD_OVERHEAD, Spool, SpoolChunk, chunk_records, record_at
from cdc_worker.core.changes.spool_records import SpooledEncodingError, change_record
from cdc_worker.core.changes.spooled_commit import Item, Target, commit_in_bulk
from cdc_worker.core.changes.spooled_streams import SpooledStreams
from cdc_worker.core.changes.stream_encoding import ReplayedChange, StreamEncoder
from cdc_worker.core.encoding.json_serializer import JsonEventSerializer
from cdc_worker.core.encoding.native_extension import EXTENSION
from cdc_worker.core.encoding.serializers import EncodedMessage
from kafka_contract.headers import HEADER_COMMIT_TS, HEADER_LSN, produced_before_commit, resolved_headers
from tests.unit import test_fast_insert as fast_insert
from tests.unit.test_fast_insert import COLUMNS, DECLINED, KEYS, ROW, insert, serializer
from tests.unit.test_native_changes import update
from tests.unit.test_spool import (
    NATIVE,
    PLAIN,
    SCHEMA_CHANGE,
    SESSION,
    STOP,
    Published,
    RefusingSerializer,
    commit,
    delete,
    encoders,
    payloads,
    reference,
    relation,
    spooled,
    start,
)
from tests.unit.test_spool import insert as spool_insert
from tests.unit.test_spool import update as spool_update

pytestmark = pytest.mark.native


def native_bulk(one_by_one: frozenset[int] = frozenset()) -> Callable[..., Iterator[Item]]:
    """The bulk path with the extension's `spooled_messages` as the producer; relations in
    `one_by_one` have no target (as the re-snapshot's chunk table)."""
    extension = EXTENSION
    if extension is None:
        pytest.skip("the native extension is not built")

    def bulk(  # noqa: PLR0917 - the shape `test_spool.spooled` calls
        chunks: Iterator[SpoolChunk],
        txn: OpenTransaction,
        encoder: StreamEncoder,
        topic_of: Callable[[int], str],
        serializer: JsonEventSerializer,
        out: Published,
    ) -> Iterator[Item]:
        (_, lsn), (_, xid), (_, commit_ts) = serializer.transaction_headers(
            txn.commit_lsn, txn.xid, txn.commit_ts
        )

        def produce(
            chunk: SpoolChunk, position: int, targets: dict[int, Target], first_seq: int
        ) -> tuple[int, int]:
            after, taken, messages = extension.spooled_messages(
                chunk, position, targets=targets, lsn=lsn, xid=xid, commit_ts=commit_ts, first_seq=first_seq
            )
            out.extend(
                EncodedMessage(topic, key, value, headers) for topic, key, value, headers, _ in messages
            )
            return after, taken

        def target_of(oid: int) -> Target | None:
            return None if oid in one_by_one else (topic_of(oid), 0)

        return commit_in_bulk(chunks, txn, encoder, bulk=produce, target_of=target_of, topic_of=topic_of)

    return bulk


@pytest.mark.parametrize("native", NATIVE, ids=lambda n: "native" if n else "python")
@pytest.mark.parametrize("memory_limit", [0, 300, 1 << 20], ids=["files", "both", "memory"])
@pytest.mark.parametrize("session", [SESSION, SCHEMA_CHANGE], ids=["interleaved", "schema-change"])
def test_the_bulk_commit_publishes_what_the_reference_does(
    tmp_path: Path, memory_limit: int, native: bool, session: list[bytes]
) -> None:
    expected = reference(session)
    spool = Spool(memory_limit, tmp_path)
    assert spooled(session, spool, native=native, bulk=native_bulk()) == expected
    assert spooled(session, Spool(memory_limit, tmp_path), native=native) == expected
    assert spool.memory_used == 0 and list(tmp_path.iterdir()) == []


def test_a_refused_change_and_a_relation_without_target_take_the_reference_path(tmp_path: Path) -> None:
    session = [
        start(980, True),
        relation(980),
        *[spool_insert(980, k) for k in (11, 12, 13, 14)],
        spool_update(980, 12, "renamed"),
        delete(980, 11),
        STOP,
        commit(980, 0xA00),
    ]
    expected = comparable(spooled(session, Spool(0, tmp_path), serializer=RefusingSerializer({})))
    assert any(isinstance(item, tuple) and item[0] is SpooledEncodingError for item in expected)
    for one_by_one in (frozenset(), frozenset({16384})):
        bulk = native_bulk(one_by_one)
        published = spooled(session, Spool(0, tmp_path), serializer=RefusingSerializer({}), bulk=bulk)
        assert comparable(published) == expected


def comparable(published: Published) -> list[object]:
    """Exceptions as their type and text (they compare by identity)."""
    return [(type(m), str(m)) if isinstance(m, Exception) else m for m in published]


def test_key_texts_for_the_re_snapshot_reach_the_caller(tmp_path: Path) -> None:
    """A change spooled with its key text (a re-snapshot ran) is the caller's, to observe its key."""
    session = [
        start(970, True),
        relation(970),
        spool_insert(970, 7),
        delete(970, 7),
        STOP,
        commit(970, 0x900),
    ]
    replayed: list[ReplayedChange] = []
    published = spooled(session, Spool(0, tmp_path), keep_keys=True, replayed=replayed, bulk=native_bulk())
    assert published == reference(session)
    assert [(r.op, r.key_text) for r in replayed] == [("c", ("7",)), ("d", ("7",))]


def test_drain_reads_memory_then_the_file_in_blocks_of_whole_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(spool_module, "FILE_BLOCK", 250)
    monkeypatch.setattr(spool_module, "MEMORY_PIECE", 1)
    spool = Spool(memory_limit=2 * (100 + PER_RECORD_OVERHEAD), directory=tmp_path)
    txn = spool.transaction(5)
    data = payloads(12)
    for payload in data[:8]:
        txn.append(payload)
    mark = txn.mark()
    txn.append(b"dropped")
    txn.truncate(mark)  # the block ends past the cut go with it
    for payload in data[8:]:
        txn.append(payload)
    chunks = list(txn.drain())
    assert spool.memory_used == 0
    assert chunks[:2] == [[data[0]], [data[1]]]  # the memory head a piece at a time
    assert all(type(c) is bytes and 250 <= len(c) <= 250 + 104 for c in chunks[2:-1])
    assert list(chunk_records(chunks)) == data
    assert record_at(chunks[2], 0) == (data[2], 104)
    txn.close()
    assert list(tmp_path.iterdir()) == []


def in_stream(payload: bytes, xid: int = 77) -> bytes:
    """A protocol 1 payload as it comes inside a streamed transaction: the xid after its type."""
    return payload[:1] + struct.pack(">I", xid) + payload[1:]


@pytest.mark.parametrize("kind", ["avro", "json"])
def test_a_run_spooled_in_one_call_gives_the_records_each_payload_gives(kind: str) -> None:
    """`StreamEncoder.encode_run` (the codec's `encode_spool_records`, records written in Rust)
    against `encode` one payload at a time (records written in Python): a key change, unchanged
    TOAST columns, FULL identity, a delete, and every payload the codec declines, in place."""
    one_by_one, in_runs = stream_encoder(kind), stream_encoder(kind)
    moved = ["2", *ROW[1:]]
    run = [
        insert(ROW),
        update(moved, old=["1", *[None] * (len(COLUMNS) - 1)]),
        update(moved, toast=9),
        update(moved, old=moved, old_kind=b"O", toast=9),
        *DECLINED.values(),
        fast_insert.delete("2"),
        insert(ROW),
    ]
    payloads = [in_stream(p) for p in run]
    expected = [record for payload in payloads for record in one_by_one.encode(payload)]
    assert any(b"active" in record for record in expected), "an unchanged column named"
    assert in_runs.encode_run(payloads) == expected


def stream_encoder(kind: str) -> StreamEncoder:
    """A streamed transaction's encoder (native codec) that has seen the table's Relation."""
    encoder = StreamEncoder(
        77,
        key_columns_for=KEYS["id"],
        serializer=serializer(kind),
        prepare_relation=lambda _relation: None,
        native=True,
        keep_keys=False,
    )
    assert encoder.encode(in_stream(fast_insert.relation())) != []
    return encoder


class SeenRecords:
    """A `StreamWatcher` that keeps what `SpooledStreams` tells it."""

    def __init__(self) -> None:
        self.encoders: dict[int, StreamEncoder] = {}
        self.records: dict[int, list[bytes]] = {}
        self.cut_xids: list[int] = []
        self.aborted_xids: list[int] = []

    def started(self, xid: int, encoder: StreamEncoder) -> None:
        self.encoders[xid] = encoder
        self.records[xid] = []

    def spooled(self, xid: int, records: list[bytes]) -> None:
        self.records[xid] += records

    def cut(self, xid: int) -> None:
        self.cut_xids.append(xid)

    def aborted(self, xid: int) -> None:
        self.aborted_xids.append(xid)


def watched(session: list[bytes], tmp_path: Path, *, native: bool = True) -> SeenRecords:
    """`session` (without its commits) through `SpooledStreams`, seen by a `SeenRecords`."""
    seen = SeenRecords()
    encoder_for = encoders(JsonEventSerializer({}), native=native, keep_keys=False)
    streams = SpooledStreams(Spool(0, tmp_path), encoder_for, seen)
    for payload in session:
        assert streams.take(payload), payload[:1]
    streams.close()
    return seen


def test_the_watcher_sees_each_transaction_start_its_records_a_subtransaction_cut_and_an_abort(
    tmp_path: Path,
) -> None:
    seen = watched([p for p in SESSION if p[:1] not in (b"c", b"B", b"C") and p not in PLAIN], tmp_path)
    assert sorted(seen.encoders) == [900, 901, 902]
    assert seen.cut_xids == [900] and seen.aborted_xids == [902]
    # Every record spooled is told, the rolled-back subtransaction's included (the cut says so).
    assert [len(seen.records[x]) for x in (900, 901, 902)] == [1 + 5 + 1 + 1 + 1 + 2, 2, 2]


@pytest.mark.parametrize("native", NATIVE, ids=lambda n: "native" if n else "python")
def test_changes_produced_before_their_commit_are_the_reference_without_the_commit_headers(
    tmp_path: Path, native: bool
) -> None:
    """What `shell.stream.early_streams` produces while a transaction runs (the records the watcher
    sees, through the native producer's test face with no `bw.lsn` nor `bw.commit_ts`, a Relation
    kept for the commit): the reference's messages byte for byte less those two headers, and
    `kafka_contract.headers.resolved_headers` with the commit's gives the reference's headers."""
    extension = EXTENSION
    if extension is None:
        pytest.skip("the native extension is not built")
    session = [
        start(980, True),
        relation(980),
        *[spool_insert(980, k) for k in (11, 12, 13)],
        STOP,
        start(980, False),
        spool_update(980, 12, "renamed"),
        delete(980, 11),
        STOP,
    ]
    seen = watched(session, tmp_path, native=native)
    records, encoder = seen.records[980], seen.encoders[980]
    produced: list[tuple[str, bytes | None, bytes | None, list[tuple[str, bytes]]]] = []
    position, seq, targets = 0, 0, {}
    while position < len(records):
        after, taken, messages = extension.spooled_messages(
            records, position, targets=targets, lsn=b"", xid=b"980", commit_ts=b"", first_seq=seq
        )
        produced += [(topic, key, value, headers) for topic, key, value, headers, _ in messages]
        position, seq = after, seq + taken
        if position < len(records):
            verdict = judge(records[position])
            if isinstance(verdict, KeptRelation):
                position += 1
            else:
                assert isinstance(verdict, NeedsTopic), verdict
                schema = encoder.assembler.schema(verdict.relation_oid)
                targets[verdict.relation_oid] = (encoder.serializer.topic_for(schema), 0)
    expected = [m for m in reference([*session, commit(980, 0xA00)]) if isinstance(m, EncodedMessage)]
    assert [(t, k, v) for t, k, v, _ in produced] == [(m.topic, m.key, m.value) for m in expected]
    lsn, stamp = dict(expected[0].headers)[HEADER_LSN], dict(expected[0].headers)[HEADER_COMMIT_TS]
    for (*_, headers), message in zip(produced, expected, strict=True):
        assert produced_before_commit(headers)
        assert headers == [h for h in message.headers if h[0] not in (HEADER_LSN, HEADER_COMMIT_TS)]
        assert resolved_headers(headers, int(lsn), stamp.decode()) == list(message.headers)


@pytest.mark.parametrize(
    ("record", "verdict"),
    [
        (b"M" + relation(5), KeptRelation()),
        (
            b"M" + b"T" + bytes(12),
            WaitForCommit("it holds a TRUNCATE, whose control event needs the commit's LSN"),
        ),
        (
            b"M" + b"M" + bytes(12),
            WaitForCommit("it holds a logical message (a DDL or a signal), handled at the commit"),
        ),
        (
            b"X" + bytes(10),
            WaitForCommit("a change could not be encoded (reported under --on-error at the commit)"),
        ),
        (b"F" + bytes(4), WaitForCommit("a message could not be assembled (raised at the commit)")),
    ],
    ids=["relation", "truncate", "logical-message", "refused", "fatal"],
)
def test_a_record_the_producer_stops_at_is_kept_or_waits_for_the_commit(
    record: bytes, verdict: object
) -> None:
    assert judge(record) == verdict


def test_a_change_without_a_topic_needs_one_and_one_with_key_texts_waits_for_the_commit() -> None:
    plain = change_record("c", 16384, b"k", b"v")
    assert judge(plain) == NeedsTopic(16384)
    assert judge(change_record("d", 16384, b"k", None, (), ("7",))) == WaitForCommit(
        "its changes carry key texts for a re-snapshot"
    )
