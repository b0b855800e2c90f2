"""Buffering of streamed transactions (pgoutput protocol 2, `streaming = on`) until they end.

Postgres streams a transaction that outgrows `logical_decoding_work_mem` while it is still in
progress: in Stream Start ... Stream Stop chunks, interleaved with other transactions, ended by a
Stream Commit or a Stream Abort (of the whole transaction, or of one subtransaction). Its commit LSN
is unknown until Stream Commit, so its messages are kept here per top-level xid and handed back in
order at commit; this is what Postgres' own apply worker does (it spools them to a file).

Memory: a streamed transaction is held in full until it commits, as decoded messages.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cdc_worker.core.pgoutput.decoder import (
    Delete,
    Insert,
    LogicalMessage,
    PgOutputMessage,
    Relation,
    StreamAbort,
    StreamStart,
    StreamStop,
    Truncate,
    Type,
    Update,
)

# What Postgres sends between Stream Start and Stream Stop, each with its (sub)transaction's xid.
_STREAMABLE = frozenset({Relation, Type, Insert, Update, Delete, Truncate, LogicalMessage})


class ChangeAssemblyError(ValueError):
    """The message sequence does not make sense (unknown relation, Insert outside a transaction...)."""


@dataclass(slots=True)
class _StreamedTransaction:
    xid: int
    messages: list[PgOutputMessage] = field(default_factory=list)
    # Index in `messages` of the first message of each subtransaction: aborting a subtransaction
    # drops everything from there on, which is that subtransaction and its children (Postgres'
    # apply worker truncates its spool file at the same point).
    subxact_starts: dict[int, int] = field(default_factory=dict)


class StreamedTransactions:
    """Every streamed transaction not yet committed or aborted, and the chunk being received."""

    def __init__(self) -> None:
        self._streams: dict[int, _StreamedTransaction] = {}
        self._open: _StreamedTransaction | None = None

    @property
    def in_chunk(self) -> bool:
        """Between Stream Start and Stream Stop: every message goes to `add`."""
        return self._open is not None

    @property
    def pending(self) -> bool:
        """Some streamed transaction is buffered and has not ended yet."""
        return bool(self._streams)

    def start(self, message: StreamStart) -> None:
        stream = self._streams.get(message.xid)
        if message.first_segment != (stream is None):
            state = "already buffered" if stream is not None else "never started"
            raise ChangeAssemblyError(
                f"Stream Start of xid {message.xid} (first segment: {message.first_segment}) "
                f"but that transaction is {state}"
            )
        if stream is None:
            stream = self._streams[message.xid] = _StreamedTransaction(message.xid)
        self._open = stream

    def add(self, message: PgOutputMessage) -> None:
        """A message inside the current chunk; Stream Stop ends the chunk."""
        stream = self._open
        if stream is None:
            raise ChangeAssemblyError(f"{message!r} outside a Stream Start ... Stream Stop chunk")
        if type(message) is StreamStop:
            self._open = None
            return
        xid = getattr(message, "xid", None)
        if type(message) not in _STREAMABLE or xid is None:
            raise ChangeAssemblyError(f"{message!r} inside the stream of xid {stream.xid}")
        if xid != stream.xid and xid not in stream.subxact_starts:
            stream.subxact_starts[xid] = len(stream.messages)
        stream.messages.append(message)

    def abort(self, message: StreamAbort) -> None:
        if message.subxid == message.xid:
            self._pop(message.xid, "Stream Abort")
            return
        stream = self._streams.get(message.xid)
        if stream is None:
            raise ChangeAssemblyError(
                f"Stream Abort of subxact {message.subxid} of unknown xid {message.xid}"
            )
        start = stream.subxact_starts.pop(message.subxid, None)
        if start is None:
            return  # the subtransaction had no change streamed
        dropped = stream.messages[start:]
        del stream.messages[start:]
        # Keep the schema: Postgres sends a table's Relation once per streamed transaction, so
        # later changes of the parent may rely on one sent inside the aborted subtransaction.
        stream.messages.extend(m for m in dropped if type(m) is Relation)
        for subxid in [s for s, index in stream.subxact_starts.items() if index >= start]:
            del stream.subxact_starts[subxid]

    def commit(self, xid: int) -> list[PgOutputMessage]:
        """The committed transaction's messages in stream order; it is forgotten here."""
        return self._pop(xid, "Stream Commit").messages

    def _pop(self, xid: int, what: str) -> _StreamedTransaction:
        stream = self._streams.pop(xid, None)
        if stream is None:
            raise ChangeAssemblyError(f"{what} of xid {xid}, which no Stream Start began")
        return stream
