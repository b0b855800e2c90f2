"""Hypothesis strategies for the native codec's tests: Postgres text output per type family (as the
walsender and COPY write it under the worker's session settings), with a share of non-canonical
and invalid texts that the reference refuses or treats specially, and the byte formats (COPY TEXT
lines, pgoutput tuples) around them."""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass

from hypothesis import strategies as st

from cdc_worker.core.model import Column, TableSchema, TypeInfo
from cdc_worker.core.pgtypes.oids import VARHDRSZ, PgArrayType, PgType
from cdc_worker.core.pgtypes.temporal import civil_from_days

Value = str | None
# Non-builtin types, as the shell loads them from pg_type.
MOOD, MOOD_ARRAY, PRICE, PRICE_ARRAY, HSTORE, CITEXT = 90_001, 90_002, 90_003, 90_004, 90_005, 90_006
TYPE_INFOS = {
    MOOD: TypeInfo(MOOD, "public", "mood", "e"),
    MOOD_ARRAY: TypeInfo(MOOD_ARRAY, "public", "_mood", "b", element_oid=MOOD),
    PRICE: TypeInfo(PRICE, "public", "price", "d", base_oid=PgType.NUMERIC, base_typmod=((8 << 16) | 2) + 4),
    PRICE_ARRAY: TypeInfo(PRICE_ARRAY, "public", "_price", "b", element_oid=PRICE),
    HSTORE: TypeInfo(HSTORE, "public", "hstore", "b"),
    CITEXT: TypeInfo(CITEXT, "public", "citext", "b"),
}

# Texts every family meets now and then: the reference refuses most, takes some its own way.
ODD = st.sampled_from(
    [
        "",
        " ",
        "abc",
        "NaN",
        "Infinity",
        "-Infinity",
        "1_000",
        " 1",
        "+1",
        "1.",
        ".5",
        "1e5",
        "٣",
        "t ",
        "\\x0",
        "{",
        "}",
    ]
)


def numeric_typmod(precision: int, scale: int) -> int:
    return ((precision << 16) | (scale & 0x7FF)) + VARHDRSZ


def unicode_text() -> st.SearchStrategy[str]:
    return st.text(st.characters(exclude_characters="\x00", codec="utf-8"), max_size=12)


def decimal_text(unscaled: int, scale: int) -> str:
    """numeric's output of `unscaled * 10**-scale` with exactly `scale` fraction digits."""
    if scale <= 0:
        return str(unscaled * 10**-scale)
    sign, digits = ("-" if unscaled < 0 else ""), str(abs(unscaled)).rjust(scale + 1, "0")
    return f"{sign}{digits[:-scale]}.{digits[-scale:]}"


@st.composite
def numeric_column(draw: st.DrawFn) -> tuple[int, int, st.SearchStrategy[str]]:
    precision = draw(st.integers(1, 45))
    scale = draw(st.integers(-4, precision + 3))
    digits = max(precision - max(scale, 0), 0) + max(scale, 0)  # digits a fitting value may have
    fitting = st.integers(-(10 ** min(digits, precision)) + 1, 10 ** min(digits, precision) - 1)
    canonical = fitting.map(lambda u: decimal_text(u, scale) if scale >= 0 else str(u * 10**-scale))
    too_wide = st.integers(10**precision, 10 ** (precision + 3)).map(lambda u: decimal_text(u, max(scale, 0)))
    return PgType.NUMERIC, numeric_typmod(precision, scale), canonical | too_wide


def date_text(days: int) -> str:
    year, month, day = civil_from_days(days)
    if year <= 0:
        return f"{1 - year:04d}-{month:02d}-{day:02d} BC"
    return f"{year:04d}-{month:02d}-{day:02d}"


DAYS = st.integers(-2_500_000, 2_900_000) | st.integers(-800_000, 3_000_000)
DATES = DAYS.map(date_text) | st.sampled_from(["infinity", "-infinity", "2023-02-29", "2024-13-01"])
FRACTIONS = st.integers(0, 999_999).map(lambda f: f".{f:06d}".rstrip("0").rstrip("."))
CLOCKS = st.builds(
    lambda h, m, s, f: f"{h:02d}:{m:02d}:{s:02d}{f}",
    st.integers(0, 23),
    st.integers(0, 59),
    st.integers(0, 59),
    FRACTIONS,
) | st.just("24:00:00")
OFFSETS = st.sampled_from(["+00", "+05:30", "-04:53:28", "+14", "-12", "+00:00:01"])


@st.composite
def timestamp_text(draw: st.DrawFn, zoned: bool) -> str:
    if draw(st.integers(0, 20)) == 0:
        return draw(st.sampled_from(["infinity", "-infinity"]))
    date = date_text(draw(st.integers(-100_000_000, 100_000_000) | st.integers(-800_000, 3_000_000)))
    date, bc = (date[:-3], " BC") if date.endswith(" BC") else (date, "")
    return f"{date} {draw(CLOCKS)}{draw(OFFSETS) if zoned else ''}{bc}"


@st.composite
def interval_text(draw: st.DrawFn) -> str:
    parts = []
    for unit in ("year", "mon", "day"):
        value = draw(st.none() | st.integers(-200_000, 200_000))
        if value is not None:
            parts.append(f"{value} {unit}{'' if abs(value) == 1 else 's'}")
    if draw(st.booleans()) or not parts:
        sign = draw(st.sampled_from(["", "-", "+"])) if parts else draw(st.sampled_from(["", "-"]))
        hours = draw(st.integers(0, 2_000_000))
        minutes, seconds = draw(st.integers(0, 59)), draw(st.integers(0, 59))
        parts.append(f"{sign}{hours:02d}:{minutes:02d}:{seconds:02d}{draw(FRACTIONS)}")
    return " ".join(parts)


def float_text(value: float) -> str:
    text = repr(value)
    return {"inf": "Infinity", "-inf": "-Infinity", "nan": "NaN"}.get(text, text)


def array_item_text(item: str) -> str:
    """array_out's quoting of one item."""
    if item == "" or item.upper() == "NULL" or any(c in item for c in '{},"\\ \t\n\r\x0b\x0c;'):
        return '"' + item.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return item


def array_text(items: list[Value], delimiter: str = ",") -> str:
    return "{" + delimiter.join("NULL" if i is None else array_item_text(i) for i in items) + "}"


def _hstore_quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def hstore_text(pairs: dict[str, Value]) -> str:
    return ", ".join(
        f"{_hstore_quote(k)}=>{'NULL' if v is None else _hstore_quote(v)}" for k, v in pairs.items()
    )


def money_text(cents: int) -> str:
    sign, whole = ("-" if cents < 0 else ""), abs(cents) // 100
    return f"{sign}${whole:,}.{abs(cents) % 100:02d}"


INT4S = st.integers(-(2**31), 2**31 - 1).map(str)
# Every family: (type OID, typmod, strategy of canonical texts). The column strategy mixes in ODD.
SCALARS: list[tuple[int, int, st.SearchStrategy[str]]] = [
    (PgType.BOOL, -1, st.sampled_from(["t", "f"])),
    (PgType.INT2, -1, st.integers(-32768, 32767).map(str)),
    (PgType.INT4, -1, INT4S),
    (PgType.INT8, -1, st.integers(-(2**63), 2**63 - 1).map(str)),
    (PgType.OID, -1, st.integers(0, 2**32 - 1).map(str)),
    (
        PgType.FLOAT4,
        -1,
        st.floats(width=32).map(float_text) | st.sampled_from(["1.1", "1e+20", "3.4028235e+38"]),
    ),
    (
        PgType.FLOAT8,
        -1,
        st.floats().map(float_text) | st.sampled_from(["1e+100", "-1.2345679e-05", "1e+400"]),
    ),
    (
        PgType.NUMERIC,
        -1,
        st.decimals(allow_nan=True, allow_infinity=False).map(lambda d: f"{d:f}" if d.is_finite() else "NaN"),
    ),
    (PgType.MONEY, -1, st.integers(-(2**63), 2**63 - 1).map(money_text) | st.just("$1.234,56")),
    (PgType.TEXT, -1, unicode_text()),
    (PgType.VARCHAR, 20 + VARHDRSZ, unicode_text()),
    (PgType.BPCHAR, 5 + VARHDRSZ, unicode_text()),
    (PgType.NAME, -1, unicode_text()),
    (PgType.CHAR, -1, st.characters(exclude_characters="\x00", codec="utf-8")),
    (CITEXT, -1, unicode_text()),
    (MOOD, -1, st.sampled_from(["happy", "sad", "ünïcode"])),
    (PgType.BYTEA, -1, st.binary(max_size=20).map(lambda b: "\\x" + b.hex()) | st.just("\\000\\001")),
    (PgType.UUID, -1, st.uuids().map(str)),
    (
        PgType.JSON,
        -1,
        st.recursive(
            st.none() | st.booleans() | st.floats() | unicode_text(), lambda c: st.lists(c, max_size=3)
        ).map(json.dumps),
    ),
    (
        PgType.JSONB,
        -1,
        st.dictionaries(unicode_text(), st.integers() | unicode_text(), max_size=3).map(json.dumps),
    ),
    (PgType.DATE, -1, DATES),
    (PgType.TIMESTAMP, -1, timestamp_text(False)),
    (PgType.TIMESTAMPTZ, -1, timestamp_text(True)),
    (PgType.TIME, -1, CLOCKS),
    (PgType.TIMETZ, -1, st.builds(lambda c, o: c + o, CLOCKS, OFFSETS)),
    (PgType.INTERVAL, -1, interval_text()),
    (
        PRICE,
        -1,
        st.integers(-(10**8) + 1, 10**8 - 1).map(lambda u: decimal_text(u, 2)) | st.just("123456789.00"),
    ),
    (HSTORE, -1, st.dictionaries(unicode_text(), st.none() | unicode_text(), max_size=4).map(hstore_text)),
    (PgType.INET, -1, st.ip_addresses().map(str)),
    (PgType.INT4RANGE, -1, st.just("[1,10)")),
]
ARRAYS: list[tuple[int, int, st.SearchStrategy[str]]] = [
    (PgArrayType.INT4, -1, st.lists(st.none() | INT4S, max_size=5).map(array_text)),
    (PgArrayType.TEXT, -1, st.lists(st.none() | unicode_text(), max_size=5).map(array_text)),
    (
        PgArrayType.NUMERIC,
        numeric_typmod(10, 2),
        st.lists(
            st.none() | st.integers(-(10**10) + 1, 10**10 - 1).map(lambda u: decimal_text(u, 2)), max_size=4
        ).map(array_text),
    ),
    (PgArrayType.BOOL, -1, st.lists(st.none() | st.sampled_from(["t", "f"]), max_size=4).map(array_text)),
    (PgArrayType.DATE, -1, st.lists(st.none() | DATES, max_size=3).map(array_text)),
    (PgArrayType.TIMESTAMPTZ, -1, st.lists(st.none() | timestamp_text(True), max_size=3).map(array_text)),
    (PgArrayType.JSONB, -1, st.lists(st.none() | st.integers().map(str), max_size=3).map(array_text)),
    (
        PgArrayType.BYTEA,
        -1,
        st.lists(st.none() | st.binary(max_size=4).map(lambda b: "\\x" + b.hex()), max_size=3).map(
            array_text
        ),
    ),
    (
        PgArrayType.BOX,
        -1,
        st.lists(st.just("(3,4),(1,2)"), max_size=3).map(lambda items: array_text(list(items), ";")),
    ),
    (PgArrayType.FLOAT8, -1, st.lists(st.floats().map(float_text), max_size=3).map(array_text)),
    (PgArrayType.INTERVAL, -1, st.lists(interval_text(), max_size=2).map(array_text)),
    (MOOD_ARRAY, -1, st.lists(st.none() | st.sampled_from(["happy", "a b"]), max_size=3).map(array_text)),
    (
        PRICE_ARRAY,
        -1,
        st.lists(st.none() | st.integers(-999, 999).map(lambda u: decimal_text(u, 2)), max_size=3).map(
            array_text
        ),
    ),
    (PgArrayType.INT4, -1, st.sampled_from(["[0:1]={1,2}", "{{1,2},{3,4}}", '{"a",}', "{1,2"])),
]
FAMILIES = SCALARS + ARRAYS


@dataclass(frozen=True)
class Family:
    type_oid: int
    typmod: int
    values: st.SearchStrategy[Value]


@st.composite
def family(draw: st.DrawFn) -> Family:
    if draw(st.integers(0, 6)) == 0:
        type_oid, typmod, canonical = draw(numeric_column())
    else:
        type_oid, typmod, canonical = draw(st.sampled_from(FAMILIES))
    odd_share = st.integers(0, 15).flatmap(lambda n: ODD if n == 0 else canonical)
    return Family(type_oid, typmod, st.none() | odd_share | canonical)


@dataclass(frozen=True)
class Case:
    table: TableSchema
    families: tuple[Family, ...]


@st.composite
def tables(draw: st.DrawFn) -> Case:
    """A table: an int8 or text key (or none), then 1-6 columns of any family."""
    families = [Family(PgType.INT8, -1, st.integers(-(2**63), 2**63 - 1).map(str))]
    families.append(Family(PgType.TEXT, -1, unicode_text()))
    families += draw(st.lists(family(), min_size=1, max_size=6))
    keys = draw(st.sampled_from([("c0",), ("c1", "c0"), (), ("c2",)]))
    columns = tuple(
        Column(f"c{i}" if i != 1 else 'c1 "quoted"é', f.type_oid, f.typmod, f"c{i}" in keys)
        for i, f in enumerate(families)
    )
    keys = tuple(columns[1].name if k == "c1" else k for k in keys)
    return Case(
        TableSchema(
            16_384, "public", draw(st.sampled_from(["orders", "Ordërs.x"])), columns, key_columns=keys
        ),
        tuple(families),
    )


def row_values(case: Case) -> st.SearchStrategy[tuple[Value, ...]]:
    key_indexes = set(case.table.key_indexes)
    return st.tuples(
        *(
            # Key columns are rarely NULL (a data error of its own).
            (f.values.filter(lambda v: v is not None) | st.none()) if i in key_indexes else f.values
            for i, f in enumerate(case.families)
        )
    )


# --- COPY TEXT -------------------------------------------------------------------------------

_COPY_ESCAPES = {"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"}


def copy_line(values: tuple[Value, ...]) -> bytes:
    fields = ("\\N" if v is None else "".join(_COPY_ESCAPES.get(c, c) for c in v) for v in values)
    return "\t".join(fields).encode() + b"\n"


# --- pgoutput --------------------------------------------------------------------------------

TOAST = object()  # an unchanged-TOAST column in a tuple


def tuple_data(values: tuple[object, ...]) -> bytes:
    out = bytearray(struct.pack(">H", len(values)))
    for value in values:
        if value is None:
            out += b"n"
        elif value is TOAST:
            out += b"u"
        else:
            data = str(value).encode()
            out += b"t" + struct.pack(">I", len(data)) + data
    return bytes(out)


def message(
    op: bytes, oid: int, tuples: list[tuple[bytes, tuple[object, ...]]], xid: int | None = None
) -> bytes:
    out = op + (b"" if xid is None else struct.pack(">I", xid)) + struct.pack(">I", oid)
    return out + b"".join(kind + tuple_data(values) for kind, values in tuples)
