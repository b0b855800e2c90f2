"""Encoding a streamed transaction's changes as its chunks arrive (see `spool_records`).

Each streamed transaction gets its own `StreamEncoder`, with its own `ChangeAssembler`: Postgres
sends, inside every streamed transaction, a Relation for each table before its first change there,
so the transaction's relation versions are all in its own stream, and a schema change in the middle
of it applies to its later changes only. The worker's main assembler learns those versions at the
commit, from the Relation records, as Postgres' walsender then assumes it has them.

Inserts, Updates and Deletes go through the native codec when it is on and has a plan for the
relation version (unless the key's text is needed, which only the general path gives); any message
it declines takes the general path: decode, assemble, serialize. Truncates and logical messages are
kept as they came: they are rare, and their events (control topic, DDL, re-snapshot signals) are
made at the commit by the session's general path.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import NamedTuple

from cdc_worker.core.changes.assembler import ChangeAssembler, KeyColumnsFor, OpenTransaction
from cdc_worker.core.changes.spool_records import (
    CHANGE,
    ENCODING_ERROR,
    FATAL,
    MESSAGE,
    SKIP,
    SKIP_RECORD,
    KeyText,
    change_record,
    error_record,
    fatal_record,
    message_record,
    read_change_fields,
    read_error,
    read_fatal,
)
from cdc_worker.core.changes.streamed import ChangeAssemblyError
from cdc_worker.core.encoding.avro_serializer import AvroEventSerializer
from cdc_worker.core.encoding.json_serializer import JsonEventSerializer
from cdc_worker.core.encoding.native import NativePlan, native_plan_for
from cdc_worker.core.encoding.serializers import SEQ_HEADERS, SEQ_HEADERS_CACHED, EncodedMessage, seq_header
from cdc_worker.core.model import ChangeEvent, ColumnValue, Op, TableSchema
from cdc_worker.core.pgoutput.decoder import Begin, PgOutputMessage, Relation, decode_message
from cdc_worker.core.pgoutput.messages import ROW_CHANGES, MessageType
from kafka_contract.headers import HEADER_OP, HEADER_UNCHANGED

# Kept as they came, for the commit: their events need the commit LSN's control-topic headers, or
# the session's re-snapshot state at the commit.
_KEPT = frozenset({MessageType.TRUNCATE.value, MessageType.MESSAGE.value})
RELATION = MessageType.RELATION.value
TYPE = MessageType.TYPE.value
# The placeholder commit of the encoder's assembler: its events' LSN, time and seq are discarded.
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# By the op's byte in a record: its `bw.op` header and its text.
_OP_HEADERS = {ord(op.value): ((HEADER_OP, op.value.encode()), op.value) for op in Op}
# NamedTuple's generated __new__ is a Python call; building the tuple directly skips it.
_new_message = tuple.__new__

Serializer = AvroEventSerializer | JsonEventSerializer


def key_text(key: tuple[ColumnValue, ...] | None) -> KeyText | None:
    """The key as the re-snapshot's chunks hold it: pgoutput's text values."""
    if key is None:
        return None
    return tuple(
        v if v is None or type(v) is str else v.decode() if type(v) is bytes else str(v) for v in key
    )


class StreamEncoder:
    """`encode(payload) -> records` for the payloads of one streamed transaction, in order.

    `prepare_relation` is the shell's look-up of a new relation version's types (catalog I/O), done
    before its first change is encoded. `keep_keys` stores each change's key text (a re-snapshot
    runs, whose chunk must drop the rows the transaction changes). An exception from assembling a
    message is kept, not raised: the transaction may still abort; a commit raises it (`fatal`)."""

    def __init__(
        self,
        xid: int,
        *,
        key_columns_for: KeyColumnsFor,
        serializer: Serializer,
        prepare_relation: Callable[[Relation], None],
        native: bool,
        keep_keys: bool,
    ) -> None:
        self.xid = xid
        self.serializer = serializer
        self.prepare_relation = prepare_relation
        self.native = native and not keep_keys
        self.keep_keys = keep_keys
        self.assembler = ChangeAssembler(key_columns_for)
        self.assembler.feed(Begin(0, _EPOCH, 0, xid))
        self.fatal: list[Exception] = []
        # By relation OID: (relation version, serializer cache generation, plan or None).
        self._plans: dict[int, tuple[TableSchema, int, NativePlan | None]] = {}

    def encode(self, payload: bytes) -> list[bytes]:
        code = payload[0]
        if code in _KEPT:
            return [message_record(payload)]
        if code == TYPE:
            return []  # the shell reads types from pg_type when a Relation names them
        if self.native and code in ROW_CHANGES:
            native = self._native(payload)
            if native is not None:
                return native
        try:
            message = decode_message(payload, in_stream=True, protocol_version=2)
            if type(message) is Relation:
                self.prepare_relation(message)
                self.assembler.feed(message)
                return [message_record(payload)]
            events = list(self.assembler.feed(message))
        except Exception as exc:
            self.fatal.append(exc)
            return [fatal_record(len(self.fatal) - 1)]
        records: list[bytes] = []
        for event in events:
            assert type(event) is ChangeEvent  # row changes make nothing else
            records.append(self._general(event))
        return records

    def _general(self, event: ChangeEvent) -> bytes:
        try:
            message = self.serializer(event)
        except Exception as exc:
            return error_record(event.table.oid, exc)
        if message is None:
            return SKIP_RECORD
        return change_record(
            event.op.value,
            event.table.oid,
            message.key,
            message.value,
            event.unchanged_toast,
            key_text(event.key) if self.keep_keys else None,
        )

    def encode_run(self, payloads: list[bytes]) -> list[bytes]:
        """`encode` of a run of Insert/Update/Delete payloads of one relation and (sub)transaction,
        in one call into the native codec when it has a plan for the relation; a payload it
        declines, and every payload without a plan, take `encode`."""
        plan = self._plan_of(payloads[0]) if self.native else None
        if plan is None:
            return [record for payload in payloads for record in self.encode(payload)]
        records: list[bytes] = []
        start = 0
        while start < len(payloads):
            try:
                encoded, stop = plan.encode_spool_records(payloads, start)
            except Exception:  # not swallowed: `encode` meets the payloads again and keeps the error
                return records + [record for payload in payloads[start:] for record in self.encode(payload)]
            records += encoded
            if stop is None:
                break
            records += self.encode(payloads[stop])
            start = stop + 1
        return records

    def _plan_of(self, payload: bytes) -> NativePlan | None:
        """The native plan of a row change's relation version, or None."""
        if len(payload) < 9:
            return None
        relation_oid = int.from_bytes(payload[5:9])
        try:
            table = self.assembler.schema(relation_oid)
        except KeyError:
            return None
        entry = self._plans.get(relation_oid)
        if entry is None or entry[0] is not table or entry[1] != self.serializer.cache_generation:
            try:
                plan = native_plan_for(self.serializer, table)
            except Exception:  # the registry: the general path meets it too and reports it
                return None
            entry = self._plans[relation_oid] = (table, self.serializer.cache_generation, plan)
        return entry[2]

    def _native(self, payload: bytes) -> list[bytes] | None:
        plan = self._plan_of(payload)
        if plan is None:
            return None
        relation_oid = int.from_bytes(payload[5:9])
        try:
            events = plan.encode_changes(
                [payload], xid=self.xid, commit_lsn=0, in_stream=True, errors="return"
            )
        except Exception:  # not swallowed: the general path decodes the message again and keeps it
            return None
        records: list[bytes] = []
        for event in events:
            if event is None:
                records.append(SKIP_RECORD)
            elif isinstance(event, Exception):
                records.append(error_record(relation_oid, event))
            else:
                op, key, value, unchanged = event
                records.append(change_record(op.value, relation_oid, key, value, unchanged))
        return records


class ReplayedChange(NamedTuple):
    """A spooled change with its commit's headers, ready for Kafka."""

    message: EncodedMessage
    relation_oid: int
    op: str
    key_text: KeyText | None


@dataclass(frozen=True, slots=True)
class RefusedChange:
    """A change the serializer refused when it arrived: for `--on-error`."""

    relation_oid: int
    error: Exception


def replay(
    records: Iterable[bytes],
    txn: OpenTransaction,
    encoder: StreamEncoder,
    topic_of: Callable[[int], str],
) -> Iterator[ReplayedChange | RefusedChange | PgOutputMessage]:
    """A committed streamed transaction's records in order, each change numbered with `txn`'s next
    `seq` and given its `bw.*` headers. A kept message is yielded decoded: the caller hands it to
    `ChangeAssembler.replay_spooled` (with `txn`) before asking for the next item, so that a
    Relation's version is the main assembler's when `topic_of` names the later changes' topic."""
    lsn_header, xid_header, ts_header = encoder.serializer.transaction_headers(
        txn.commit_lsn, txn.xid, txn.commit_ts
    )
    topics: dict[int, str] = {}
    for record in records:
        kind = record[0]
        if kind == CHANGE:
            op, oid, key, value, unchanged, key_text = read_change_fields(record)
            seq = txn.next_seq
            txn.next_seq = seq + 1
            topic = topics.get(oid)
            if topic is None:
                topic = topics[oid] = topic_of(oid)
            op_header, op_text = _OP_HEADERS[op]
            headers = [
                op_header,
                lsn_header,
                SEQ_HEADERS[seq] if seq < SEQ_HEADERS_CACHED else seq_header(seq),
                xid_header,
                ts_header,
            ]
            if unchanged:
                headers.append((HEADER_UNCHANGED, unchanged))
            message = _new_message(EncodedMessage, (topic, key, value, headers))
            yield _new_message(ReplayedChange, (message, oid, op_text, key_text))
        elif kind == SKIP:
            txn.next_seq += 1
        elif kind == ENCODING_ERROR:
            txn.next_seq += 1
            oid, error = read_error(record)
            yield RefusedChange(oid, error)
        elif kind == FATAL:
            raise encoder.fatal[read_fatal(record)]
        elif kind == MESSAGE:
            kept = decode_message(record[1:], in_stream=True, protocol_version=2)
            yield kept
            if type(kept) is Relation:
                topics.pop(kept.schema.oid, None)
        else:
            raise ChangeAssemblyError(f"spool record of unknown kind {kind!r} in xid {txn.xid}")
