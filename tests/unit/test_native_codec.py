"""The native (Rust) codec against the Python reference, byte for byte and error for error.

Every test builds the same input two ways: through `NativePlan` (`core.encoding.native`), and through
the reference pipeline written out here independently (COPY: `parse_copy_text_line` + the serializer,
as the snapshot does; pgoutput: `decode_message` + `ChangeAssembler` + the serializer, as the stream
does). Keys, values, events per message, `bw.unchanged` names and exceptions (type and message) must
be equal. Avro values are also read back with fastavro and written again by it: the same bytes.

Without the extension the module fails when BW_REQUIRE_NATIVE=1 (CI after a build that must have
produced it) and is skipped otherwise, saying why.
"""

from __future__ import annotations

import io
import json
import os
import struct
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import fastavro
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdc_worker.core.changes.assembler import ChangeAssembler
from cdc_worker.core.encoding import avro_schema, native
from cdc_worker.core.encoding.avro_serializer import AvroEventSerializer
from cdc_worker.core.encoding.json_serializer import JsonEventSerializer
from cdc_worker.core.model import ChangeEvent, Column, Op, TableSchema
from cdc_worker.core.pgoutput.decoder import Begin, Relation, decode_message
from cdc_worker.core.pgtypes.copy_text import parse_copy_text_line
from cdc_worker.core.pgtypes.mapping import TypeMappingOptions, table_column_types
from cdc_worker.core.pgtypes.oids import PgType
from tests.unit import native_codec_cases as cases
from tests.unit.native_codec_cases import (
    TOAST,
    TYPE_INFOS,
    Case,
    copy_line,
    message,
    numeric_typmod,
    row_values,
    tables,
)

if not native.NATIVE_AVAILABLE:
    reason = f"the native codec is not built: {native.codec_description()}"
    if os.environ.get("BW_REQUIRE_NATIVE") == "1":
        pytest.fail(reason + " (BW_REQUIRE_NATIVE=1)", pytrace=False)
    pytest.skip(reason, allow_module_level=True)

KEY_ID, VALUE_ID = 7, 300
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
XID, LSN = 771, 0x16_B374_D848
OPTIONS = [TypeMappingOptions(), TypeMappingOptions(unconstrained_numeric=(20, 4))]
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


class FixedIds:
    def register_schema(self, subject_name: str, schema: object, normalize_schemas: bool = False) -> int:
        return KEY_ID if subject_name.endswith("-key") else VALUE_ID


Serializer = AvroEventSerializer | JsonEventSerializer


def reference_serializer(output_format: str, options: TypeMappingOptions) -> Serializer:
    if output_format == "avro":
        return AvroEventSerializer(FixedIds(), TYPE_INFOS, options=options)
    return JsonEventSerializer(TYPE_INFOS, options=options)


def native_plan(case: Case, output_format: str, options: TypeMappingOptions) -> native.NativePlan:
    plan = native.compile_native_plan(
        case.table,
        TYPE_INFOS,
        output_format="avro" if output_format == "avro" else "json",
        key_schema_id=KEY_ID if case.table.is_keyed else None,
        value_schema_id=VALUE_ID,
        options=options,
    )
    assert plan is not None, native.native_column_kinds(case.table, TYPE_INFOS, options)
    return plan


def outcome(run: Callable[[], Any]) -> Any:
    """The result, or the exception as (type, message) so that two runs compare."""
    try:
        return ("ok", run())
    except Exception as exc:
        return ("error", type(exc), str(exc))


def as_outcome(item: object) -> Any:
    return ("error", type(item), str(item)) if isinstance(item, Exception) else ("ok", item)


# --- the reference pipelines -------------------------------------------------------------------


def reference_copy(serializer: Serializer, table: TableSchema, line: bytes) -> Any:
    """A snapshot row as the snapshot's loop makes it: parsing and key errors raise, the
    serializer's outcome is returned."""
    row = parse_copy_text_line(line)
    key = tuple(row[i] for i in table.key_indexes) if table.key_indexes else None
    event = ChangeEvent(Op.READ, table, key, row, (), LSN, 0, 0, EPOCH)
    result = outcome(lambda: serializer(event))
    return result if result[0] == "error" else ("ok", (result[1].key, result[1].value))


def reference_lines(serializer: Serializer, table: TableSchema, buffer: bytes) -> list[Any]:
    lines = buffer.split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    return [reference_copy(serializer, table, line) for line in lines]


def reference_changes(
    serializer: Serializer, table: TableSchema, payloads: list[bytes], in_stream: bool
) -> list[Any]:
    """The stream's general path: decoding and assembly errors raise, the serializer's outcome per
    event is returned with the event's op and unchanged TOAST names."""
    results: list[Any] = []
    for payload in payloads:
        assembler = ChangeAssembler(key_columns_for=lambda raw: table.key_columns)
        assembler.feed(Relation(table, ()))
        assembler.feed(Begin(LSN, EPOCH, 0, XID))
        decoded = decode_message(payload, in_stream=in_stream, protocol_version=2 if in_stream else 1)
        for event in assembler.feed(decoded):
            assert isinstance(event, ChangeEvent)
            result = outcome(lambda event=event: serializer(event))
            if result[0] == "error":
                results.append(result)
            elif result[1] is None:
                results.append(("ok", None))
            else:
                results.append(("ok", (event.op, result[1].key, result[1].value, event.unchanged_toast)))
    return results


def native_changes(plan: native.NativePlan, payloads: list[bytes], in_stream: bool = False) -> list[Any]:
    items = plan.encode_changes(payloads, xid=XID, commit_lsn=LSN, in_stream=in_stream, errors="return")
    return [as_outcome(item) for item in items]


def native_lines(plan: native.NativePlan, buffer: bytes) -> list[Any]:
    return [as_outcome(item) for item in plan.encode_copy(buffer, errors="return")]


def strip_logical_types(schema: Any) -> Any:
    if isinstance(schema, list):
        return [strip_logical_types(s) for s in schema]
    if isinstance(schema, dict):
        return {k: strip_logical_types(v) for k, v in schema.items() if k != "logicalType"}
    return schema


def check_fastavro_round_trip(framed: bytes, schema: dict[str, Any], schema_id: int) -> None:
    """fastavro reads the native bytes to their end and writes the same bytes back."""
    assert framed[:5] == b"\x00" + struct.pack(">I", schema_id)
    parsed = fastavro.parse_schema(strip_logical_types(schema))
    body = io.BytesIO(framed[5:])
    record = fastavro.schemaless_reader(body, parsed, None)
    assert body.tell() == len(framed) - 5
    again = io.BytesIO()
    fastavro.schemaless_writer(again, parsed, record)
    assert again.getvalue() == framed[5:]


# --- snapshot rows -----------------------------------------------------------------------------


@SETTINGS
@given(
    data=st.data(),
    case=tables(),
    output_format=st.sampled_from(["avro", "json"]),
    options=st.sampled_from(OPTIONS),
)
def test_copy_rows_are_byte_identical(
    data: st.DataObject, case: Case, output_format: str, options: TypeMappingOptions
) -> None:
    rows = data.draw(st.lists(row_values(case), min_size=1, max_size=8))
    buffer = b"".join(copy_line(row) for row in rows)
    plan = native_plan(case, output_format, options)
    reference = reference_serializer(output_format, options)
    got = native_lines(plan, buffer)
    expected = reference_lines(reference, case.table, buffer)
    assert got == expected
    if output_format == "avro":
        column_types = table_column_types(case.table, TYPE_INFOS, options)
        value_schema = avro_schema.value_schema(case.table, column_types)
        key_schema = avro_schema.key_schema(case.table, column_types)
        for result in got:
            if result[0] == "ok":
                key, value = result[1]
                check_fastavro_round_trip(value, value_schema, VALUE_ID)
                if key_schema is not None:
                    check_fastavro_round_trip(key, key_schema, KEY_ID)
    # The first error in "raise" mode is the reference's own.
    first_error = next((r for r in expected if r[0] == "error"), None)
    raised = outcome(lambda: plan.encode_copy(buffer))
    assert raised[0] == "ok" if first_error is None else raised == first_error


# --- pgoutput row messages ---------------------------------------------------------------------


@st.composite
def change(draw: st.DrawFn, case: Case) -> bytes:
    """An Insert, Update (no old / K / O tuple, unchanged TOAST, key changes) or Delete payload."""
    table, in_stream = case.table, False
    new = draw(row_values(case))
    kind = draw(st.sampled_from(["insert", "update", "update", "delete"]))
    xid = XID if in_stream else None
    if kind == "insert":
        return message(b"I", table.oid, [(b"N", new)], xid)
    key_indexes = set(table.key_indexes)
    old = draw(row_values(case))
    if draw(st.booleans()):  # most updates keep the key
        old = tuple(new[i] if i in key_indexes else v for i, v in enumerate(old))
    key_tuple = tuple(v if i in key_indexes else None for i, v in enumerate(old))
    old_kind = draw(st.sampled_from([None, b"K", b"O"]))
    old_tuple = {None: None, b"K": key_tuple, b"O": old}[old_kind]
    if kind == "delete":
        return message(b"D", table.oid, [(old_kind or b"K", key_tuple if old_kind != b"O" else old)], xid)
    toasted = draw(st.sets(st.integers(0, len(new) - 1), max_size=2))
    new_with_toast = tuple(TOAST if i in toasted else v for i, v in enumerate(new))
    tuples: list[tuple[bytes, tuple[object, ...]]] = (
        [] if old_tuple is None else [(old_kind or b"", old_tuple)]
    )
    return message(b"U", table.oid, [*tuples, (b"N", new_with_toast)], xid)


@SETTINGS
@given(
    data=st.data(),
    case=tables(),
    output_format=st.sampled_from(["avro", "json"]),
    options=st.sampled_from(OPTIONS),
)
def test_changes_are_byte_identical(
    data: st.DataObject, case: Case, output_format: str, options: TypeMappingOptions
) -> None:
    payloads = data.draw(st.lists(change(case), min_size=1, max_size=6))
    plan = native_plan(case, output_format, options)
    reference = reference_serializer(output_format, options)
    got = outcome(lambda: native_changes(plan, payloads))
    assert got == outcome(lambda: reference_changes(reference, case.table, payloads, in_stream=False))


@SETTINGS
@given(data=st.data(), case=tables(), in_stream=st.booleans())
def test_inserts_inside_and_outside_streams(data: st.DataObject, case: Case, in_stream: bool) -> None:
    rows = data.draw(st.lists(row_values(case), min_size=1, max_size=5))
    payloads = [message(b"I", case.table.oid, [(b"N", row)], XID if in_stream else None) for row in rows]
    plan = native_plan(case, "json", OPTIONS[0])
    reference = reference_serializer("json", OPTIONS[0])
    got = outcome(lambda: native_changes(plan, payloads, in_stream))
    assert got == outcome(lambda: reference_changes(reference, case.table, payloads, in_stream))


# --- corrupted and truncated bytes -------------------------------------------------------------


def _corrupt(data: st.DataObject, buffer: bytes) -> bytes:
    how = data.draw(st.sampled_from(["truncate", "flip", "insert", "garbage"]))
    if how == "garbage" or not buffer:
        return data.draw(st.binary(max_size=40))
    at = data.draw(st.integers(0, len(buffer) - 1))
    if how == "truncate":
        return buffer[:at]
    if how == "flip":
        return buffer[:at] + bytes([data.draw(st.integers(0, 255))]) + buffer[at + 1 :]
    return buffer[:at] + data.draw(st.binary(min_size=1, max_size=4)) + buffer[at:]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), case=tables(), output_format=st.sampled_from(["avro", "json"]))
def test_corrupted_pgoutput_raises_the_reference_error_never_crashes(
    data: st.DataObject, case: Case, output_format: str
) -> None:
    payload = _corrupt(data, data.draw(change(case)))
    plan = native_plan(case, output_format, OPTIONS[0])
    reference = reference_serializer(output_format, OPTIONS[0])
    got = outcome(lambda: native_changes(plan, [payload]))
    expected = outcome(lambda: reference_changes(reference, case.table, [payload], in_stream=False))
    if got[0] == "error" and "this plan encodes" in got[2]:
        # A corrupted relation OID: the plan refuses another relation's message (the reference's
        # own assembler would raise for an unknown relation, or encode another table).
        assert got[1] is ValueError
        return
    assert got == expected


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), case=tables(), output_format=st.sampled_from(["avro", "json"]))
def test_corrupted_copy_raises_the_reference_error_never_crashes(
    data: st.DataObject, case: Case, output_format: str
) -> None:
    buffer = _corrupt(
        data, b"".join(copy_line(r) for r in data.draw(st.lists(row_values(case), min_size=1, max_size=3)))
    )
    plan = native_plan(case, output_format, OPTIONS[0])
    reference = reference_serializer(output_format, OPTIONS[0])
    got = outcome(lambda: native_lines(plan, buffer))
    assert got == outcome(lambda: reference_lines(reference, case.table, buffer))


# --- examples the type table names ---------------------------------------------------------------


def _one_column(type_oid: int, typmod: int = -1) -> Case:
    table = TableSchema(
        1,
        "public",
        "t",
        (Column("id", PgType.INT4, -1, True), Column("v", type_oid, typmod)),
        key_columns=("id",),
    )
    return Case(table, ())


@pytest.mark.parametrize("output_format", ["avro", "json"])
@pytest.mark.parametrize(
    ("type_oid", "typmod", "text"),
    [
        (PgType.NUMERIC, numeric_typmod(12, 2), "NaN"),
        (PgType.NUMERIC, numeric_typmod(3, 0), "1234"),
        (PgType.MONEY, -1, "1.234,56 €"),
        (PgType.BYTEA, -1, "\\000"),
        (1007, -1, "[0:1]={1,2}"),
        (1007, -1, "{{1,2},{3,4}}"),
        (PgType.DATE, -1, "01/02/2024"),
        (PgType.TIMESTAMP, -1, "294277-01-01 00:00:00"),
        (PgType.INTERVAL, -1, "@ 1 hour"),
        (PgType.BOOL, -1, "true"),
    ],
)
def test_data_errors_are_the_references(output_format: str, type_oid: int, typmod: int, text: str) -> None:
    case = _one_column(type_oid, typmod)
    line = copy_line(("1", text))
    plan = native_plan(case, output_format, OPTIONS[0])
    reference = reference_serializer(output_format, OPTIONS[0])
    expected = reference_copy(reference, case.table, line)
    # Each example is a data error in Avro; some are plain values in JSON (numeric NaN is "NaN").
    assert expected[0] == "error" or output_format == "json"
    assert outcome(lambda: plan.encode_copy(line)) == (
        expected if expected[0] == "error" else ("ok", [expected[1]])
    )
    payload = message(b"I", 1, [(b"N", ("1", text))])
    changes = reference_changes(reference, case.table, [payload], in_stream=False)
    assert native_changes(plan, [payload]) == changes
    if expected[0] == "error":
        assert outcome(lambda: plan.encode_changes([payload], xid=XID, commit_lsn=LSN)) == expected


def test_null_key_and_assembly_errors() -> None:
    case = _one_column(PgType.TEXT)
    plan = native_plan(case, "avro", OPTIONS[0])
    reference = reference_serializer("avro", OPTIONS[0])
    expected = reference_copy(reference, case.table, b"\\N\tx")
    assert expected[0] == "error" and "a key column is NULL" in expected[2]
    assert outcome(lambda: plan.encode_copy(b"\\N\tx\n")) == expected
    # A key left out as unchanged TOAST: the assembler's error, with the transaction's xid.
    payload = message(b"U", 1, [(b"N", (TOAST, "x"))])
    got = outcome(lambda: plan.encode_changes([payload], xid=XID, commit_lsn=LSN))
    assert got == outcome(lambda: reference_changes(reference, case.table, [payload], False))
    assert got[0] == "error" and f"xid {XID}" in got[2]


def test_batches_resume_after_a_declined_row_and_release_the_gil_when_large() -> None:
    case = _one_column(PgType.NUMERIC, numeric_typmod(12, 2))
    lines = [copy_line((str(i), "NaN" if i % 1000 == 7 else f"{i}.50")) for i in range(20_000)]
    plan = native_plan(case, "avro", OPTIONS[0])
    reference = reference_serializer("avro", OPTIONS[0])
    got = plan.encode_copy(b"".join(lines), errors="return")
    assert len(got) == 20_000
    assert sum(isinstance(item, Exception) for item in got) == 20
    assert [as_outcome(g) for g in got] == reference_lines(reference, case.table, b"".join(lines))


def test_unsupported_columns_stay_on_the_python_path() -> None:
    table = TableSchema(1, "public", "t", (Column("v", 90_100, -1),), key_columns=())
    infos = {
        90_100: TYPE_INFOS[90_001].__class__(90_100, "public", "d", "d", base_oid=1007, base_typmod=-1),
        90_101: TYPE_INFOS[90_001].__class__(90_101, "public", "_d", "b", element_oid=90_100),
    }
    assert native.compile_native_plan(table, infos, output_format="json") is not None  # domain over int4[]
    nested = TableSchema(1, "public", "t", (Column("v", 90_101, -1),), key_columns=())
    assert native.compile_native_plan(nested, infos, output_format="json") is None  # arrays of it
    with pytest.raises(native.UnsupportedColumn, match="arrays"):
        native.native_column_kinds(nested, infos)


CANONICAL: list[tuple[int, int, st.SearchStrategy[str]]] = [
    (PgType.BOOL, -1, st.sampled_from(["t", "f"])),
    (PgType.INT8, -1, st.integers(-(2**63), 2**63 - 1).map(str)),
    (PgType.FLOAT4, -1, st.floats(width=32).map(cases.float_text)),
    (PgType.FLOAT8, -1, st.floats().map(cases.float_text)),
    (
        PgType.NUMERIC,
        numeric_typmod(12, 2),
        st.integers(-(10**12) + 1, 10**12 - 1).map(lambda u: cases.decimal_text(u, 2)),
    ),
    (PgType.NUMERIC, numeric_typmod(40, 0), st.integers(-(10**40) + 1, 10**40 - 1).map(str)),
    (PgType.NUMERIC, numeric_typmod(3, -2), st.integers(-999, 999).map(lambda u: str(u * 100))),
    (PgType.NUMERIC, -1, st.decimals(allow_nan=False, allow_infinity=False).map(lambda d: f"{d:f}")),
    (PgType.MONEY, -1, st.integers(-(2**63), 2**63 - 1).map(cases.money_text)),
    (PgType.TEXT, -1, cases.unicode_text()),
    (PgType.BYTEA, -1, st.binary(max_size=20).map(lambda b: "\\x" + b.hex())),
    (PgType.UUID, -1, st.uuids().map(str)),
    (PgType.JSONB, -1, st.dictionaries(cases.unicode_text(), st.integers(), max_size=3).map(json.dumps)),
    (PgType.DATE, -1, cases.DAYS.map(cases.date_text)),
    (PgType.TIMESTAMP, -1, cases.timestamp_text(False)),
    (PgType.TIMESTAMPTZ, -1, cases.timestamp_text(True)),
    (PgType.TIME, -1, cases.CLOCKS),
    (PgType.INTERVAL, -1, cases.interval_text()),
    (
        cases.HSTORE,
        -1,
        st.dictionaries(cases.unicode_text(), st.none() | cases.unicode_text(), max_size=4).map(
            cases.hstore_text
        ),
    ),
    (1009, -1, st.lists(st.none() | cases.unicode_text(), max_size=5).map(cases.array_text)),
    (
        1231,
        numeric_typmod(10, 2),
        st.lists(st.integers(-999, 999).map(lambda u: cases.decimal_text(u, 2)), max_size=3).map(
            cases.array_text
        ),
    ),
]


@SETTINGS
@given(data=st.data(), output_format=st.sampled_from(["avro", "json"]))
def test_canonical_text_is_never_declined(data: st.DataObject, output_format: str) -> None:
    """The native path really encodes Postgres's own output: no row goes to the reference."""
    chosen = data.draw(st.lists(st.sampled_from(CANONICAL), min_size=1, max_size=5))
    columns = tuple(Column(f"c{i}", oid, typmod) for i, (oid, typmod, _) in enumerate(chosen))
    table = TableSchema(
        1, "public", "t", (Column("id", PgType.INT4, -1, True), *columns), key_columns=("id",)
    )
    rows = data.draw(
        st.lists(
            st.tuples(st.integers(0, 9).map(str), *(st.none() | s for _, _, s in chosen)),
            min_size=1,
            max_size=5,
        )
    )
    plan = native_plan(Case(table, ()), output_format, OPTIONS[0])
    buffer = b"".join(copy_line(row) for row in rows)
    reference = reference_serializer(output_format, OPTIONS[0])
    assert native_lines(plan, buffer) == reference_lines(reference, table, buffer)
    payloads = [message(b"I", 1, [(b"N", row)]) for row in rows]
    assert native_changes(plan, payloads) == reference_changes(reference, table, payloads, in_stream=False)
    assert plan.declined == 0


def test_codec_description_names_the_codec() -> None:
    assert native.codec_description().startswith("native (Rust) codec ")
