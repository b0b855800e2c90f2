"""The Kafka contract as the merge reads it: Confluent frames, `bw.*` headers, value normalisers.

Pure functions (no Spark, no sockets) so that each is tested by feeding it bytes. The decoders of
`spark_jobs.decoders` call them per message inside the Python workers.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from datetime import UTC, datetime

CONFLUENT_MAGIC = 0
FRAME_HEADER_LENGTH = 5
_SCHEMA_ID = struct.Struct(">I")

HEADER_OP = "bw.op"
HEADER_LSN = "bw.lsn"
HEADER_SEQ = "bw.seq"
HEADER_XID = "bw.xid"
HEADER_COMMIT_TS = "bw.commit_ts"
HEADER_UNCHANGED = "bw.unchanged"
OP_DELETE = "d"
OP_TRUNCATE = "t"

MICROS_PER_SECOND = 1_000_000
SECONDS_PER_DAY = 86_400
# The worker writes ±infinity dates and timestamps as the ends of Avro's int and long ranges. Spark
# can store those numbers but no client can read them back (Python's datetime stops at year 9999),
# so the lake holds the first and last instants Spark can format instead (documented in lakehouse.md).
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
SPARK_MIN_DAYS = (datetime(1, 1, 1, tzinfo=UTC) - _EPOCH).days
SPARK_MAX_DAYS = (datetime(9999, 12, 31, tzinfo=UTC) - _EPOCH).days
SPARK_MIN_MICROS = SPARK_MIN_DAYS * SECONDS_PER_DAY * MICROS_PER_SECOND
SPARK_MAX_MICROS = (SPARK_MAX_DAYS + 1) * SECONDS_PER_DAY * MICROS_PER_SECOND - 1

_ISO_DURATION = re.compile(
    r"(?P<sign>-)?P(?:(?P<y>-?\d+)Y)?(?:(?P<mo>-?\d+)M)?(?:(?P<w>-?\d+)W)?(?:(?P<d>-?\d+)D)?"
    r"(?:T(?:(?P<h>-?\d+)H)?(?:(?P<mi>-?\d+)M)?(?:(?P<s>-?\d+(?:\.\d+)?)S)?)?"
)
MONTHS_PER_YEAR = 12
DAYS_PER_WEEK = 7
SECONDS_PER_HOUR = 3600
SECONDS_PER_MINUTE = 60


class WireFormatError(ValueError):
    """A message that breaks the Kafka contract; the text names the topic, partition and offset."""


def parse_frame(data: bytes) -> tuple[int, int]:
    """Confluent framing: (schema id, offset of the Avro body). Magic byte 0, 4-byte big-endian id."""
    if len(data) < FRAME_HEADER_LENGTH or data[0] != CONFLUENT_MAGIC:
        first = data[:1].hex() or "nothing"
        raise WireFormatError(
            f"not a Confluent-framed Avro message (first byte {first}, {len(data)} bytes): "
            "is the topic JSON? pass --format json"
        )
    (schema_id,) = _SCHEMA_ID.unpack_from(data, 1)
    return schema_id, FRAME_HEADER_LENGTH


def frame_schema_id(data: bytes | None) -> int | None:
    return None if data is None else parse_frame(data)[0]


@dataclass(frozen=True, slots=True)
class EventHeaders:
    """The `bw.*` headers of one message."""

    op: str
    lsn: int
    seq: int
    xid: int
    commit_ts_micros: int
    unchanged: tuple[str, ...]


def header_map(headers: list[tuple[str, bytes | None]] | None) -> dict[str, bytes]:
    return {k: v for k, v in headers or () if v is not None}


def parse_headers(headers: dict[str, bytes], ts_cache: dict[bytes, int] | None = None) -> EventHeaders:
    """The `bw.*` headers; a missing or malformed one is a contract violation, never a default."""
    try:
        op = headers[HEADER_OP].decode()
        lsn = int(headers[HEADER_LSN])
        seq = int(headers[HEADER_SEQ])
        xid = int(headers.get(HEADER_XID, b"0"))
        raw_ts = headers[HEADER_COMMIT_TS]
    except KeyError as exc:
        raise WireFormatError(
            f"message without the {exc.args[0]} header: not written by bottledwater"
        ) from exc
    except ValueError as exc:
        raise WireFormatError(f"malformed bw.* header ({exc})") from exc
    # Every message of a transaction carries the same commit_ts text: parse it once.
    commit_ts = ts_cache.get(raw_ts) if ts_cache is not None else None
    if commit_ts is None:
        commit_ts = iso_micros(raw_ts.decode())
        if ts_cache is not None:
            ts_cache[raw_ts] = commit_ts
    unchanged_raw = headers.get(HEADER_UNCHANGED)
    unchanged = tuple(unchanged_raw.decode().split(",")) if unchanged_raw else ()
    return EventHeaders(op, lsn, seq, xid, commit_ts, unchanged)


def iso_micros(text: str) -> int:
    """Microseconds since the epoch of an ISO-8601 timestamp (`Z` or an offset; none means UTC)."""
    parsed = datetime.fromisoformat(text)
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    delta = parsed - _EPOCH
    return (delta.days * SECONDS_PER_DAY + delta.seconds) * MICROS_PER_SECOND + delta.microseconds


def clamp_days(days: int) -> int:
    """Avro date (days since the epoch) -> a date Spark can hold; the ±infinity sentinels included."""
    return min(max(days, SPARK_MIN_DAYS), SPARK_MAX_DAYS)


def clamp_micros(micros: int) -> int:
    """Avro timestamp (µs since the epoch) -> one Spark can hold; the ±infinity sentinels included."""
    return min(max(micros, SPARK_MIN_MICROS), SPARK_MAX_MICROS)


def time_text(micros: int) -> str:
    """Avro time-micros -> `HH:MM:SS.ffffff`, the JSON contract's text (and 24:00:00 kept)."""
    seconds, fraction = divmod(micros, MICROS_PER_SECOND)
    minutes, second = divmod(seconds, SECONDS_PER_MINUTE)
    hour, minute = divmod(minutes, SECONDS_PER_MINUTE)
    return f"{hour:02d}:{minute:02d}:{second:02d}.{fraction:06d}"


def interval_from_iso(text: str) -> dict[str, int]:
    """An ISO-8601 duration as the JSON contract writes intervals -> the Avro interval record."""
    match = _ISO_DURATION.fullmatch(text)
    if match is None or text in ("P", "PT"):
        raise WireFormatError(f"unreadable ISO-8601 interval {text!r}")
    parts = match.groupdict()
    sign = -1 if parts.pop("sign") else 1

    def number(name: str) -> int:
        return int(parts[name] or 0)

    months = number("y") * MONTHS_PER_YEAR + number("mo")
    days = number("w") * DAYS_PER_WEEK + number("d")
    seconds_text = parts["s"] or "0"
    whole, _, fraction = seconds_text.partition(".")
    negative_seconds = whole.startswith("-")
    second_micros = abs(int(whole)) * MICROS_PER_SECOND + int((fraction + "000000")[:6])
    if negative_seconds:
        second_micros = -second_micros
    micros = (number("h") * SECONDS_PER_HOUR + number("mi") * SECONDS_PER_MINUTE) * MICROS_PER_SECOND
    micros += second_micros
    return {"months": sign * months, "days": sign * days, "micros": sign * micros}
