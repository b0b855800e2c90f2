"""Parsers of Postgres's text output, one per type family, for the hot path.

pgoutput sends every column as its type's text output (the worker never asks for binary, whose
layout differs between versions). These functions turn that text into the values the encoders take:
the Avro-side ones return Avro primitive values (days, microseconds, unscaled decimal bytes) so that
the encoder does no further conversion; the JSON-side ones return ready JSON text fragments.

They assume the session settings the worker's connections set, which pgoutput's output functions
obey: bytea_output=hex and lc_monetary=C (money as `-$1,234.56`); dates and times (`pgtemporal`)
need DateStyle=ISO and IntervalStyle=postgres. Text they cannot represent raises `ConversionError`
with the reason and the fix; the row converter turns it into an `UnrepresentableValue` that names
the table and column.
"""

from __future__ import annotations

import binascii
import re
from collections.abc import Callable
from json.encoder import encode_basestring

from psycopg2 import InterfaceError
from psycopg2.extras import HstoreAdapter

from cdc_worker.core.errors import DataError

MONEY_SCALE = 2  # cents: lc_monetary=C has no frac_digits, so Postgres prints two
_DIGITS = frozenset("0123456789")

_MONEY = re.compile(r"(-?)\$([\d,]+)\.(\d\d)")
_ARRAY_ITEM = {
    # An item is either quoted (with backslash escapes) or bare (no quote, brace or delimiter).
    delimiter: re.compile(r'"((?:[^"\\]|\\.)*)"|([^"{}' + re.escape(delimiter) + "]+)")
    for delimiter in ",;"
}
_BACKSLASH_ESCAPE = re.compile(r"\\(.)", re.DOTALL)


class ConversionError(DataError, ValueError):
    """Text that has no faithful representation in the target format."""

    def __init__(self, reason: str, fix: str) -> None:
        super().__init__(f"{reason}; {fix}")
        self.reason = reason
        self.fix = fix


# --- numbers ---------------------------------------------------------------------------------

BOOLEAN_VALUES: dict[str, bool] = {"t": True, "f": False}
BOOLEAN_JSON: dict[str, str] = {"t": "true", "f": "false"}


def float_json(text: str) -> str:
    """Finite floats are JSON numbers already; NaN and ±Infinity are not, so they become strings."""
    return text if text[-1] in _DIGITS else f'"{text}"'


def quoted_json(text: str) -> str:
    """A string whose text never needs escaping (numbers, uuids, dates): just quote it."""
    return '"' + text + '"'  # not an f-string: None must raise (a NULL key), not become "None"


def decimal_bytes(unscaled: int) -> bytes:
    """Avro decimal bytes: big-endian two's complement, sized the way fastavro sizes them."""
    return unscaled.to_bytes((unscaled.bit_length() + 8) // 8, "big", signed=True)


def decimal_converter(precision: int, scale: int) -> Callable[[str], bytes]:
    """numeric text -> Avro decimal(precision, scale) bytes, refusing what does not fit exactly."""
    limit = 10**precision
    point_position = -scale - 1

    def to_decimal(text: str) -> bytes:
        if scale > 0 and len(text) > scale and text[point_position] == ".":
            digits = text.replace(".", "")  # numeric(p, s) prints exactly s fraction digits
        else:
            digits = _rescale(text, scale)
        try:
            unscaled = int(digits)
        except ValueError:
            raise ConversionError(
                f"numeric {text} has no Avro decimal representation",
                "declare the column numeric without a typmod (published as an exact string)",
            ) from None
        if not -limit < unscaled < limit:
            raise ConversionError(
                f"{text} has more than {precision} digits with scale {scale}",
                "widen the column's numeric precision or change the decimal mode",
            )
        # decimal_bytes, inlined: this is one of the hottest converters.
        return unscaled.to_bytes((unscaled.bit_length() + 8) // 8, "big", signed=True)

    return to_decimal


def _rescale(text: str, scale: int) -> str:
    """Digits of `text` scaled by 10**scale (scale >= 0), refusing to drop a nonzero digit."""
    whole, _, fraction = text.partition(".")
    if len(fraction.rstrip("0")) > scale:
        raise ConversionError(
            f"{text} has more than {scale} fraction digits", "raise the scale of the decimal mode"
        )
    return whole + fraction.ljust(scale, "0")[:scale]


def money_decimal_text(text: str) -> str:
    """money text in lc_monetary=C (`-$1,234.56`) -> exact decimal text (`-1234.56`)."""
    match = _MONEY.fullmatch(text)
    if match is None:
        raise ConversionError(
            f"money value {text!r} is not in the C locale's format",
            "set lc_monetary=C on the worker's connections (the decimal point must be '.')",
        )
    sign, whole, cents = match.groups()
    return f"{sign}{whole.replace(',', '')}.{cents}"


def money_to_decimal(text: str) -> bytes:
    return decimal_bytes(int(money_decimal_text(text).replace(".", "")))


def money_json(text: str) -> str:
    return f'"{money_decimal_text(text)}"'


# --- strings and bytes -----------------------------------------------------------------------

string_json: Callable[[str], str] = encode_basestring


def bytea_value(text: str) -> bytes:
    """bytea hex output `\\x00ff` -> the bytes, NUL bytes and all."""
    if not text.startswith("\\x"):
        raise ConversionError(
            "bytea arrived in escape format", "set bytea_output=hex on the worker's connections"
        )
    return bytes.fromhex(text[2:])


def bytea_json(text: str) -> str:
    return f'"{binascii.b2a_base64(bytea_value(text), newline=False).decode("ascii")}"'


def hstore_value(text: str) -> dict[str, str | None]:
    """hstore output `"k"=>"v", "n"=>NULL` -> a dict (psycopg2's parser, which checks every pair)."""
    try:
        parsed: dict[str, str | None] = HstoreAdapter.parse(text, None)
    except InterfaceError as exc:
        raise ConversionError(f"unreadable hstore text ({exc})", "report this value as a bug") from None
    return parsed


def hstore_json(text: str) -> str:
    pairs = hstore_value(text).items()
    members = (f"{encode_basestring(k)}:{'null' if v is None else encode_basestring(v)}" for k, v in pairs)
    return "{" + ",".join(members) + "}"


# --- arrays ----------------------------------------------------------------------------------


def array_items(text: str, delimiter: str = ",") -> list[str | None]:
    """A one-dimensional array's text output -> its items' text, None for NULL."""
    if not text.startswith("{") or not text.endswith("}"):
        raise ConversionError(
            f"array {text[:40]!r} has explicit bounds (a lower bound other than 1)",
            "store it with default bounds, e.g. array_agg or ARRAY[...]",
        )
    if text.startswith("{{"):
        raise ConversionError(
            "multi-dimensional arrays have no Avro or JSON representation here",
            "store one-dimensional arrays, or a jsonb column",
        )
    inner = text[1:-1]
    if not inner:
        return []
    if '"' not in inner:  # array_out quotes every item holding a quote, backslash or delimiter
        return [None if item == "NULL" else item for item in inner.split(delimiter)]
    return _quoted_array_items(text, inner, delimiter)


def _quoted_array_items(text: str, inner: str, delimiter: str) -> list[str | None]:
    pattern = _ARRAY_ITEM[delimiter]
    items: list[str | None] = []
    position = 0
    while True:
        match = pattern.match(inner, position)
        if match is None:
            raise ConversionError(f"unreadable array text {text[:80]!r}", "report this value as a bug")
        quoted, bare = match.groups()
        if bare is not None:
            items.append(None if bare == "NULL" else bare)
        else:
            items.append(_BACKSLASH_ESCAPE.sub(r"\1", quoted) if "\\" in quoted else quoted)
        position = match.end()
        if position == len(inner):
            return items
        if inner[position] != delimiter:
            raise ConversionError(f"unreadable array text {text[:80]!r}", "report this value as a bug")
        position += 1
