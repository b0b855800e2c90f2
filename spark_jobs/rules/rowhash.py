"""An order-independent fingerprint of a table: row count plus the sum (mod 2^64) of row hashes.

Both sides hash the same canonical form of each value, chosen by the Delta column's Spark type, so a
Postgres row (read through psycopg2) and a Delta row (read through Arrow) that hold the same data
hash alike: timestamps as epoch microseconds, decimals as their unscaled integer, float4 rounded to
32 bits, maps as sorted pairs. Pure Python, no Spark, so it is tested by feeding it values.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    DateType,
    DecimalType,
    FloatType,
    MapType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

MOD = 2**64
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_EPOCH_DATE = date(1970, 1, 1)
_FLOAT32 = struct.Struct(">f")
Canon = Callable[[Any], Any]


def canonicalizer(data_type: DataType) -> Canon:
    """A function from a value of `data_type` (either side's Python form) to its canonical form."""
    if isinstance(data_type, TimestampType):
        return _instant_micros
    if isinstance(data_type, TimestampNTZType):
        return _wall_micros
    if isinstance(data_type, DateType):
        return lambda v: (v - _EPOCH_DATE).days
    if isinstance(data_type, DecimalType):
        scale = data_type.scale
        return lambda v: int(Decimal(v).scaleb(scale))
    if isinstance(data_type, FloatType):
        return lambda v: _FLOAT32.unpack(_FLOAT32.pack(v))[0].hex()
    if isinstance(data_type, BinaryType):
        return bytes
    if isinstance(data_type, ArrayType):
        item = canonicalizer(data_type.elementType)
        return lambda v: tuple(None if x is None else item(x) for x in v)
    if isinstance(data_type, MapType):
        value = canonicalizer(data_type.valueType)
        return lambda v: tuple(sorted((k, None if x is None else value(x)) for k, x in _pairs(v)))
    if isinstance(data_type, StructType):
        fields = [(f.name, canonicalizer(f.dataType)) for f in data_type.fields]
        return lambda v: tuple(None if _get(v, n) is None else c(_get(v, n)) for n, c in fields)
    return _plain


def _plain(value: Any) -> Any:
    if isinstance(value, float):
        return value.hex()
    return value


def _instant_micros(value: datetime) -> int:
    aware = value if value.tzinfo else value.replace(tzinfo=UTC)
    delta = aware - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _wall_micros(value: datetime) -> int:
    return _instant_micros(value.replace(tzinfo=UTC))


def _pairs(value: Any) -> Iterable[tuple[Any, Any]]:
    return value.items() if isinstance(value, dict) else value


def _get(value: Any, name: str) -> Any:
    return value[name] if isinstance(value, dict) else getattr(value, name)


@dataclass(frozen=True)
class RowHasher:
    """Hashes rows of the given column types; `key_text` renders a key for people to read."""

    types: Sequence[DataType]

    def __post_init__(self) -> None:
        object.__setattr__(self, "_canon", [canonicalizer(t) for t in self.types])

    def canonical(self, row: Sequence[Any]) -> tuple[Any, ...]:
        canon: list[Canon] = self._canon  # type: ignore[attr-defined]
        return tuple(None if v is None else c(v) for c, v in zip(canon, row, strict=True))

    def hash(self, row: Sequence[Any]) -> int:
        digest = hashlib.blake2b(repr(self.canonical(row)).encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big")


def key_text(names: Sequence[str], values: Sequence[Any]) -> str:
    """A key as people read it in a report: {"id": 5}."""
    return json.dumps(dict(zip(names, values, strict=True)), default=str, ensure_ascii=False)


@dataclass
class Fingerprint:
    count: int = 0
    checksum: int = 0

    def add(self, row_hash: int) -> None:
        self.count += 1
        self.checksum = (self.checksum + row_hash) % MOD

    def merge(self, other: Fingerprint) -> Fingerprint:
        return Fingerprint(self.count + other.count, (self.checksum + other.checksum) % MOD)
