"""The native (Rust) row codec's Python face: per relation version, a `NativePlan` that encodes whole
batches of snapshot rows (COPY TEXT) or pgoutput Insert/Update/Delete payloads into Kafka-ready
key and value bytes in one call each.

Guarantees, which `tests/unit/test_native_codec.py` holds it to:

- **Byte-identical to the Python reference** (the serializers in `core.encoding` fed with the rows
  `core.pgtypes.copy_text` parses, or the events `core.pgoutput` + `core.changes.assembler` make):
  same keys, same values, same `bw.unchanged` column names, same events per message (an Update that
  changes the key is a tombstone for the old key then the new row; the delete of an unkeyed table
  is an event that takes a `seq` but publishes nothing).
- **Identical errors**: the Rust side accepts only the canonical text Postgres writes. At the first
  row or message it declines (a value the reference refuses, bad or truncated bytes, anything
  unusual) it stops and reports where; this module runs that one item through the Python reference,
  which raises its exact exception (or encodes it, when it only looked unusual), and goes on
  natively after it. So an error is always the reference's own exception, type and message.
- **Never panics, never hangs**: every read is bounds-checked; a panic would be caught in Rust and
  raised as `NativeCodecError`, never crossing into Python. Batches over 32 kB are encoded with the
  GIL released.

If the extension is not built (no Rust toolchain at install), `NATIVE_AVAILABLE` is False,
`compile_native_plan` returns None and the worker keeps the Python path; `codec_description()` says
which codec runs, for `bottledwater --version` and the start-up line.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
from collections.abc import Mapping
from datetime import UTC, datetime
from json.encoder import encode_basestring
from typing import Literal, Protocol, cast, overload

from cdc_worker.core.changes.assembler import ChangeAssembler
from cdc_worker.core.encoding import avro_schema
from cdc_worker.core.encoding.avro_serializer import AvroEventSerializer
from cdc_worker.core.encoding.json_serializer import JsonEventSerializer
from cdc_worker.core.encoding.native_kinds import UnsupportedColumn, native_column_kinds
from cdc_worker.core.encoding.serializers import TransactionHeaders, change_headers
from cdc_worker.core.model import ChangeEvent, Op, TableSchema, TypeInfo
from cdc_worker.core.pgoutput.decoder import Begin, Delete, Insert, Relation, Update, decode_message
from cdc_worker.core.pgtypes.copy_text import parse_copy_text_line
from cdc_worker.core.pgtypes.mapping import (
    DEFAULT_OPTIONS,
    TypeMappingOptions,
    resolve_type,
)
from kafka_contract.framing import frame_prefix

__all__ = [
    "NATIVE_AVAILABLE",
    "CopyRow",
    "EncodedChange",
    "NativePlan",
    "ProducedChanges",
    "UnsupportedColumn",
    "codec_description",
    "compile_native_plan",
    "native_column_kinds",
    "native_plan_for",
    "NativeProducer",
    "NativeProducerUnavailable",
    "build_native_producer",
    "producer_description",
]

Serializer = AvroEventSerializer | JsonEventSerializer
Errors = Literal["raise", "return"]
# A snapshot row: (key, value); the key is None for an unkeyed table.
CopyRow = tuple[bytes | None, bytes]
# A change: (op, key, value, unchanged TOAST column names). key None: unkeyed table; value None: a
# tombstone (delete, or the old key of an update that changed the key).
EncodedChange = tuple[Op, bytes | None, bytes | None, tuple[str, ...]]

_EXTENSION = "cdc_worker.core.encoding._native_codec"
# Values no encoded byte depends on, for the events built for the reference.
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class _RawPlan(Protocol):
    def encode_copy(
        self, data: bytes, start: int = 0
    ) -> tuple[list[CopyRow], tuple[int, int, int, int, str] | None]: ...

    def encode_changes(
        self, payloads: list[bytes], start: int = 0, in_stream: bool = False
    ) -> tuple[list[EncodedChange | None], tuple[int, str] | None]: ...


# A message librdkafka refused when the native producer was handed it: (index in the call, key +
# value bytes, librdkafka's reason, whether it is over message.max.bytes).
Refused = tuple[int, int, str, bool]
CopyStop = tuple[int, int, int, int, str]
# What `Producer.produce_changes` did: (events numbered, stop, messages per op (c, u, d), their
# key and value bytes, refused messages).
ChangesProduced = tuple[int, tuple[int, str] | None, tuple[int, int, int], int, list[Refused]]


@dataclasses.dataclass(slots=True)
class ProducedChanges:
    """What `NativePlan.produce_changes` did with a run of payloads.

    `events`: how many `seq` numbers the run took; `messages`: how many messages were handed to
    the producer (produced, or refused by it); `ops` and `size`: the messages produced per `Op`
    value and their key and value bytes; `problems`, in order: an event's data error (the
    reference's exception) or a message the producer refused (`Refused`, its index that of the
    event in the run); `rest`: the index of the first payload not taken (`len(payloads)` when all
    were), which the general path must take one at a time (it raises the precise error)."""

    events: int = 0
    messages: int = 0
    ops: dict[str, int] = dataclasses.field(default_factory=dict)
    size: int = 0
    problems: list[Exception | Refused] = dataclasses.field(default_factory=list)
    rest: int = 0

    def count(self, ops: tuple[int, int, int], size: int) -> None:
        for op, produced in zip(("c", "u", "d"), ops, strict=True):
            if produced:
                self.ops[op] = self.ops.get(op, 0) + produced
        self.size += size


class NativeProducer(Protocol):
    """The extension's librdkafka producer (`native/src/producer.rs`)."""

    def produce_copy(
        self,
        plan: _RawPlan,
        data: bytes,
        start: int,
        *,
        topic: str,
        headers: list[tuple[str, bytes]],
        batch: int,
    ) -> tuple[int, CopyStop | None, list[Refused]]: ...

    def produce_changes(
        self,
        plan: _RawPlan,
        payloads: list[bytes],
        start: int,
        *,
        topic: str,
        lsn: bytes,
        xid: bytes,
        commit_ts: bytes,
        first_seq: int,
        batch: int,
        stop_on_refusal: bool,
    ) -> ChangesProduced: ...

    def produce(
        self, topic: str, key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes]], batch: int
    ) -> tuple[int, str, bool] | None: ...

    def take_reports(self) -> tuple[list[tuple[int, int]], list[tuple[int, str, str, int]]]: ...

    def in_flight(self) -> int: ...

    def flush(self, timeout: float) -> int: ...


class _Extension(Protocol):
    __version__: str
    librdkafka_version: str

    def Producer(self, settings: list[tuple[str, str]]) -> NativeProducer: ...  # the extension's class

    def Plan(  # the extension's class, called with keywords only
        self,
        *,
        relation: str,
        relation_oid: int,
        columns: list[tuple[str, str, bytes, bool]],
        key_indexes: list[int],
        output_format: str,
        key_prefix: bytes,
        value_prefix: bytes,
        ops: tuple[Op, Op, Op],
    ) -> _RawPlan: ...


# The worker's `--codec` environment variable: `python` keeps the extension from loading at all, so
# that the Python path can be run (and tested) on a machine where the extension is built.
CODEC_ENV = "BOTTLEDWATER_CODEC"


def _load() -> tuple[_Extension | None, str]:
    if os.environ.get(CODEC_ENV) == "python":
        return None, f"turned off by {CODEC_ENV}=python"
    try:
        return cast(_Extension, importlib.import_module(_EXTENSION)), ""
    except ImportError as exc:
        return None, str(exc)


_native, _IMPORT_ERROR = _load()
NATIVE_AVAILABLE: bool = _native is not None


def codec_description() -> str:
    """Which row codec runs, for `bottledwater --version` and the worker's start-up line."""
    if _native is None:
        return f"python codec (native codec not loaded: {_IMPORT_ERROR})"
    return f"native (Rust) codec {_native.__version__}"


def producer_description() -> str:
    """Which producer the native codec can use, for `bottledwater --version`."""
    if _native is None:
        return "producer confluent-kafka"
    return f"producer native (librdkafka {_native.librdkafka_version}, linked in) or confluent-kafka"


class NativeProducerUnavailable(RuntimeError):
    """The native producer cannot be built: no extension, or a setting its librdkafka lacks."""


def build_native_producer(settings: Mapping[str, str]) -> NativeProducer:
    """A librdkafka producer in the extension with exactly these settings (those confluent-kafka's
    Producer takes); raises `NativeProducerUnavailable` with the reason when it cannot be built."""
    if _native is None:
        raise NativeProducerUnavailable(f"native codec not loaded: {_IMPORT_ERROR}")
    try:
        return _native.Producer([(str(k), str(v)) for k, v in settings.items()])
    except ValueError as exc:
        raise NativeProducerUnavailable(str(exc)) from None


# --- the reference, for the items the native side declines ------------------------------------


class _FixedSchemaIds:
    """A registrar that answers with ids the caller registered already (the low-level API)."""

    def __init__(self, key_schema_id: int | None, value_schema_id: int) -> None:
        self.key_schema_id = key_schema_id
        self.value_schema_id = value_schema_id

    def register_schema(self, subject_name: str, schema: object, normalize_schemas: bool = False) -> int:
        if subject_name.endswith("-key"):
            if self.key_schema_id is None:
                raise ValueError(f"no key schema id was given for subject {subject_name}")
            return self.key_schema_id
        return self.value_schema_id


class NativePlan:
    """One relation version's native encoder (build it with `compile_native_plan` or
    `native_plan_for`). Not thread-safe in its fallback path: one per thread, as the serializers."""

    def __init__(self, raw: _RawPlan, table: TableSchema, reference: Serializer) -> None:
        self._raw = raw
        self.table = table
        self._reference = reference
        # Items the native side declined and the reference took (for metrics and tests): rows or
        # messages with a data error, bad bytes, or text outside the canonical forms.
        self.declined = 0

    # -- snapshot ---------------------------------------------------------------------------------

    @overload
    def encode_copy(self, data: bytes, *, errors: Literal["raise"] = "raise") -> list[CopyRow]: ...

    @overload
    def encode_copy(self, data: bytes, *, errors: Literal["return"]) -> list[CopyRow | Exception]: ...

    def encode_copy(
        self, data: bytes, *, errors: Errors = "raise"
    ) -> list[CopyRow] | list[CopyRow | Exception]:
        """Every row of `data`, COPY TEXT lines each ended by a newline (a last line without one is
        a row too), as `(key, value)`, in order. Split COPY output at the last newline and keep the
        rest for the next call.

        A row the serializer refuses (a data error, a registry failure) raises its exception
        (`errors="raise"`), or takes its place in the list (`"return"`, for `--on-error=log`); a
        line that is not COPY TEXT (`CopyTextError`) or lacks a key column (`IndexError`) always
        raises, as in the snapshot's reference loop.
        """
        rows: list[CopyRow | Exception] = []
        start = 0
        while True:
            encoded, stop = self._raw.encode_copy(data, start)
            rows += encoded
            if stop is None:
                return rows
            _, line_start, line_end, start, _reason = stop
            self.declined += 1
            rows.append(self._reference_row(data[line_start:line_end], errors))
            if start >= len(data):
                return rows

    def produce_copy(
        self,
        producer: NativeProducer,
        data: bytes,
        topic: str,
        headers: list[tuple[str, bytes]],
        batch: int,
    ) -> tuple[int, list[Exception | Refused]]:
        """`encode_copy(data, errors="return")` produced to `topic` by the native producer in the
        same order, delivery reports counted under `batch`. Returns how many rows there were and
        the problems among them: a row's data error (as `encode_copy` returns it) or a message
        librdkafka refused (`Refused`)."""
        rows = 0
        problems: list[Exception | Refused] = []
        start = 0
        while True:
            count, stop, refused = producer.produce_copy(
                self._raw, data, start, topic=topic, headers=headers, batch=batch
            )
            rows += count
            problems += refused
            if stop is None:
                return rows, problems
            _, line_start, line_end, start, _reason = stop
            self.declined += 1
            rows += 1
            row = self._reference_row(data[line_start:line_end], "return")
            if isinstance(row, Exception):
                problems.append(row)
            else:
                outcome = producer.produce(topic, row[0], row[1], headers, batch)
                if outcome is not None:
                    problems.append((rows - 1, *outcome))
            if start >= len(data):
                return rows, problems

    def _reference_row(self, line: bytes, errors: Errors) -> CopyRow | Exception:
        table = self.table
        # A zero-column table's rows are empty lines with no field at all (the snapshot's reading).
        row = parse_copy_text_line(line) if table.columns else ()
        key = tuple(row[i] for i in table.key_indexes) if table.key_indexes else None
        event = ChangeEvent(Op.READ, table, key, row, (), 0, 0, 0, _EPOCH)
        try:
            message = self._reference(event)
        except Exception as exc:
            if errors == "raise":
                raise
            return exc
        if message is None or message.value is None:  # a READ event always has a value
            raise AssertionError(f"the reference published nothing for a snapshot row of {table}")
        return message.key, message.value

    # -- stream -----------------------------------------------------------------------------------

    @overload
    def encode_changes(
        self,
        payloads: list[bytes],
        *,
        xid: int,
        commit_lsn: int,
        in_stream: bool = False,
        errors: Literal["raise"] = "raise",
    ) -> list[EncodedChange | None]: ...

    @overload
    def encode_changes(
        self,
        payloads: list[bytes],
        *,
        xid: int,
        commit_lsn: int,
        in_stream: bool = False,
        errors: Literal["return"],
    ) -> list[EncodedChange | Exception | None]: ...

    def encode_changes(
        self,
        payloads: list[bytes],
        *,
        xid: int,
        commit_lsn: int,
        in_stream: bool = False,
        errors: Errors = "raise",
    ) -> list[EncodedChange | None] | list[EncodedChange | Exception | None]:
        """The events of pgoutput Insert/Update/Delete payloads of this relation version (whole
        XLogData payloads, type byte first; `in_stream`: inside a protocol 2 stream, where an xid
        follows the type byte), in order: one per Insert, Delete and Update, two for an Update
        that changes the key. Each event takes the transaction's next `seq`; None is an event that
        publishes nothing (the delete of an unkeyed table).

        `xid` and `commit_lsn` are the transaction's, named in the reference's errors. A bad or
        truncated payload raises `PgOutputDecodeError`, an impossible change `ChangeAssemblyError`
        (both fatal, as in the stream's reference path); a payload of another relation or not a row
        change raises ValueError. An event the serializer refuses raises (`errors="raise"`) or takes
        its place in the list (`"return"`), as `RowChanges.publish_change` handles it under `--on-error`.
        """
        events: list[EncodedChange | Exception | None] = []
        start = 0
        while True:
            encoded, stop = self._raw.encode_changes(payloads, start, in_stream)
            events += encoded
            if stop is None:
                return events
            index, _reason = stop
            self.declined += 1
            events += self._reference_change(
                payloads[index], index, xid=xid, commit_lsn=commit_lsn, in_stream=in_stream, errors=errors
            )
            start = index + 1
            if start >= len(payloads):
                return events

    def produce_changes(
        self,
        producer: NativeProducer,
        payloads: list[bytes],
        *,
        topic: str,
        headers: TransactionHeaders,
        first_seq: int,
        xid: int,
        commit_lsn: int,
        batch: int,
        stop_on_problem: bool,
    ) -> ProducedChanges:
        """`encode_changes(payloads, errors="return")` produced to `topic` by the native producer in
        the same order, each event with its `bw.*` headers (`bw.seq` from `first_seq`), delivery
        reports counted under `batch`; see `ProducedChanges` for what it returns.

        `headers`: the transaction's `bw.lsn`, `bw.xid` and `bw.commit_ts` headers.
        `stop_on_problem` (`--on-error=exit`): nothing after the first problem is produced, as the
        stream's general path stops at a failed change. A payload whose reference raises (bad
        bytes, an impossible change) is left with the rest for the general path."""
        done = ProducedChanges(rest=len(payloads))
        (_, lsn), (_, xid_text), (_, commit_ts) = headers
        start = 0
        while start < len(payloads):
            events, stop, ops, size, refused = producer.produce_changes(
                self._raw, payloads, start, topic=topic, lsn=lsn, xid=xid_text,
                commit_ts=commit_ts, first_seq=first_seq + done.events, batch=batch,
                stop_on_refusal=stop_on_problem,
            )  # fmt: skip
            done.problems += [(done.events + i, length, why, big) for i, length, why, big in refused]
            done.events += events
            done.messages += sum(ops) + len(refused)
            done.count(ops, size)
            if refused and stop_on_problem:
                return done
            if stop is None:
                return done
            index, _reason = stop
            self.declined += 1
            try:
                changes = self._reference_change(
                    payloads[index], index, xid=xid, commit_lsn=commit_lsn, in_stream=False, errors="return"
                )
            except Exception:
                done.rest = index  # not swallowed: the general path decodes it again and raises
                return done
            for change in changes:
                seq = first_seq + done.events
                done.events += 1
                if change is None:  # the delete of an unkeyed table: numbered, not published
                    continue
                if isinstance(change, Exception):
                    done.problems.append(change)
                    if stop_on_problem:
                        return done
                    continue
                op, key, value, unchanged = change
                outcome = producer.produce(
                    topic, key, value, change_headers(op, seq, headers, unchanged), batch
                )
                done.messages += 1
                if outcome is None:
                    done.count(_OP_COUNTS[op], len(key or b"") + len(value or b""))
                    continue
                done.problems.append((done.events - 1, *outcome))
                if stop_on_problem:
                    return done
            start = index + 1
        return done

    def _reference_change(
        self, payload: bytes, index: int, *, xid: int, commit_lsn: int, in_stream: bool, errors: Errors
    ) -> list[EncodedChange | Exception | None]:
        table = self.table
        message = decode_message(payload, in_stream=in_stream, protocol_version=2 if in_stream else 1)
        if not isinstance(message, Insert | Update | Delete):
            raise ValueError(f"payload {index} is a {type(message).__name__} message, not a row change")
        if message.relation_oid != table.oid:
            raise ValueError(
                f"payload {index} changes relation OID {message.relation_oid}; this plan encodes "
                f"{table.qualified_name} (OID {table.oid})"
            )
        assembler = ChangeAssembler(key_columns_for=lambda _raw: table.key_columns)
        assembler.feed(Relation(table, ()))
        assembler.feed(Begin(commit_lsn, _EPOCH, 0, xid))
        results: list[EncodedChange | Exception | None] = []
        for assembled in assembler.feed(message):
            if not isinstance(assembled, ChangeEvent):  # Insert/Update/Delete make change events only
                raise AssertionError(f"unexpected {assembled!r}")
            event = dataclasses.replace(assembled, table=table)
            try:
                encoded = self._reference(event)
            except Exception as exc:
                if errors == "raise":
                    raise
                results.append(exc)
                continue
            if encoded is None:
                results.append(None)
            else:
                results.append((event.op, encoded.key, encoded.value, event.unchanged_toast))
        return results


# One produced message of an op, in the (inserts, updates, deletes) shape `ProducedChanges.count` takes.
_OP_COUNTS = {Op.INSERT: (1, 0, 0), Op.UPDATE: (0, 1, 0), Op.DELETE: (0, 0, 1)}


def compile_native_plan(
    table: TableSchema,
    type_infos: Mapping[int, TypeInfo],
    *,
    output_format: Literal["avro", "json"],
    key_schema_id: int | None = None,
    value_schema_id: int | None = None,
    options: TypeMappingOptions = DEFAULT_OPTIONS,
    topic_prefix: str | None = None,
    reference: Serializer | None = None,
) -> NativePlan | None:
    """The native plan of one relation version, or None when the extension is not built or a
    column has no native kind (`native_column_kinds` says which): then use the Python path.

    Avro needs the schema ids the registry gave `<topic>-value` (and `<topic>-key` when keyed)
    for `avro_schema.value_schema` / `key_schema` of this table. `reference` is the serializer that
    encodes declined items; by default one is made from the same inputs (`native_plan_for` passes
    the worker's own, so its plan cache and registry client are shared).
    """
    if _native is None:
        return None
    try:
        kinds = native_column_kinds(table, type_infos, options)
    except UnsupportedColumn:
        return None
    if output_format == "avro":
        if value_schema_id is None or (table.is_keyed and key_schema_id is None):
            raise ValueError(f"Avro needs the registered schema ids of {table.qualified_name}")
        key_prefix = frame_prefix(key_schema_id) if key_schema_id is not None else b""
        value_prefix = frame_prefix(value_schema_id)
        if reference is None:
            registrar = _FixedSchemaIds(key_schema_id, value_schema_id)
            reference = AvroEventSerializer(registrar, type_infos, topic_prefix=topic_prefix, options=options)
    else:
        key_prefix = value_prefix = b""
        if reference is None:
            reference = JsonEventSerializer(type_infos, topic_prefix=topic_prefix, options=options)
    columns = [
        (c.name, kind, encode_basestring(c.name).encode(), c.in_replica_identity)
        for c, kind in zip(table.columns, kinds, strict=True)
    ]
    raw = _native.Plan(
        relation=table.qualified_name,
        relation_oid=table.oid,
        columns=columns,
        key_indexes=list(table.key_indexes),
        output_format=output_format,
        key_prefix=key_prefix,
        value_prefix=value_prefix,
        ops=(Op.INSERT, Op.UPDATE, Op.DELETE),
    )
    return NativePlan(raw, table, reference)


def native_plan_for(serializer: Serializer, table: TableSchema) -> NativePlan | None:
    """`compile_native_plan` for a relation version the worker's `serializer` encodes: the same
    type infos, options and topic prefix, and for Avro the schema ids it registered (registering
    them now if it has not yet, as its own first event of this version would)."""
    if _native is None:
        return None
    if isinstance(serializer, AvroEventSerializer):
        try:
            column_types = tuple(
                resolve_type(c.type_oid, c.typmod, serializer.type_infos, serializer.options)
                for c in table.columns
            )
        except ValueError:
            return None
        topic = serializer.topic_for(table)
        value_id = serializer.schema_id(f"{topic}-value", avro_schema.value_schema(table, column_types))
        key = avro_schema.key_schema(table, column_types)
        key_id = None if key is None else serializer.schema_id(f"{topic}-key", key)
        return compile_native_plan(
            table,
            serializer.type_infos,
            output_format="avro",
            key_schema_id=key_id,
            value_schema_id=value_id,
            options=serializer.options,
            reference=serializer,
        )
    return compile_native_plan(
        table, serializer.type_infos, output_format="json", options=serializer.options, reference=serializer
    )
