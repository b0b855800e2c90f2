"""Streamed transactions (pgoutput protocol 2, `streaming 'on'`) encoded on arrival into a `Spool`.

Between Stream Start and Stream Stop every payload belongs to the streamed transaction named by the
Stream Start; each carries, after its type byte, the xid of the (sub)transaction that made it. Each
payload is encoded as it arrives (consecutive row changes of one subtransaction and relation a run
at a time, in one call into the native codec), by the transaction's `StreamEncoder`, into
`spool_records` (Kafka key and value, or the message itself for the rare kinds), spooled in memory
then in files; at the Stream Commit the session reads them back in order, in bulk, and adds what
needed the commit: `bw.lsn`, `bw.commit_ts`, and `bw.seq` numbered exactly as `ChangeAssembler`
numbers a transaction. Nothing of a streamed transaction leaves this class before then.

A Stream Abort of the whole transaction drops its spool; one of a subtransaction cuts the spool
back to where that subtransaction's first record went, which also drops its children (they come
after it), keeping the Relation records of the dropped part: Postgres sends a table's Relation
once per streamed transaction, so the parent's later changes may rely on one sent there, and the
commit hands them to the main assembler.

A restart mid-stream needs nothing here: the spool dies with the process, and Postgres streams the
transaction again from its first segment (the slot's confirmed position is before its commit).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from time import perf_counter
from typing import NamedTuple, Protocol

from cdc_worker.core.changes.spool import Spool, SpoolChunk, SpooledTransaction, SpoolMark
from cdc_worker.core.changes.spool_records import is_relation_record
from cdc_worker.core.changes.stream_encoding import StreamEncoder
from cdc_worker.core.changes.streamed import ChangeAssemblyError
from cdc_worker.core.pgoutput.decoder import (
    StreamAbort,
    StreamCommit,
    StreamStart,
    decode_message,
)
from cdc_worker.core.pgoutput.messages import ROW_CHANGES, MessageType

STREAM_START = MessageType.STREAM_START.value
STREAM_STOP = MessageType.STREAM_STOP.value
STREAM_COMMIT = MessageType.STREAM_COMMIT.value
STREAM_ABORT = MessageType.STREAM_ABORT.value
RELATION = MessageType.RELATION.value
_XID = struct.Struct(">I")
# A row change's (sub)transaction xid and relation OID: consecutive changes alike are encoded in one
# call into the native codec, up to RUN_PAYLOADS of them.
_RUN_KEY = slice(1, 9)
RUN_PAYLOADS = 1000


@dataclass(slots=True)
class _Stream:
    spooled: SpooledTransaction
    encoder: StreamEncoder
    subxact_marks: dict[int, SpoolMark] = field(default_factory=dict)
    payloads: int = 0
    encode_s: float = 0.0  # spent encoding and spooling its payloads
    first_start: float = field(default_factory=perf_counter)
    last_stop: float = 0.0


@dataclass(frozen=True, slots=True)
class SpoolPace:
    """Whether the spool kept up with a streamed transaction's chunks: its payloads, the seconds
    spent encoding and spooling them, and the seconds from its first Stream Start to its last
    Stream Stop (the pace Postgres sent them at; encoding slower than that holds the stream back)."""

    payloads: int
    encode_s: float
    chunks_s: float


class CommittedStream(NamedTuple):
    """A Stream Commit's transaction: the commit, its records in stream order in bulk
    (`SpooledTransaction.drain`; the spool is removed once they are all read), its encoder (for
    `fatal`), the pace it was spooled at, and `discard` to remove the spool unread."""

    commit: StreamCommit
    chunks: Iterator[SpoolChunk]
    encoder: StreamEncoder
    pace: SpoolPace
    discard: Callable[[], None]


class StreamWatcher(Protocol):
    """Told what happens to each streamed transaction as it happens (the shell's producer of
    transactions before their commit, `shell.stream.early_streams`)."""

    def started(self, xid: int, encoder: StreamEncoder) -> None: ...

    def spooled(self, xid: int, records: list[bytes]) -> None: ...

    def cut(self, xid: int) -> None: ...

    def aborted(self, xid: int) -> None: ...


class SpooledStreams:
    """Feed it every payload with `take`; it consumes what belongs to streamed transactions.
    `encoder_for(xid)` makes the encoder of a transaction's first segment; `watcher`, if any, sees
    each transaction start, its records as they are spooled, a subtransaction cut and an abort."""

    def __init__(
        self, spool: Spool, encoder_for: Callable[[int], StreamEncoder], watcher: StreamWatcher | None = None
    ) -> None:
        self.spool = spool
        self.encoder_for = encoder_for
        self.watcher = watcher
        self._streams: dict[int, _Stream] = {}
        self._open: _Stream | None = None
        # Row changes of the open chunk waiting to be encoded together (`_join_run`).
        self._run: list[bytes] = []
        self._run_key = b""
        self.streamed_transactions = 0
        self.aborted_transactions = 0

    @property
    def pending(self) -> bool:
        """A streamed transaction was started and has not ended: nothing past its start may be
        acknowledged on a keepalive."""
        return bool(self._streams) or self._open is not None

    @property
    def in_chunk(self) -> bool:
        return self._open is not None

    @property
    def keyless_pending(self) -> bool:
        """Some pending transaction's changes were spooled without their key text: a re-snapshot
        chunk read now could not learn which of its rows that transaction changes."""
        return any(not stream.encoder.keep_keys for stream in self._streams.values())

    def take(self, payload: bytes) -> bool:
        """True when `payload` was a streamed transaction's (spooled, or a Stream Start/Stop/Abort);
        False for a Stream Commit (see `commit`) and everything outside streams."""
        code = payload[0] if payload else -1
        stream = self._open
        if stream is not None:
            if code in ROW_CHANGES and len(payload) >= _RUN_KEY.stop:
                self._join_run(stream, payload)
                return True
            self._flush_run(stream)
            if code == STREAM_STOP:
                stream.last_stop = perf_counter()
                self._open = None
                return True
            if len(payload) < 5:
                raise ChangeAssemblyError(
                    f"message {chr(code)!r} inside the stream of xid {stream.spooled.xid}"
                )
            self._mark_subxact(stream, payload)
            append = stream.spooled.append
            started = perf_counter()
            records = stream.encoder.encode(payload)
            for record in records:
                append(record)
            stream.encode_s += perf_counter() - started
            stream.payloads += 1
            if self.watcher is not None:
                self.watcher.spooled(stream.spooled.xid, records)
            return True
        if code == STREAM_START:
            self._start(decode_message(payload, protocol_version=2))  # type: ignore[arg-type]
            return True
        if code == STREAM_ABORT:
            self._abort(decode_message(payload, protocol_version=2))  # type: ignore[arg-type]
            return True
        return False

    def _join_run(self, stream: _Stream, payload: bytes) -> None:
        """A row change joins the pending run when it is of the same (sub)transaction and relation
        as the run's, else it starts a new one (after the pending run is spooled)."""
        run = self._run
        if run and payload[_RUN_KEY] == self._run_key:
            run.append(payload)
            if len(run) >= RUN_PAYLOADS:
                self._flush_run(stream)
        else:
            self._flush_run(stream)
            self._mark_subxact(stream, payload)  # before the subtransaction's first record
            self._run = [payload]
            self._run_key = payload[_RUN_KEY]
        stream.payloads += 1

    def _flush_run(self, stream: _Stream) -> None:
        """The pending run encoded in one call (`StreamEncoder.encode_run`) and spooled."""
        run = self._run
        if not run:
            return
        self._run = []
        append = stream.spooled.append
        started = perf_counter()
        records = stream.encoder.encode_run(run)
        for record in records:
            append(record)
        stream.encode_s += perf_counter() - started
        if self.watcher is not None:
            self.watcher.spooled(stream.spooled.xid, records)

    @staticmethod
    def _mark_subxact(stream: _Stream, payload: bytes) -> None:
        """Where a subtransaction's first record goes, for its abort to cut the spool back to."""
        (xid,) = _XID.unpack_from(payload, 1)
        if xid != stream.spooled.xid and xid not in stream.subxact_marks:
            stream.subxact_marks[xid] = stream.spooled.mark()

    def _start(self, message: StreamStart) -> None:
        stream = self._streams.get(message.xid)
        if message.first_segment and stream is not None:
            # The same transaction from its start again (a reconnect): what was spooled is stale.
            stream.spooled.close()
            stream = None
        if stream is None:
            if not message.first_segment:
                raise ChangeAssemblyError(
                    f"Stream Start of xid {message.xid} (not its first segment) but that transaction "
                    "was never started"
                )
            stream = self._streams[message.xid] = _Stream(
                self.spool.transaction(message.xid), self.encoder_for(message.xid)
            )
            self.streamed_transactions += 1
            if self.watcher is not None:
                self.watcher.started(message.xid, stream.encoder)
        self._open = stream

    def _abort(self, message: StreamAbort) -> None:
        if message.subxid == message.xid:
            self._pop(message.xid, "Stream Abort").spooled.close()
            self.aborted_transactions += 1
            if self.watcher is not None:
                self.watcher.aborted(message.xid)
            return
        stream = self._streams.get(message.xid)
        if stream is None:
            raise ChangeAssemblyError(
                f"Stream Abort of subxact {message.subxid} of unknown xid {message.xid}"
            )
        mark = stream.subxact_marks.pop(message.subxid, None)
        if mark is None:
            return  # nothing of that subtransaction was streamed
        if self.watcher is not None:
            self.watcher.cut(message.xid)
        relations = [r for r in stream.spooled.since(mark) if is_relation_record(r, RELATION)]
        stream.spooled.truncate(mark)
        # Its children started after it: their marks are past the cut.
        cut = (mark.in_memory, mark.file_bytes)
        for later in [s for s, m in stream.subxact_marks.items() if (m.in_memory, m.file_bytes) >= cut]:
            del stream.subxact_marks[later]
        for payload in relations:
            stream.spooled.append(payload)

    def commit(self, payload: bytes) -> CommittedStream | None:
        """For a Stream Commit payload its transaction; None for any other."""
        if not payload or payload[0] != STREAM_COMMIT or self._open is not None:
            return None
        message = decode_message(payload, protocol_version=2)
        assert type(message) is StreamCommit
        stream = self._pop(message.xid, "Stream Commit")
        pace = SpoolPace(stream.payloads, stream.encode_s, max(stream.last_stop - stream.first_start, 0.0))
        return CommittedStream(message, self._replay(stream), stream.encoder, pace, stream.spooled.close)

    @staticmethod
    def _replay(stream: _Stream) -> Iterator[SpoolChunk]:
        try:
            yield from stream.spooled.drain()
        finally:
            stream.spooled.close()

    def _pop(self, xid: int, what: str) -> _Stream:
        stream = self._streams.pop(xid, None)
        if stream is None:
            raise ChangeAssemblyError(f"{what} of xid {xid}, which no Stream Start began")
        return stream

    def close(self) -> None:
        """Drop every spooled transaction (the session ends; Postgres will resend them)."""
        for stream in self._streams.values():
            stream.spooled.close()
        self._streams.clear()
        self._open = None
        self._run = []
