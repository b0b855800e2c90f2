"""Values shared by every layer of the worker's pure core.

The decoder (`pgoutput`) produces `TableSchema`s and raw column values, the assembler (`changes`)
turns them into `ChangeEvent`s, and the converters and encoders turn those into Kafka messages.
The snapshot reader produces the same `ChangeEvent`s (op `r`), so everything downstream of the
assembler is shared by snapshot and stream.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime


class ReplicaIdentity(enum.Enum):
    """`pg_class.relreplident`: which old values Postgres logs for updates and deletes."""

    DEFAULT = "d"
    NOTHING = "n"
    FULL = "f"
    INDEX = "i"


class UnchangedToast:
    """Marker for a TOASTed column that an update did not change, so pgoutput omits its value."""

    _instance: UnchangedToast | None = None

    def __new__(cls) -> UnchangedToast:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNCHANGED_TOAST"

    def __reduce__(self) -> str:
        return "UNCHANGED_TOAST"


UNCHANGED_TOAST = UnchangedToast()

# A column value as Postgres sends it: its text output, raw bytes (binary format, never requested
# by the worker), NULL, or the unchanged-TOAST marker.
ColumnValue = str | bytes | None | UnchangedToast


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    type_oid: int
    typmod: int
    # Part of the replica identity as pgoutput flags it; with REPLICA IDENTITY FULL that is every
    # column, which is why the Kafka key comes from `TableSchema.key_columns`, not from this flag.
    in_replica_identity: bool = False


@dataclass(frozen=True, slots=True)
class TableSchema:
    """One version of a table's shape, as a Relation message (or the catalog, for snapshots) gives it."""

    oid: int
    namespace: str
    name: str
    columns: tuple[Column, ...]
    replica_identity: ReplicaIdentity = ReplicaIdentity.DEFAULT
    # Names of the Kafka key's columns, in key order; empty for an unkeyed table.
    key_columns: tuple[str, ...] = ()
    key_indexes: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        names = [c.name for c in self.columns]
        missing = [k for k in self.key_columns if k not in names]
        if missing:
            raise ValueError(
                f"key column(s) {missing} of {self.qualified_name} are not among its columns {names}"
            )
        object.__setattr__(self, "key_indexes", tuple(names.index(k) for k in self.key_columns))

    @property
    def qualified_name(self) -> str:
        return f"{self.namespace}.{self.name}"

    @property
    def is_keyed(self) -> bool:
        return bool(self.key_columns)


class Op(enum.StrEnum):
    """The `bw.op` header: what happened to the row."""

    READ = "r"  # snapshot read
    INSERT = "c"
    UPDATE = "u"
    DELETE = "d"


@dataclass(frozen=True, slots=True)
class ChangeEvent:
    """One row-level change, ready to be converted and encoded into one Kafka message."""

    op: Op
    table: TableSchema
    # Values of `table.key_columns`, in that order; None for an unkeyed table.
    key: tuple[ColumnValue, ...] | None
    # The whole new row (one value per column of `table`); None for a delete.
    row: tuple[ColumnValue, ...] | None
    # Names of the columns whose value `row` does not carry (unchanged TOAST).
    unchanged_toast: tuple[str, ...]
    commit_lsn: int
    # Position of the change inside its transaction, from 0.
    seq: int
    xid: int
    commit_ts: datetime


@dataclass(frozen=True, slots=True)
class TruncateEvent:
    """A TRUNCATE of one or more tables, published to the control topic keyed by table."""

    tables: tuple[TableSchema, ...]
    cascade: bool
    restart_identity: bool
    commit_lsn: int
    seq: int
    xid: int
    commit_ts: datetime


@dataclass(frozen=True, slots=True)
class SnapshotControl:
    """How a re-snapshot of one table goes, for the control topic (keyed `<table>#snapshot`)."""

    op: str  # SNAPSHOT_PROGRESS, SNAPSHOT_DONE or SNAPSHOT_FAILED
    namespace: str
    name: str
    topic: str
    request_id: str
    rows: int  # published so far
    reason: str | None
    commit_lsn: int
    seq: int
    xid: int
    commit_ts: datetime


@dataclass(frozen=True, slots=True)
class TransactionCommitted:
    """Every event of the transaction has been emitted; `end_lsn` is the position to acknowledge."""

    xid: int
    commit_lsn: int
    end_lsn: int
    commit_ts: datetime
    event_count: int


@dataclass(frozen=True, slots=True)
class TypeInfo:
    """What the catalog says of a type that pgoutput names only by OID (enums, domains, arrays,
    extension types such as hstore and citext). The shell loads these from `pg_type`."""

    oid: int
    namespace: str
    name: str
    # pg_type.typtype: b base, c composite, d domain, e enum, p pseudo, r range, m multirange
    kind: str
    # For an array type, its element type; 0 otherwise.
    element_oid: int = 0
    # For a domain, its base type and typmod; 0 and -1 otherwise.
    base_oid: int = 0
    base_typmod: int = -1
