"""The streamed-transaction spool: memory then files, marks, cleanup; and the spooled streams give
exactly the events the in-memory assembler gives for the same protocol 2 session."""

from __future__ import annotations

from pathlib import Path

import pytest

from cdc_worker.core.changes.assembler import AssembledEvent, ChangeAssembler
from cdc_worker.core.changes.spool import FILE_PREFIX, PER_RECORD_OVERHEAD, Spool
from cdc_worker.core.changes.spooled_streams import SpooledStreams
from cdc_worker.core.changes.streamed import ChangeAssemblyError
from cdc_worker.core.pgoutput.decoder import PgOutputDecoder
from tests.unit.test_pgoutput import INSERT, RELATION, TS_US, text, u8, u16, u32, u64


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


def reference(session: list[bytes]) -> list[AssembledEvent]:
    decoder, assembler = PgOutputDecoder(2), ChangeAssembler()
    return [event for payload in session for event in assembler.feed(decoder.decode(payload))]


def spooled(session: list[bytes], spool: Spool) -> list[AssembledEvent]:
    decoder, assembler, streams = PgOutputDecoder(2), ChangeAssembler(), SpooledStreams(spool)
    events: list[AssembledEvent] = []
    for payload in session:
        if streams.take(payload):
            continue
        ended = streams.commit(payload)
        if ended is not None:
            events.extend(assembler.replay_spooled(ended[1], ended[0]))
        else:
            events.extend(assembler.feed(decoder.decode(payload)))
    assert not streams.pending
    return events


@pytest.mark.parametrize("memory_limit", [0, 300, 1 << 20], ids=["files", "both", "memory"])
def test_spooled_streams_give_the_assembler_s_events(tmp_path: Path, memory_limit: int) -> None:
    spool = Spool(memory_limit, tmp_path)
    expected = reference(SESSION)
    assert spooled(SESSION, spool) == expected
    keys = [getattr(e, "key", None) for e in expected]
    assert keys == [("1",), None, ("100",), None, *[(str(k),) for k in (1, 2, 3, 4, 5, 8, 9)], None]
    assert spool.memory_used == 0 and list(tmp_path.iterdir()) == []


def test_a_first_segment_again_starts_the_transaction_over(tmp_path: Path) -> None:
    session = [start(900, True), relation(900), insert(900, 1), STOP]
    again = [start(900, True), relation(900), insert(900, 2), STOP, commit(900, 0x400)]
    events = spooled(session + again, Spool(0, tmp_path))
    assert [getattr(e, "key", None) for e in events] == [("2",), None]


def test_a_later_segment_of_an_unknown_transaction_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ChangeAssemblyError, match="never started"):
        SpooledStreams(Spool(0, tmp_path)).take(start(900, False))
