"""The fused Insert path: pgoutput Insert bytes -> Kafka-ready message in one step.

The general path decodes every message into a frozen `Insert`, assembles a frozen `ChangeEvent`
from it and serializes that: three layers, two objects and a row tuple copied twice per row, which
cost more than the conversion and the encoding together. For the message that dominates a busy
stream (an Insert of a known relation version, inside an ordinary transaction, with only text and
NULL columns) `FastInsertPath` reads the tuple with a per-relation compiled reader and encodes it
with the serializer's writers, taking the transaction's next `seq` exactly as the assembler would.

It returns None, having changed nothing, for every other message and for any Insert it does not
read or cannot encode; the caller then runs that message through the general path, which decodes,
numbers and encodes it, or raises the precise error. So the output (topic, key, value, headers) and
every error are the general path's: the unit tests check both paths byte for byte.

The stream uses it first, then the general path (`RowChanges.one` in `shell/stream/row_changes.py`):

    fused = fast_insert(payload)
    if fused is not None:
        message, table = fused  # an insert (op "c") of `table`
        ... produce `message` as `publish_change` would
        return
    message = decoder.decode(payload)
    ... as before
"""

from __future__ import annotations

from typing import NamedTuple

from cdc_worker.core.changes.assembler import ChangeAssembler, OpenTransaction
from cdc_worker.core.encoding.avro_serializer import AvroEventSerializer
from cdc_worker.core.encoding.json_serializer import JsonEventSerializer
from cdc_worker.core.encoding.serializers import (
    INSERT_OP_HEADER,
    SEQ_HEADERS,
    SEQ_HEADERS_CACHED,
    EncodedMessage,
    Header,
    InsertEncoder,
    seq_header,
)
from cdc_worker.core.model import TableSchema
from cdc_worker.core.pgoutput.decoder import PgOutputDecoder
from cdc_worker.core.pgoutput.insert_reader import (
    INSERT_CODE,
    INSERT_HEADER,
    INSERT_HEADER_OFFSET,
    INSERT_TUPLE_READING,
    NEW_TUPLE,
    TUPLE_DATA_OFFSET,
)

_read_header = INSERT_HEADER.unpack_from
# NamedTuple's generated __new__ is a Python call; building the tuple directly skips it.
_new_message = tuple.__new__


class _Target(NamedTuple):
    """One relation version's compiled writers, from the serializer's plan."""

    table: TableSchema
    generation: int  # the serializer's cache_generation it was compiled in
    width: int
    topic: str
    encode: InsertEncoder


class FastInsertPath:
    """`fast(payload) -> (message, table) | None`, sharing the decoder's, assembler's and
    serializer's state with the general path that takes every message it declines."""

    def __init__(
        self,
        decoder: PgOutputDecoder,
        assembler: ChangeAssembler,
        serializer: AvroEventSerializer | JsonEventSerializer,
    ) -> None:
        self.decoder = decoder
        self.assembler = assembler
        self.serializer = serializer
        self._insert_target = assembler.insert_target
        # By relation OID; an entry whose table is not the assembler's current version is stale.
        self._targets: dict[int, _Target] = {}
        # The transaction whose headers are below (held, so that its id cannot be reused).
        self._txn: OpenTransaction | None = None
        self._txn_headers: tuple[Header, ...] = ()

    def __call__(self, payload: bytes | bytearray | memoryview) -> tuple[EncodedMessage, TableSchema] | None:
        buf = payload if type(payload) is bytes else bytes(payload)
        # Inside a stream (protocol 2) an xid precedes the tuple: the general path's business.
        if len(buf) <= TUPLE_DATA_OFFSET or buf[0] != INSERT_CODE or self.decoder.in_stream:
            return None
        relation_oid, kind, count = _read_header(buf, INSERT_HEADER_OFFSET)
        found = self._insert_target(relation_oid)
        if found is None or kind != NEW_TUPLE:
            return None
        table, txn = found
        target = self._targets.get(relation_oid)
        try:
            if target is None or target[0] is not table or target[1] != self.serializer.cache_generation:
                target = self._compile(relation_oid, table)
            _, _, width, topic, encode = target
            # A count that is not the relation's: the assembler's width check, with its error.
            encoded = encode(buf) if count == width else None
            if encoded is None:
                return None
            key, value = encoded
        except Exception:  # not swallowed: the general path runs the message again and raises
            return None
        if txn is not self._txn:
            self._txn = txn
            self._txn_headers = self.serializer.transaction_headers(txn.commit_lsn, txn.xid, txn.commit_ts)
        lsn_header, xid_header, commit_ts_header = self._txn_headers
        seq = txn.next_seq
        txn.next_seq = seq + 1
        headers = [
            INSERT_OP_HEADER,
            lsn_header,
            SEQ_HEADERS[seq] if seq < SEQ_HEADERS_CACHED else seq_header(seq),
            xid_header,
            commit_ts_header,
        ]
        return _new_message(EncodedMessage, (topic, key, value, headers)), table

    def _compile(self, relation_oid: int, table: TableSchema) -> _Target:
        topic, encode = self.serializer.insert_encoder(table, INSERT_TUPLE_READING)
        target = _Target(table, self.serializer.cache_generation, len(table.columns), topic, encode)
        self._targets[relation_oid] = target
        return target
