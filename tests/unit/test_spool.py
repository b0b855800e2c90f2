"""The streamed-transaction spool: memory then files, marks, cleanup; and streamed transactions
encoded as they arrive publish, at their commit, exactly the messages the general path publishes
for the same protocol 2 session (the Python and the native codec, memory and files)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import pytest

from cdc_worker.core.changes.assembler import (
    AssembledEvent,
    ChangeAssembler,
    OpenTransaction,
    replica_identity_key_columns,
)
from cdc_worker.core.changes.spool import (
    FILE_PREFIX,
    PER_RECORD_OVERHEAD,
    Spool,
    SpoolChunk,
    chunk_records,
    file_owner,
)
from cdc_worker.core.changes.spooled_streams import SpooledStreams
from cdc_worker.core.changes.stream_encoding import RefusedChange, ReplayedChange, StreamEncoder, replay
from cdc_worker.core.changes.streamed import ChangeAssemblyError
from cdc_worker.core.encoding.json_serializer import JsonEventSerializer
from cdc_worker.core.encoding.native import codec_description
from cdc_worker.core.encoding.serializers import EncodedMessage
from cdc_worker.core.errors import DataError
from cdc_worker.core.model import ChangeEvent
from cdc_worker.core.pgoutput.decoder import PgOutputDecoder, PgOutputMessage
from cdc_worker.shell.stream.spooling import check_spool_dir
from tests.unit.test_pgoutput import INSERT, RELATION, TS_US, cstr, i32, text, u8, u16, u32, u64


def payloads(count: int, size: int = 100) -> list[bytes]:
    return [bytes([i % 256]) * size for i in range(count)]


def test_spool_overflows_to_a_file_in_order_and_removes_it(tmp_path: Path) -> None:
    spool = Spool(memory_limit=3 * (100 + PER_RECORD_OVERHEAD), directory=tmp_path)
    txn = spool.transaction(900)
    data = payloads(10)
    for payload in data:
        txn.append(payload)
    assert spool.memory_used == 3 * (100 + PER_RECORD_OVERHEAD)
    assert txn.path is not None and txn.path.exists() and txn.path.name.startswith(FILE_PREFIX)
    assert list(txn) == data
    assert spool.memory_used == 0
    txn.close()
    assert list(tmp_path.iterdir()) == []


def test_a_later_payload_never_goes_to_memory_once_the_file_is_used(tmp_path: Path) -> None:
    spool = Spool(memory_limit=150 + PER_RECORD_OVERHEAD, directory=tmp_path)
    txn = spool.transaction(1)
    txn.append(b"a" * 100)
    txn.append(b"b" * 100)  # over the budget: to the file
    txn.append(b"c")  # would fit, but must stay after b
    assert list(txn) == [b"a" * 100, b"b" * 100, b"c"]
    txn.close()


def test_truncate_to_marks_in_memory_and_in_the_file(tmp_path: Path) -> None:
    spool = Spool(memory_limit=2 * (100 + PER_RECORD_OVERHEAD), directory=tmp_path)
    txn = spool.transaction(7)
    data = payloads(6)
    txn.append(data[0])
    in_memory = txn.mark()
    txn.append(data[1])
    txn.append(data[2])
    in_file = txn.mark()
    for payload in data[3:]:
        txn.append(payload)
    assert list(txn.since(in_file)) == data[3:]
    txn.truncate(in_file)
    assert list(txn.since(in_memory)) == data[1:3]
    txn.truncate(in_memory)
    assert txn.path is None and list(tmp_path.iterdir()) == []  # nothing left in the file: removed
    assert spool.memory_used == 100 + PER_RECORD_OVERHEAD
    txn.append(b"z")
    assert list(txn) == [data[0], b"z"]
    txn.close()
    assert spool.memory_used == 0


def test_budget_is_shared_and_clean_removes_leftovers(tmp_path: Path) -> None:
    (tmp_path / f"{FILE_PREFIX}55-x").write_bytes(b"stale")
    (tmp_path / "other").write_bytes(b"kept")
    spool = Spool(memory_limit=100 + PER_RECORD_OVERHEAD, directory=tmp_path)
    assert spool.clean() == 1
    first, second = spool.transaction(1), spool.transaction(2)
    first.append(b"x" * 100)
    second.append(b"y" * 100)
    assert first.path is None and second.path is not None
    first.close()
    second.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other"]


def test_clean_keeps_the_files_of_another_live_worker(tmp_path: Path) -> None:
    # The default spool directory is shared by every worker on the machine.
    running, dead = 4242, 4343
    (tmp_path / f"{FILE_PREFIX}{running}-7-abc").write_bytes(b"in flight")
    (tmp_path / f"{FILE_PREFIX}{dead}-8-def").write_bytes(b"left by a killed worker")
    (tmp_path / f"{FILE_PREFIX}{os.getpid()}-9-ghi").write_bytes(b"an earlier process with our pid")
    spool = Spool(memory_limit=0, directory=tmp_path)
    assert spool.clean(alive=lambda pid: pid == running) == 2
    assert [p.name for p in tmp_path.iterdir()] == [f"{FILE_PREFIX}{running}-7-abc"]


def test_spool_files_carry_their_owner(tmp_path: Path) -> None:
    spool = Spool(memory_limit=0, directory=tmp_path)
    txn = spool.transaction(12)
    txn.append(b"x")
    assert txn.path is not None and file_owner(txn.path.name) == os.getpid()
    assert file_owner(f"{FILE_PREFIX}55-x") is None
    txn.close()


# -- protocol 2 sessions, as bytes ---------------------------------------------------------------


def start(xid: int, first: bool) -> bytes:
    return b"S" + u32(xid) + u8(1 if first else 0)


def relation(xid: int) -> bytes:
    return b"R" + u32(xid) + RELATION[1:]


def insert(xid: int, key: int) -> bytes:
    return b"I" + u32(xid) + u32(16384) + b"N" + u16(3) + text(str(key)) + text("n") + b"n"


def commit(xid: int, lsn: int) -> bytes:
    return b"c" + u32(xid) + u8(0) + u64(lsn) + u64(lsn + 8) + u64(TS_US)


def abort(xid: int, subxid: int) -> bytes:
    return b"A" + u32(xid) + u32(subxid)


STOP = b"E"
BEGIN_LSN = 0x500
PLAIN = [
    b"B" + u64(BEGIN_LSN) + u64(TS_US) + u32(950),
    RELATION,
    INSERT,
    b"C" + u8(0) + u64(BEGIN_LSN) + u64(BEGIN_LSN + 8) + u64(TS_US),
]
SESSION = [
    start(900, True),
    relation(900),
    *[insert(900, k) for k in range(1, 6)],
    STOP,
    start(901, True),
    relation(901),
    insert(901, 100),
    STOP,
    start(900, False),
    insert(910, 6),  # subtransaction 910 of 900: aborted below
    relation(911),  # the Relation sent inside a subxact that aborts is kept
    insert(911, 7),
    STOP,
    abort(900, 910),
    start(900, False),
    insert(920, 8),  # subtransaction 920: kept
    insert(900, 9),
    STOP,
    start(902, True),
    relation(902),
    insert(902, 200),
    STOP,
    abort(902, 902),
    *PLAIN,
    commit(901, 0x300),  # committed before 900, which started first
    commit(900, 0x400),
]


def relation_v2(xid: int) -> bytes:
    """The table after `ADD COLUMN age int4`, inside the stream of `xid`."""
    return b"R" + u32(xid) + RELATION[1:].replace(u16(3), u16(4), 1) + u8(0) + cstr("age") + u32(23) + i32(-1)


def insert_v2(xid: int, key: int) -> bytes:
    return b"I" + u32(xid) + u32(16384) + b"N" + u16(4) + text(str(key)) + text("n") + b"n" + text("42")


def update(xid: int, key: int, name: str) -> bytes:
    return b"U" + u32(xid) + u32(16384) + b"N" + u16(3) + text(str(key)) + text(name) + b"n"


def delete(xid: int, key: int, width: int = 3) -> bytes:
    return b"D" + u32(xid) + u32(16384) + b"K" + u16(width) + text(str(key)) + b"n" * (width - 1)


def truncate(xid: int) -> bytes:
    return b"T" + u32(xid) + u32(1) + u8(0) + u32(16384)


SCHEMA_CHANGE = [
    start(930, True),
    relation(930),
    *[insert(930, k) for k in range(1, 4)],
    STOP,
    *PLAIN,  # another transaction commits while 930 is open, under the old schema
    start(930, False),
    update(930, 2, "renamed"),
    relation_v2(930),  # ALTER TABLE inside the streamed transaction
    insert_v2(930, 4),
    delete(930, 1, width=4),
    truncate(930),
    insert_v2(930, 5),
    STOP,
    commit(930, 0x600),
    *PLAIN,
]

Published = list[EncodedMessage | AssembledEvent | Exception]
# A commit's bulk path for `spooled`: (chunks, transaction, encoder, topic_of, serializer, published)
# -> the items left to the caller, the messages it produces appended to `published` in their place.
Bulk = Callable[
    [
        Iterator[SpoolChunk],
        OpenTransaction,
        StreamEncoder,
        Callable[[int], str],
        JsonEventSerializer,
        Published,
    ],
    Iterator[ReplayedChange | RefusedChange | PgOutputMessage],
]


def general(events: Iterable[AssembledEvent], serializer: JsonEventSerializer) -> Published:
    """What the session publishes for assembled events: change messages, and the rest as they are."""
    out: Published = []
    for event in events:
        if type(event) is ChangeEvent:
            message = serializer(event)
            if message is not None:
                out.append(message)
        else:
            out.append(event)
    return out


def reference(session: list[bytes]) -> Published:
    decoder, assembler, serializer = PgOutputDecoder(2), ChangeAssembler(), JsonEventSerializer({})
    return [m for payload in session for m in general(assembler.feed(decoder.decode(payload)), serializer)]


def encoders(
    serializer: JsonEventSerializer, *, native: bool, keep_keys: bool
) -> Callable[[int], StreamEncoder]:
    """`SpooledStreams`' `encoder_for`: each streamed transaction's encoder, keys by replica identity."""

    def encoder_for(xid: int) -> StreamEncoder:
        return StreamEncoder(
            xid,
            key_columns_for=replica_identity_key_columns,
            serializer=serializer,
            prepare_relation=lambda _relation: None,
            native=native,
            keep_keys=keep_keys,
        )

    return encoder_for


def spooled(
    session: list[bytes],
    spool: Spool,
    *,
    native: bool = False,
    keep_keys: bool = False,
    serializer: JsonEventSerializer | None = None,
    replayed: list[ReplayedChange] | None = None,
    bulk: Bulk | None = None,
) -> Published:
    """What the session publishes for `session` with a spool: at each commit the records replayed
    one by one (the reference), or with `bulk` (`bulk_commit`) those the native producer takes in
    bulk, the messages it would produce in their place."""
    decoder, assembler = PgOutputDecoder(2), ChangeAssembler()
    serializer = serializer or JsonEventSerializer({})
    streams = SpooledStreams(spool, encoders(serializer, native=native, keep_keys=keep_keys))
    out: Published = []
    for payload in session:
        if streams.take(payload):
            continue
        ended = streams.commit(payload)
        if ended is None:
            out += general(assembler.feed(decoder.decode(payload)), serializer)
            continue
        commit_message, chunks, encoder, *_ = ended
        txn = assembler.begin_spooled(commit_message)
        topic_of = lambda oid: serializer.topic_for(assembler.schema(oid))  # noqa: E731
        if bulk is None:
            items = replay(chunk_records(chunks), txn, encoder, topic_of)
        else:
            items = bulk(chunks, txn, encoder, topic_of, serializer, out)
        for item in items:
            if isinstance(item, ReplayedChange):
                out.append(item.message)
                if replayed is not None:
                    replayed.append(item)
            elif isinstance(item, RefusedChange):
                out.append(item.error)
            else:
                out += general(assembler.replay_spooled(item, txn), serializer)
        out.append(assembler.end_spooled(txn, commit_message))
    assert not streams.pending
    return out


def keys(published: Published) -> list[bytes | None]:
    return [m.key if isinstance(m, EncodedMessage) else None for m in published]


NATIVE = [False, True] if codec_description().startswith("native") else [False]


@pytest.mark.parametrize("native", NATIVE, ids=lambda n: "native" if n else "python")
@pytest.mark.parametrize("memory_limit", [0, 300, 1 << 20], ids=["files", "both", "memory"])
def test_encoded_spool_publishes_what_the_general_path_does(
    tmp_path: Path, memory_limit: int, native: bool
) -> None:
    spool = Spool(memory_limit, tmp_path)
    expected = reference(SESSION)
    assert spooled(SESSION, spool, native=native) == expected
    # 902 aborted; 910 and its Relation's sibling 911 rolled back; 901 committed before 900.
    assert keys(expected) == [
        b'{"id":1}',
        None,
        b'{"id":100}',
        None,
        *[b'{"id":%d}' % k for k in (1, 2, 3, 4, 5, 8, 9)],
        None,
    ]
    if memory_limit < 1 << 20:
        assert spool.files_created > 0
    assert spool.memory_used == 0 and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("native", NATIVE, ids=lambda n: "native" if n else "python")
def test_a_schema_change_inside_a_streamed_transaction(tmp_path: Path, native: bool) -> None:
    expected = reference(SCHEMA_CHANGE)
    assert spooled(SCHEMA_CHANGE, Spool(200, tmp_path), native=native) == expected
    values = [m.value for m in expected if isinstance(m, EncodedMessage)]
    assert b'"age":42' in (values[-2] or b"")  # the insert after the ALTER has the new column
    assert b'"age"' not in (values[-1] or b"")  # the next transaction, with its own Relation
    assert list(tmp_path.iterdir()) == []


def test_a_subtransaction_abort_discards_its_records_and_keeps_its_relation(tmp_path: Path) -> None:
    session = [
        start(940, True),
        relation(941),  # the table first described inside subxact 941
        insert(941, 1),
        STOP,
        b"A" + u32(940) + u32(941),
        start(940, False),
        insert(940, 2),  # relies on the Relation sent inside the aborted subtransaction
        STOP,
        commit(940, 0x700),
    ]
    published = spooled(session, Spool(0, tmp_path))
    assert keys(published) == [b'{"id":2}', None]
    assert [h for h in published[0].headers if h[0] == "bw.seq"] == [("bw.seq", b"0")]  # type: ignore[union-attr]


def test_an_aborted_transaction_publishes_nothing_and_frees_its_spool(tmp_path: Path) -> None:
    spool = Spool(300, tmp_path)
    session = [start(950, True), relation(950), *[insert(950, k) for k in range(20)], STOP, abort(950, 950)]
    assert spooled(session, spool) == []
    assert spool.files_created == 1 and spool.memory_used == 0 and list(tmp_path.iterdir()) == []


def test_a_first_segment_again_starts_the_transaction_over(tmp_path: Path) -> None:
    session = [start(900, True), relation(900), insert(900, 1), STOP]
    again = [start(900, True), relation(900), insert(900, 2), STOP, commit(900, 0x400)]
    assert keys(spooled(session + again, Spool(0, tmp_path))) == [b'{"id":2}', None]


def test_a_later_segment_of_an_unknown_transaction_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ChangeAssemblyError, match="never started"):
        SpooledStreams(Spool(0, tmp_path), lambda _xid: pytest.fail("no encoder")).take(start(900, False))


def test_a_spool_dir_that_cannot_be_written_is_refused_at_start_up(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_bytes(b"")
    (problem,) = check_spool_dir(stream_in_progress=True, directory=str(tmp_path / "a-file" / "spool"))
    assert problem.startswith(f"--spool-dir {tmp_path}/a-file/spool: cannot create or write files there")
    assert "--no-stream-in-progress" in problem and "\n" not in problem
    assert check_spool_dir(stream_in_progress=False, directory=str(tmp_path / "a-file" / "spool")) == []
    assert check_spool_dir(stream_in_progress=True, directory=str(tmp_path / "new" / "spool")) == []
    assert list((tmp_path / "new" / "spool").iterdir()) == []  # the check leaves nothing behind


def test_while_a_re_snapshot_runs_the_key_text_is_spooled(tmp_path: Path) -> None:
    replayed: list[ReplayedChange] = []
    session = [start(970, True), relation(970), insert(970, 7), delete(970, 7), STOP, commit(970, 0x900)]
    published = spooled(session, Spool(0, tmp_path), keep_keys=True, replayed=replayed)
    assert published == reference(session)
    assert [(r.op, r.key_text) for r in replayed] == [("c", ("7",)), ("d", ("7",))]


class RefusingSerializer(JsonEventSerializer):
    """A fake: refuses the change keyed 13, as the Avro writer refuses a value it cannot write."""

    def __call__(self, event: ChangeEvent) -> EncodedMessage | None:
        if event.key == ("13",):
            raise ValueError("cannot write id 13")
        return super().__call__(event)


def test_a_refused_change_is_reported_at_the_commit_only(tmp_path: Path) -> None:
    chunk = [relation(980), insert(980, 12), insert(980, 13), insert(980, 14), STOP]
    committed = spooled(
        [start(980, True), *chunk, commit(980, 0xA00)], Spool(0, tmp_path), serializer=RefusingSerializer({})
    )
    assert keys(committed) == [b'{"id":12}', None, b'{"id":14}', None]
    refused = committed[1]
    assert isinstance(refused, DataError) and str(refused) == "cannot write id 13"
    assert [h for h in committed[2].headers if h[0] == "bw.seq"] == [("bw.seq", b"2")]  # type: ignore[union-attr]
    aborted = spooled(
        [start(981, True), *chunk, abort(981, 981)], Spool(0, tmp_path), serializer=RefusingSerializer({})
    )
    assert aborted == []


def test_a_change_that_cannot_be_assembled_fails_its_commit_not_its_abort(tmp_path: Path) -> None:
    unknown = [start(990, True), insert(990, 1), STOP]  # no Relation before it: messages were lost
    assert spooled([*unknown, abort(990, 990)], Spool(0, tmp_path)) == []
    with pytest.raises(ChangeAssemblyError, match="no Relation message"):
        spooled([*unknown, commit(990, 0xB00)], Spool(0, tmp_path))
