"""Core throughput on one core: pgoutput Insert bytes -> decode -> convert -> encode (Avro, JSON).

The row is a realistic ten-column order (int8 key, int4, text, varchar, numeric(12,2), two
timestamptz, jsonb, bool and an always-NULL text). Every figure is printed next to baselines
measured in the same run, as ratios, because absolute rows/s depend on the machine:

- `copy`: copying each message's bytes (the floor of any per-message work),
- `fastavro`: fastavro's generic `schemaless_writer` on the already converted row,
- `json.dumps`: the stdlib's C encoder on a dict of the already converted values.

The "fused" stages run the stream loop's fast path for Inserts (`cdc_worker.core.changes.fast_insert`), which
takes pgoutput bytes to the Kafka message in one step and leaves every other message to the general
path (decode -> assemble -> serialize), as the "decode + assemble + ..." stages run it.

It prints figures and asserts nothing. Run: `.venv/bin/python bench/core_bench.py [rows]`. On a
shared machine, compare ratios and note the load average it prints: CPU time still stretches when
other processes compete for the same cores and caches.
"""

from __future__ import annotations

import gc
import io
import json
import os
import re
import struct
import sys
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

import fastavro
from confluent_kafka.schema_registry import SchemaRegistryClient

from cdc_worker.core.changes.assembler import ChangeAssembler
from cdc_worker.core.changes.fast_insert import FastInsertPath
from cdc_worker.core.encoding import avro_schema
from cdc_worker.core.encoding.avro_serializer import AvroEventSerializer
from cdc_worker.core.encoding.avro_writer import compile_record_writer
from cdc_worker.core.encoding.json_serializer import JsonEventSerializer
from cdc_worker.core.model import ChangeEvent, Column, TableSchema
from cdc_worker.core.pgoutput.decoder import MessageType, PgOutputDecoder
from cdc_worker.core.pgtypes.mapping import table_column_types
from cdc_worker.core.pgtypes.oids import VARHDRSZ, PgType

Serializer = AvroEventSerializer | JsonEventSerializer
DEFAULT_ROWS = 20_000
BASELINES = {
    "copy": "copy (each Insert message's bytes)",
    "fastavro": "fastavro (schemaless_writer, converted values)",
    "json.dumps": "json.dumps (dict of converted values)",
}
REPEATS = 5  # best of: the least disturbed run on a shared machine
RELATION_OID = 16_384
COMMIT_LSN = 0x16_B374_D848
XID = 771
POSTGRES_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
NUMERIC_12_2 = ((12 << 16) | 2) + VARHDRSZ
VARCHAR_200 = 200 + VARHDRSZ
KEY_FLAG = 1
COLUMNS = (
    ("id", PgType.INT8, -1, KEY_FLAG),
    ("customer_id", PgType.INT4, -1, 0),
    ("name", PgType.TEXT, -1, 0),
    ("email", PgType.VARCHAR, VARCHAR_200, 0),
    ("amount", PgType.NUMERIC, NUMERIC_12_2, 0),
    ("created_at", PgType.TIMESTAMPTZ, -1, 0),
    ("updated_at", PgType.TIMESTAMPTZ, -1, 0),
    ("payload", PgType.JSONB, -1, 0),
    ("active", PgType.BOOL, -1, 0),
    ("note", PgType.TEXT, -1, 0),
)


def _cstring(text: str) -> bytes:
    return text.encode() + b"\x00"


def _column_value(value: str | None) -> bytes:
    if value is None:
        return b"n"
    raw = value.encode()
    return b"t" + struct.pack(">I", len(raw)) + raw


def _micros_since_2000(moment: datetime) -> int:
    return (moment - POSTGRES_EPOCH) // timedelta(microseconds=1)


def relation_message() -> bytes:
    """pgoutput protocol 1 Relation message for the bench table, built from the protocol docs."""
    columns = b"".join(
        struct.pack(">B", flags) + _cstring(name) + struct.pack(">Ii", oid, typmod)
        for name, oid, typmod, flags in COLUMNS
    )
    header = bytes([MessageType.RELATION]) + struct.pack(">I", RELATION_OID)
    return header + _cstring("public") + _cstring("orders") + b"d" + struct.pack(">H", len(COLUMNS)) + columns


def row_values(index: int) -> tuple[str | None, ...]:
    """A varied row, as Postgres's output functions (session TimeZone UTC) would write it."""
    created = datetime(2024, 1, 1, tzinfo=UTC) + timedelta(
        seconds=index * 37, microseconds=index * 7919 % 10**6
    )
    updated = created + timedelta(minutes=index % 90)
    payload = json.dumps(
        {"sku": f"SKU-{index % 977:05d}", "qty": index % 7 + 1, "tags": ["a", "b"][: index % 3]}
    )
    return (
        str(1_000_000 + index),
        str(index % 50_000),
        f"Customer {index} Ünïcødé",
        f"customer{index}@example.com",
        f"{(index * 7919) % 1_000_000 / 100:.2f}",
        created.strftime("%Y-%m-%d %H:%M:%S.%f+00"),
        updated.strftime("%Y-%m-%d %H:%M:%S.%f+00"),
        payload,
        "t" if index % 2 else "f",
        None,
    )


def insert_message(values: tuple[str | None, ...]) -> bytes:
    tuple_data = struct.pack(">H", len(values)) + b"".join(_column_value(v) for v in values)
    return bytes([MessageType.INSERT]) + struct.pack(">I", RELATION_OID) + b"N" + tuple_data


def begin_message() -> bytes:
    commit_ts = _micros_since_2000(datetime(2024, 5, 1, 12, tzinfo=UTC))
    return bytes([MessageType.BEGIN]) + struct.pack(">QqI", COMMIT_LSN, commit_ts, XID)


Work = Callable[[], object]
# Prepares one timed run, untimed: the stream's Relation and Begin, whose one-off cost (compiling
# the relation version's plan, registering its schemas) is paid once per stream, not per row.
Setup = Callable[[], Work]


def best_rate(rows: int, setup: Setup) -> float:
    """Rows per CPU-second of the fastest of REPEATS runs. Process time, so that the shared
    machine's other load does not count; the garbage collector stays on, as in the worker."""
    best = float("inf")
    for _ in range(REPEATS):
        run = setup()
        gc.collect()
        start = time.process_time()
        run()
        best = min(best, time.process_time() - start)
    return rows / best


def _started_stream(serializer: Serializer | None) -> tuple[PgOutputDecoder, ChangeAssembler]:
    decoder, assembler = PgOutputDecoder(), ChangeAssembler()
    for message in (relation_message(), begin_message()):
        tuple(assembler.feed(decoder.decode(message)))
    if serializer is not None:
        serializer.topic_for(assembler.schema(RELATION_OID))  # compiles the new version's plan
    return decoder, assembler


def pipeline(messages: list[bytes], serialize: Serializer | None) -> Setup:
    """Decode + assemble (+ serialize) every message, as the worker's stream loop does."""

    def setup() -> Work:
        decoder, assembler = _started_stream(serialize)
        feed, decode = assembler.feed, decoder.decode

        def run() -> None:
            for data in messages:
                events: Iterable[Any] = feed(decode(data))
                if serialize is not None:
                    for event in events:
                        serialize(event)

        return run

    return setup


def fused_pipeline(messages: list[bytes], serialize: Serializer) -> Setup:
    """The stream loop with the fused Insert path first and the general path for what it declines."""

    def setup() -> Work:
        decoder, assembler = _started_stream(serialize)
        fast = FastInsertPath(decoder, assembler, serialize)
        feed, decode = assembler.feed, decoder.decode

        def run() -> None:
            for data in messages:
                if fast(data) is None:
                    for event in feed(decode(data)):
                        serialize(event)  # type: ignore[arg-type]

        return run

    return setup


def bench_table() -> TableSchema:
    columns = tuple(Column(name, oid, typmod, bool(flags)) for name, oid, typmod, flags in COLUMNS)
    return TableSchema(RELATION_OID, "public", "orders", columns, key_columns=("id",))


def assembled_events(messages: list[bytes]) -> list[ChangeEvent]:
    decoder, assembler = PgOutputDecoder(), ChangeAssembler()
    stream = [relation_message(), begin_message(), *messages]
    return [e for data in stream for e in assembler.feed(decoder.decode(data)) if isinstance(e, ChangeEvent)]


def report(rows: int, size: float, baselines: dict[str, float], stages: dict[str, tuple[float, str]]) -> None:
    load = os.getloadavg()[0]
    print(
        f"core_bench: {rows} rows of {len(COLUMNS)} columns, {size:.0f} bytes per Insert message, one core "
        f"(load average {load:.1f} on {os.cpu_count()} CPUs)"
    )
    print(f"{'baseline':52s} {'rows/s':>10s} {'us/row':>7s}")
    for name, rate in baselines.items():
        print(f"{BASELINES[name]:52s} {rate:10,.0f} {1e6 / rate:7.2f}")
    print(f"{'stage':52s} {'rows/s':>10s} {'us/row':>7s} {'/copy':>7s}  ratio to its baseline")
    for name, (rate, baseline) in stages.items():
        ratio, per_copy = rate / baselines[baseline], rate / baselines["copy"]
        print(f"{name:52s} {rate:10,.0f} {1e6 / rate:7.2f} {per_copy:7.3f}  {ratio:5.2f} x {baseline}")
    figures = [f"{_slug(name)}_rows_s={rate:.0f}" for name, rate in baselines.items()]
    for name, (rate, baseline) in stages.items():
        figures += [
            f"{_slug(name)}_rows_s={rate:.0f}",
            f"{_slug(name)}_vs_{_slug(baseline)}={rate / baselines[baseline]:.3f}",
        ]
    print(f"RESULT bench=core rows={rows} {' '.join(figures)} load1={load:.2f}")


def _slug(name: str) -> str:
    """A stage's name as a RESULT key: its words before any parenthesis, joined by `_`."""
    return "_".join(re.findall(r"[a-z0-9]+", name.split("(", maxsplit=1)[0].lower()))


def main(rows: int) -> None:
    rows_text = [row_values(i) for i in range(rows)]
    messages = [insert_message(values) for values in rows_text]
    table = bench_table()
    column_types = table_column_types(table, {})
    value_schema = avro_schema.value_schema(table, column_types)
    schema = fastavro.parse_schema(value_schema)
    names = [f["name"] for f in value_schema["fields"]]
    converted_rows = [
        [None if v is None else t.avro_value(v) for t, v in zip(column_types, values, strict=True)]
        for values in rows_text
    ]
    converted = [dict(zip(names, values, strict=True)) for values in converted_rows]
    json_ready = [
        {
            n: None if v is None else json.loads(t.json_text(v))
            for n, t, v in zip(names, column_types, row, strict=True)
        }
        for row in rows_text
    ]
    compiled_writer = compile_record_writer(value_schema)
    events = assembled_events(messages)
    avro = AvroEventSerializer(SchemaRegistryClient.new_client({"url": "mock://core-bench"}), {})
    json_serializer = JsonEventSerializer({})

    def copy_bytes() -> None:
        for data in messages:
            bytes(bytearray(data))

    def fastavro_generic() -> None:
        for record in converted:
            out = io.BytesIO()
            fastavro.schemaless_writer(out, schema, record)
            out.getvalue()

    def json_dumps() -> None:
        for record in json_ready:
            json.dumps(record, ensure_ascii=False).encode()

    def each(function: Callable[[Any], object], items: list[Any]) -> Setup:
        return lambda: lambda: [function(item) for item in items]

    baselines = {
        "copy": best_rate(rows, lambda: copy_bytes),
        "fastavro": best_rate(rows, lambda: fastavro_generic),
        "json.dumps": best_rate(rows, lambda: json_dumps),
    }
    runs: list[tuple[str, str, Setup]] = [
        (
            "Avro encode only (compiled writer, converted values)",
            "fastavro",
            each(compiled_writer, converted_rows),
        ),
        ("Avro convert + encode (serializer, assembled events)", "fastavro", each(avro, events)),
        ("JSON convert + encode (serializer, assembled events)", "json.dumps", each(json_serializer, events)),
        ("decode + assemble (pgoutput bytes -> ChangeEvent)", "copy", pipeline(messages, None)),
        ("decode + assemble + convert + encode Avro", "fastavro", pipeline(messages, avro)),
        ("decode + assemble + convert + encode JSON", "json.dumps", pipeline(messages, json_serializer)),
        ("fused Insert path Avro (bytes -> message)", "fastavro", fused_pipeline(messages, avro)),
        (
            "fused Insert path JSON (bytes -> message)",
            "json.dumps",
            fused_pipeline(messages, json_serializer),
        ),
    ]
    stages = {name: (best_rate(rows, setup), baseline) for name, baseline, setup in runs}
    report(rows, sum(len(m) for m in messages) / rows, baselines, stages)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_ROWS)
