"""The messages of the `pgoutput` logical replication protocol (versions 1 and 2), as frozen dataclasses.

`cdc_worker.core.pgoutput.decoder` decodes bytes into these and re-exports them; the names of the enums follow
Postgres' "Logical Replication Message Formats" documentation.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from cdc_worker.core.model import ColumnValue, TableSchema

# TimestampTz on the wire: microseconds since the Postgres epoch.
POSTGRES_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)


class MessageType(enum.IntEnum):
    """The first byte of every pgoutput message."""

    BEGIN = ord("B")
    COMMIT = ord("C")
    ORIGIN = ord("O")
    RELATION = ord("R")
    TYPE = ord("Y")
    INSERT = ord("I")
    UPDATE = ord("U")
    DELETE = ord("D")
    TRUNCATE = ord("T")
    MESSAGE = ord("M")
    STREAM_START = ord("S")
    STREAM_STOP = ord("E")
    STREAM_COMMIT = ord("c")
    STREAM_ABORT = ord("A")


# The first bytes of the messages that carry a row change (the codec's and the runs' fast paths).
ROW_CHANGES = frozenset({MessageType.INSERT.value, MessageType.UPDATE.value, MessageType.DELETE.value})


class TupleKind(enum.IntEnum):
    """The byte that introduces a tuple inside Insert/Update/Delete."""

    NEW = ord("N")
    KEY = ord("K")  # old values of the replica identity columns only; the others are sent as null
    OLD = ord("O")  # old values of every column (REPLICA IDENTITY FULL)


class ColumnKind(enum.IntEnum):
    """The byte that introduces each column of a tuple."""

    NULL = ord("n")
    UNCHANGED_TOAST = ord("u")
    TEXT = ord("t")
    BINARY = ord("b")


class ColumnFlag(enum.IntFlag):
    """Per-column flags of a Relation message."""

    KEY = 1  # part of the replica identity


class TruncateOption(enum.IntFlag):
    CASCADE = 1
    RESTART_IDENTITY = 2


class LogicalMessageFlag(enum.IntFlag):
    TRANSACTIONAL = 1


class StreamStartFlag(enum.IntFlag):
    FIRST_SEGMENT = 1


Row = tuple[ColumnValue, ...]


def timestamp_from_postgres(micros: int) -> datetime:
    """TimestampTz (microseconds since 2000-01-01 UTC) -> aware UTC datetime."""
    return POSTGRES_EPOCH + timedelta(microseconds=micros)


@dataclass(frozen=True, slots=True)
class Begin:
    final_lsn: int  # the LSN of the commit record: the transaction's commit LSN
    commit_ts: datetime
    commit_ts_us: int  # raw microseconds since 2000-01-01 UTC
    xid: int


@dataclass(frozen=True, slots=True)
class Commit:
    flags: int
    commit_lsn: int
    end_lsn: int  # end of the commit record: what a subscriber acknowledges
    commit_ts: datetime
    commit_ts_us: int


@dataclass(frozen=True, slots=True)
class Origin:
    origin_lsn: int
    name: str


@dataclass(frozen=True, slots=True)
class Relation:
    # `schema.key_columns` is left empty: the Kafka key is the assembler's decision.
    schema: TableSchema
    column_flags: tuple[int, ...]
    xid: int | None = None  # set inside a stream (protocol 2)


@dataclass(frozen=True, slots=True)
class Type:
    oid: int
    namespace: str
    name: str
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class Insert:
    relation_oid: int
    new: Row
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class Update:
    relation_oid: int
    old_kind: TupleKind | None  # KEY, OLD, or None when Postgres logged no old tuple
    old: Row | None
    new: Row
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class Delete:
    relation_oid: int
    old_kind: TupleKind
    old: Row
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class Truncate:
    relation_oids: tuple[int, ...]
    cascade: bool
    restart_identity: bool
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class LogicalMessage:
    """A `pg_logical_emit_message()`; the worker skips these."""

    transactional: bool
    lsn: int
    prefix: str
    content: bytes
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class StreamStart:
    xid: int
    first_segment: bool


@dataclass(frozen=True, slots=True)
class StreamStop:
    pass


@dataclass(frozen=True, slots=True)
class StreamCommit:
    xid: int
    flags: int
    commit_lsn: int
    end_lsn: int
    commit_ts: datetime
    commit_ts_us: int


@dataclass(frozen=True, slots=True)
class StreamAbort:
    xid: int  # the top-level transaction
    subxid: int  # equal to xid when the whole transaction aborts, else the aborted subtransaction


PgOutputMessage = (
    Begin
    | Commit
    | Origin
    | Relation
    | Type
    | Insert
    | Update
    | Delete
    | Truncate
    | LogicalMessage
    | StreamStart
    | StreamStop
    | StreamCommit
    | StreamAbort
)
