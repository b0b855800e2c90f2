"""`NativePlan`: one relation version's native encoder, with the Python reference behind it.

The Rust side encodes whole batches (COPY TEXT snapshot rows, pgoutput Insert/Update/Delete
payloads) and stops at the first item it declines; the plan runs that one item through the Python
reference (which raises its exact exception, or encodes it when it only looked unusual) and goes on
natively after it. See `core.encoding.native` for the guarantees and how a plan is compiled.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import Literal, overload

from cdc_worker.core.changes.assembler import ChangeAssembler
from cdc_worker.core.encoding.avro_serializer import AvroEventSerializer
from cdc_worker.core.encoding.json_serializer import JsonEventSerializer
from cdc_worker.core.encoding.native_extension import CopyRow, EncodedChange, NativeProducer, RawPlan, Refused
from cdc_worker.core.encoding.serializers import TransactionHeaders, change_headers
from cdc_worker.core.model import ChangeEvent, Op, TableSchema
from cdc_worker.core.pgoutput.decoder import Begin, Delete, Insert, Relation, Update, decode_message
from cdc_worker.core.pgtypes.copy_text import parse_copy_text_line

Serializer = AvroEventSerializer | JsonEventSerializer
Errors = Literal["raise", "return"]
# Values no encoded byte depends on, for the events built for the reference.
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


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


class NativePlan:
    """One relation version's native encoder (build it with `compile_native_plan` or
    `native_plan_for`). Not thread-safe in its fallback path: one per thread, as the serializers."""

    def __init__(self, raw: RawPlan, table: TableSchema, reference: Serializer) -> None:
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

    def encode_spool_records(self, payloads: list[bytes], start: int) -> tuple[list[bytes], int | None]:
        """A streamed transaction's Insert/Update/Delete payloads from `start` on, each event as
        the spool's record (`core.changes.spool_records`, no key text), up to the first payload the
        native side declines: its index (for the caller's per-payload path), or None."""
        records, stop = self._raw.encode_spool_records(payloads, start)
        if stop is None:
            return records, None
        self.declined += 1
        return records, stop[0]

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
