"""The native codec's stream path: a pgoutput Insert, Update or Delete of a known relation version,
inside an ordinary transaction, from its bytes to Kafka-ready messages in one call into Rust.

Like `fast_insert`, it shares the decoder's, assembler's and serializer's state with the general
path, numbers the events exactly as the assembler would (each takes the transaction's next `seq`,
an unkeyed table's delete included although it publishes nothing), and returns None, having
changed nothing, for every message it does not take: another kind of message, a stream chunk, a
relation version without a native plan, or bytes the codec refuses (the general path then decodes
the message again and raises the precise error). A value the serializer would refuse comes back as
its exception, in its place, for the caller to handle under `--on-error`.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from cdc_worker.core.changes.assembler import ChangeAssembler, OpenTransaction
from cdc_worker.core.encoding.avro_serializer import AvroEventSerializer
from cdc_worker.core.encoding.json_serializer import JsonEventSerializer
from cdc_worker.core.encoding.native import (
    NativePlan,
    NativeProducer,
    ProducedChanges,
    native_plan_for,
)
from cdc_worker.core.encoding.serializers import EncodedMessage, TransactionHeaders, change_headers
from cdc_worker.core.model import TableSchema
from cdc_worker.core.pgoutput.decoder import PgOutputDecoder
from cdc_worker.core.pgoutput.messages import ROW_CHANGES

_RELATION_OID = struct.Struct(">I")
# NamedTuple's generated __new__ is a Python call; building the tuple directly skips it.
_new_message = tuple.__new__

# One published item: the message and its op, or the exception the serializer would have raised.
NativeItem = tuple[EncodedMessage | Exception, str]


class NativeChangePath:
    """`path(payload) -> (items, table) | None`, or for a run of row changes of one relation
    `starts_run` on its first payload and `encode_run` on all of them; see the module docstring."""

    def __init__(
        self,
        decoder: PgOutputDecoder,
        assembler: ChangeAssembler,
        serializer: AvroEventSerializer | JsonEventSerializer,
    ) -> None:
        self.decoder = decoder
        self.assembler = assembler
        self.serializer = serializer
        # By relation OID: (relation version, serializer cache generation, topic, plan or None).
        self._plans: dict[int, tuple[TableSchema, int, str, NativePlan | None]] = {}
        self._txn: OpenTransaction | None = None
        self._txn_headers: TransactionHeaders = (("", b""), ("", b""), ("", b""))

    def __call__(self, payload: bytes) -> tuple[list[NativeItem], TableSchema] | None:
        if not self.starts_run(payload):
            return None
        encoded = self.encode_run([payload])
        return None if encoded is None else (encoded[0], encoded[1])

    def starts_run(self, payload: bytes) -> bool:
        """Whether this path takes `payload`: a row change of a relation version with a native plan,
        outside a stream chunk. The payloads after it of the same relation, up to the next message
        of another kind, may join its run (`encode_run`): only a Relation message, which ends the
        run, can change the relation version or the plan."""
        if len(payload) < 5 or payload[0] not in ROW_CHANGES or self.decoder.in_stream:
            return False
        (relation_oid,) = _RELATION_OID.unpack_from(payload, 1)
        found = self.assembler.insert_target(relation_oid)
        if found is None:
            return False
        table = found[0]
        entry = self._plans.get(relation_oid)
        if entry is None or entry[0] is not table or entry[1] != self.serializer.cache_generation:
            entry = self._compile(relation_oid, table)
        return entry[3] is not None

    def encode_run(self, payloads: list[bytes]) -> tuple[list[NativeItem], TableSchema, int] | None:
        """The items of a run of row changes of one relation taken by `starts_run`, in order, with
        one call into the codec, and how many of them are messages (the rest are exceptions). None,
        having changed nothing, when the codec refuses a payload: the caller then takes the run's
        payloads one at a time, so the general path raises the precise error at its place."""
        target = self._run_target(payloads)
        if target is None:
            return None
        table, txn, topic, plan = target
        try:
            events = plan.encode_changes(payloads, xid=txn.xid, commit_lsn=txn.commit_lsn, errors="return")
        except Exception:  # not swallowed: the general path decodes the messages again and raises
            return None
        transaction = self._headers_of(txn)
        items: list[NativeItem] = []
        append = items.append
        number = txn.next_seq - 1
        errors = 0
        for event in events:
            number += 1
            if event is None:  # the delete of an unkeyed table: numbered, not published
                continue
            if isinstance(event, Exception):
                append((event, "encoding"))
                errors += 1
                continue
            op, key, value, unchanged = event
            headers = change_headers(op, number, transaction, unchanged)
            append((_new_message(EncodedMessage, (topic, key, value, headers)), op.value))
        txn.next_seq = number + 1
        return items, table, len(items) - errors

    def produce_run(
        self,
        payloads: list[bytes],
        producer: NativeProducer,
        batch_for: Callable[[TableSchema], int],
        *,
        stop_on_problem: bool,
    ) -> tuple[ProducedChanges, TableSchema, str] | None:
        """`encode_run`, produced by the native producer from Rust instead of returned
        (`NativePlan.produce_changes`, delivery reports counted under `batch_for(table)`): what it
        did, the relation version and its topic. None, having changed nothing, when the relation
        has no plan. Payloads from `ProducedChanges.rest` on are the general path's to take."""
        target = self._run_target(payloads)
        if target is None:
            return None
        table, txn, topic, plan = target
        done = plan.produce_changes(
            producer, payloads, topic=topic, headers=self._headers_of(txn), first_seq=txn.next_seq,
            xid=txn.xid, commit_lsn=txn.commit_lsn, batch=batch_for(table), stop_on_problem=stop_on_problem,
        )  # fmt: skip
        txn.next_seq += done.events
        return done, table, topic

    def _run_target(
        self, payloads: list[bytes]
    ) -> tuple[TableSchema, OpenTransaction, str, NativePlan] | None:
        """The relation version, open transaction, topic and plan of a run `starts_run` took."""
        (relation_oid,) = _RELATION_OID.unpack_from(payloads[0], 1)
        found = self.assembler.insert_target(relation_oid)
        entry = self._plans.get(relation_oid)
        if found is None or entry is None or entry[3] is None:
            return None
        return found[0], found[1], entry[2], entry[3]

    def _headers_of(self, txn: OpenTransaction) -> TransactionHeaders:
        """The transaction's shared headers, made once per transaction."""
        if txn is not self._txn:
            self._txn = txn
            self._txn_headers = self.serializer.transaction_headers(txn.commit_lsn, txn.xid, txn.commit_ts)
        return self._txn_headers

    def _compile(
        self, relation_oid: int, table: TableSchema
    ) -> tuple[TableSchema, int, str, NativePlan | None]:
        generation = self.serializer.cache_generation
        try:
            topic = self.serializer.topic_for(table)
            plan = native_plan_for(self.serializer, table)
        except Exception:
            # Registering the version's schemas failed (the registry), or its name: not remembered,
            # the general path meets the same failure and reports it under --on-error.
            return table, generation, "", None
        entry = (table, generation, topic, plan)
        self._plans[relation_oid] = entry
        return entry
