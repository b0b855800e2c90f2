"""The reference decoder's value normalisers: what the worker writes -> what Spark can hold and
readers expect (the merge does the same with Spark's expressions, `spark_jobs.decoding.spark_values`).

The contract itself (frames, `bw.*` headers) is `kafka_contract`'s. Pure functions (no Spark, no
sockets) so that each is tested by feeding it values.
"""

from __future__ import annotations

import re

from kafka_contract.headers import MICROS_PER_SECOND, WireFormatError
from spark_jobs.decoding.spark_types import SPARK_MAX_DAYS, SPARK_MAX_MICROS, SPARK_MIN_DAYS, SPARK_MIN_MICROS

_ISO_DURATION = re.compile(
    r"(?P<sign>-)?P(?:(?P<y>-?\d+)Y)?(?:(?P<mo>-?\d+)M)?(?:(?P<w>-?\d+)W)?(?:(?P<d>-?\d+)D)?"
    r"(?:T(?:(?P<h>-?\d+)H)?(?:(?P<mi>-?\d+)M)?(?:(?P<s>-?\d+(?:\.\d+)?)S)?)?"
)
MONTHS_PER_YEAR = 12
DAYS_PER_WEEK = 7
SECONDS_PER_HOUR = 3600
SECONDS_PER_MINUTE = 60


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
