"""Native (Rust) vs Python row codec on one core, excluding Kafka's produce().

The rows are the 7-column `orders` of bench/snapshot_bench.py (bigint key, int, text, numeric(12,2),
timestamptz, boolean, a text that is NULL every fifth row), encoded in Avro (Confluent framing) and
JSON from the two inputs the worker reads:

- `copy`: COPY TEXT lines (the snapshot), in chunks of 1000 lines. Python: `parse_copy_text_line`
  + `ChangeEvent` + the serializer per row, as the snapshot's ChunkReader does. Native:
  `NativePlan.encode_copy` per chunk.
- `insert`: pgoutput Insert payloads (the stream), batches of 1000. Python: the stream loop's fused
  Insert path (`FastInsertPath`), its fastest. Native: `NativePlan.encode_changes` per batch.

Rows/s are CPU time (process_time) of the best of REPEATS runs, so they are per core. Run:
`.venv/bin/python bench/native_codec_bench.py [--rows 200000]`. Instructions per row, which do not
move with machine load: `.venv/bin/python bench/native_codec_bench.py --callgrind` runs every stage
under `valgrind --tool=callgrind` twice (N rows and 0 rows) and divides the difference by N.
Ends with one `RESULT name=value ...` line.
"""

from __future__ import annotations

import argparse
import gc
import os
import re
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cdc_worker.core.changes.assembler import ChangeAssembler
from cdc_worker.core.changes.fast_insert import FastInsertPath
from cdc_worker.core.encoding import native
from cdc_worker.core.encoding.avro_serializer import AvroEventSerializer
from cdc_worker.core.encoding.json_serializer import JsonEventSerializer
from cdc_worker.core.model import ChangeEvent, Column, Op, TableSchema
from cdc_worker.core.pgoutput.decoder import PgOutputDecoder
from cdc_worker.core.pgtypes.copy_text import parse_copy_text_line
from cdc_worker.core.pgtypes.oids import VARHDRSZ, PgType

RELATION_OID = 16_384
XID, COMMIT_LSN = 771, 0x16_B374_D848
CHUNK = 1000
REPEATS = 3
KEY_ID, VALUE_ID = 1, 2
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
COLUMNS = (
    ("id", PgType.INT8, -1),
    ("customer_id", PgType.INT4, -1),
    ("status", PgType.TEXT, -1),
    ("amount", PgType.NUMERIC, ((12 << 16) | 2) + VARHDRSZ),
    ("created_at", PgType.TIMESTAMPTZ, -1),
    ("shipped", PgType.BOOL, -1),
    ("note", PgType.TEXT, -1),
)
STAGES = [
    f"{codec}_{source}_{fmt}"
    for source in ("copy", "insert")
    for fmt in ("avro", "json")
    for codec in ("python", "native")
]


class FixedIds:
    def register_schema(self, subject_name: str, schema: object, normalize_schemas: bool = False) -> int:
        return KEY_ID if subject_name.endswith("-key") else VALUE_ID


def orders_row(g: int) -> tuple[str | None, ...]:
    """snapshot_bench's FILL, row g, as Postgres prints it."""
    created = datetime(2024, 1, 1, tzinfo=UTC).timestamp() + g
    stamp = datetime.fromtimestamp(created, UTC).strftime("%Y-%m-%d %H:%M:%S") + "+00"
    amount = g % 100_000
    return (
        str(g), str(g % 10_007), ("new", "paid", "shipped")[g % 3], f"{amount // 100}.{amount % 100:02d}",
        stamp, "t" if g % 2 == 0 else "f", None if g % 5 == 0 else f"note {g}",
    )  # fmt: skip


def copy_line(row: tuple[str | None, ...]) -> bytes:
    return "\t".join("\\N" if v is None else v for v in row).encode() + b"\n"


def insert_payload(row: tuple[str | None, ...]) -> bytes:
    out = bytearray(b"I" + struct.pack(">IBH", RELATION_OID, ord("N"), len(row)))
    for value in row:
        if value is None:
            out += b"n"
        else:
            data = value.encode()
            out += b"t" + struct.pack(">I", len(data)) + data
    return bytes(out)


def relation_payload() -> bytes:
    out = bytearray(
        b"R" + struct.pack(">I", RELATION_OID) + b"public\x00orders\x00d" + struct.pack(">H", len(COLUMNS))
    )
    for index, (name, oid, typmod) in enumerate(COLUMNS):
        out += bytes([1 if index == 0 else 0]) + name.encode() + b"\x00" + struct.pack(">Ii", oid, typmod)
    return bytes(out)


def begin_payload() -> bytes:
    return b"B" + struct.pack(">QqI", COMMIT_LSN, 0, XID)


def table() -> TableSchema:
    columns = tuple(Column(name, oid, typmod, name == "id") for name, oid, typmod in COLUMNS)
    return TableSchema(RELATION_OID, "public", "orders", columns, key_columns=("id",))


def serializer(fmt: str) -> AvroEventSerializer | JsonEventSerializer:
    return AvroEventSerializer(FixedIds(), {}) if fmt == "avro" else JsonEventSerializer({})


def stage(name: str, rows: int) -> Callable[[], object]:
    """The work of one stage over `rows` rows, set up (compiled, warmed) outside the timing."""
    codec, source, fmt = name.split("_")
    data = [orders_row(g) for g in range(1, rows + 1)]
    schema = table()
    encode = serializer(fmt)
    if source == "copy":
        chunks = [b"".join(copy_line(r) for r in data[i : i + CHUNK]) for i in range(0, rows, CHUNK)]
        if codec == "native":
            plan = native.native_plan_for(encode, schema)
            assert plan is not None, native.codec_description()
            return lambda: [plan.encode_copy(chunk) for chunk in chunks]
        keys = schema.key_indexes

        def python_copy() -> None:
            for chunk in chunks:
                for line in chunk.split(b"\n")[:-1]:
                    row = parse_copy_text_line(line)
                    key = tuple(row[i] for i in keys)
                    encode(ChangeEvent(Op.READ, schema, key, row, (), COMMIT_LSN, 0, 0, EPOCH))

        return python_copy
    payloads = [insert_payload(r) for r in data]
    if codec == "native":
        plan = native.native_plan_for(encode, schema)
        assert plan is not None, native.codec_description()
        batches = [payloads[i : i + CHUNK] for i in range(0, rows, CHUNK)]
        return lambda: [plan.encode_changes(b, xid=XID, commit_lsn=COMMIT_LSN) for b in batches]

    def python_insert() -> None:
        decoder = PgOutputDecoder()
        assembler = ChangeAssembler(key_columns_for=lambda raw: ("id",))
        for message in (relation_payload(), begin_payload()):
            tuple(assembler.feed(decoder.decode(message)))
        fast = FastInsertPath(decoder, assembler, encode)
        for payload in payloads:
            if fast(payload) is None:
                raise AssertionError("the fused path declined an orders Insert")

    return python_insert


def cpu_rate(name: str, rows: int) -> float:
    best = float("inf")
    for _ in range(REPEATS):
        work = stage(name, rows)
        work()  # warm: compiled plans, caches
        gc.collect()
        gc.disable()
        started = time.process_time()
        work()
        best = min(best, time.process_time() - started)
        gc.enable()
    return rows / best


def callgrind_instructions(name: str, rows: int) -> float:
    """Instructions per row of `name`: callgrind's total for a run that sets the stage up and runs
    it once, minus that of a run that only sets it up (same rows), divided by the rows."""

    def total(mode: str) -> int:
        with tempfile.TemporaryDirectory() as scratch:
            out = Path(scratch) / "callgrind.out"
            command = [sys.executable, __file__, mode, name, "--rows", str(rows)]
            result = subprocess.run(
                ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", *command],
                capture_output=True, text=True, check=True,
            )  # fmt: skip
            match = re.search(r"Collected : (\d+)", result.stderr)
            if match is None:
                raise RuntimeError(f"no instruction count from callgrind: {result.stderr[-500:]}")
            return int(match.group(1))

    return (total("--run-stage") - total("--set-up-stage")) / rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--callgrind", action="store_true", help="also count instructions per row")
    # For callgrind: one stage set up and run once, or only set up.
    parser.add_argument("--run-stage", help=argparse.SUPPRESS)
    parser.add_argument("--set-up-stage", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run_stage:
        stage(args.run_stage, args.rows)()
        return
    if args.set_up_stage:
        stage(args.set_up_stage, args.rows)
        return
    if not native.NATIVE_AVAILABLE:
        sys.exit(f"native_codec_bench: {native.codec_description()}")
    load = os.getloadavg()[0]
    print(f"native_codec_bench: {args.rows:,} orders rows, {native.codec_description()}, one core, "
          f"load average {load:.2f} on {os.cpu_count()} CPUs, Kafka produce excluded")  # fmt: skip
    rates = {name: cpu_rate(name, args.rows) for name in STAGES}
    instructions: dict[str, float] = {}
    if args.callgrind:
        callgrind_rows = min(args.rows, 10_000)
        instructions = {name: callgrind_instructions(name, callgrind_rows) for name in STAGES}
    print(f"{'stage':24s} {'rows/s':>12s} {'us/row':>8s} {'instr/row':>10s}")
    for name in STAGES:
        per_row = f"{instructions[name]:10,.0f}" if name in instructions else f"{'-':>10s}"
        print(f"{name:24s} {rates[name]:12,.0f} {1e6 / rates[name]:8.3f} {per_row}")
    fields = {f"{name}_rows_per_s": f"{rate:.0f}" for name, rate in rates.items()}
    for source in ("copy", "insert"):
        for fmt in ("avro", "json"):
            speedup = rates[f"native_{source}_{fmt}"] / rates[f"python_{source}_{fmt}"]
            fields[f"speedup_{source}_{fmt}"] = f"{speedup:.1f}"
    fields |= {f"{name}_instructions_per_row": f"{count:.0f}" for name, count in instructions.items()}
    fields["load"] = f"{load:.2f}"
    print("RESULT " + " ".join(f"{k}={v}" for k, v in fields.items()))


if __name__ == "__main__":
    main()
