"""Parsers of Postgres's date and time text output (DateStyle=ISO, IntervalStyle=postgres).

The Avro-side functions return Avro's integers (days, microseconds) and the interval record; the
JSON-side ones return JSON text. pgoutput writes timestamptz in the session TimeZone: the worker sets
UTC, which takes the fast paths, but any offset (including historic ones with seconds) is honoured.

Dates and timestamps are counted in the proleptic Gregorian calendar, as Postgres counts them, so
BC dates and years past 9999 convert exactly even though Python's `date` cannot hold them. The
infinities become sentinels at the ends of Avro's int and long ranges, where no finite Postgres date
or timestamp can land; in JSON they are "infinity" and "-infinity".
"""

from __future__ import annotations

import re
from datetime import UTC, date, datetime

from cdc_worker.core.pgtypes.text import ConversionError

# Avro's int and long ranges; the infinity sentinels sit on their ends, where no finite Postgres
# date or timestamp (±5.9 million years, ±294 thousand years) can land.
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
DATE_POS_INFINITY, DATE_NEG_INFINITY = INT32_MAX, INT32_MIN
TIMESTAMP_POS_INFINITY, TIMESTAMP_NEG_INFINITY = INT64_MAX, INT64_MIN

MICROS_PER_SECOND = 1_000_000
SECONDS_PER_MINUTE = 60
SECONDS_PER_HOUR = 3600
SECONDS_PER_DAY = 86_400
MICROS_PER_DAY = SECONDS_PER_DAY * MICROS_PER_SECOND
MONTHS_PER_YEAR = 12
FRACTION_DIGITS = 6  # Postgres keeps microseconds
MAX_ISO_YEAR = 9999  # the largest year written without an ISO-8601 expansion sign

_EPOCH_ORDINAL = date(1970, 1, 1).toordinal()
_EPOCH_UTC = datetime(1970, 1, 1, tzinfo=UTC)
_EPOCH_NAIVE = datetime(1970, 1, 1)
_INFINITY = "infinity"
_NEG_INFINITY = "-infinity"
_BC_SUFFIX = " BC"
# The shape DateStyle=ISO gives 'YYYY-MM-DD' for years 1-9999 AD, which `date.fromisoformat` reads.
_PLAIN_DATE_LENGTH = 10
_UTC_SUFFIX = "+00"

_DATE = re.compile(r"(\d{4,})-(\d\d)-(\d\d)( BC)?")
_TIMESTAMP = re.compile(
    r"(\d{4,})-(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)(?:\.(\d{1,6}))?"
    r"(?:([+-])(\d\d)(?::(\d\d))?(?::(\d\d))?)?( BC)?"
)
_TIME = re.compile(r"(\d\d):(\d\d):(\d\d)(?:\.(\d{1,6}))?")
# IntervalStyle=postgres: `1 year 2 mons -3 days +04:05:06.5`, each part optional and signed.
_INTERVAL = re.compile(
    r"(?:([+-]?\d+) years? ?)?(?:([+-]?\d+) mons? ?)?(?:([+-]?\d+) days? ?)?"
    r"(?:([+-])?(\d+):(\d\d):(\d\d)(?:\.(\d{1,6}))?)?"
)


def days_from_civil(year: int, month: int, day: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date (astronomical years: 1 BC is 0)."""
    # Howard Hinnant's algorithm: count from a March-based era so leap days fall at the end.
    year -= month <= 2
    era = year // 400
    year_of_era = year - era * 400
    day_of_year = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    day_of_era = year_of_era * 365 + year_of_era // 4 - year_of_era // 100 + day_of_year
    return era * 146_097 + day_of_era - 719_468


def civil_from_days(days: int) -> tuple[int, int, int]:
    """The inverse of `days_from_civil`."""
    days += 719_468
    era = days // 146_097
    day_of_era = days - era * 146_097
    year_of_era = (day_of_era - day_of_era // 1460 + day_of_era // 36_524 - day_of_era // 146_096) // 365
    day_of_year = day_of_era - (365 * year_of_era + year_of_era // 4 - year_of_era // 100)
    shifted_month = (5 * day_of_year + 2) // 153
    day = day_of_year - (153 * shifted_month + 2) // 5 + 1
    month = shifted_month + (3 if shifted_month < 10 else -9)
    return year_of_era + era * 400 + (month <= 2), month, day


def iso_year(year: int) -> str:
    """ISO-8601 year: four digits, a sign for years before 1 AD (astronomical) or after 9999."""
    if year < 0:
        return f"-{-year:04d}"
    return f"{year:04d}" if year <= MAX_ISO_YEAR else f"+{year}"


def _astronomical_year(digits: str, bc: str | None) -> int:
    return 1 - int(digits) if bc else int(digits)


def date_days(text: str) -> int:
    """date text -> days since 1970-01-01; ±infinity -> the int32 sentinels."""
    if len(text) == _PLAIN_DATE_LENGTH:
        return date.fromisoformat(text).toordinal() - _EPOCH_ORDINAL
    if text == _INFINITY:
        return DATE_POS_INFINITY
    if text == _NEG_INFINITY:
        return DATE_NEG_INFINITY
    match = _DATE.fullmatch(text)
    if match is None:
        raise ConversionError(f"unreadable date {text!r}", "set DateStyle=ISO on the worker's connections")
    year, month, day, bc = match.groups()
    return days_from_civil(_astronomical_year(year, bc), int(month), int(day))


def date_json(text: str) -> str:
    if len(text) == _PLAIN_DATE_LENGTH or text in (_INFINITY, _NEG_INFINITY):
        return f'"{text}"'
    year, month, day = civil_from_days(date_days(text))
    return f'"{iso_year(year)}-{month:02d}-{day:02d}"'


def timestamptz_micros(text: str) -> int:
    """timestamptz text (any offset) -> microseconds since the epoch, UTC; ±infinity -> sentinels."""
    try:
        delta = datetime.fromisoformat(text) - _EPOCH_UTC
    except ValueError:
        return _timestamp_micros_slow(text)
    return delta.days * MICROS_PER_DAY + delta.seconds * MICROS_PER_SECOND + delta.microseconds


def timestamp_micros(text: str) -> int:
    """timestamp text -> microseconds since 1970-01-01 00:00 on the wall clock; ±infinity -> sentinels."""
    try:
        delta = datetime.fromisoformat(text) - _EPOCH_NAIVE
    except ValueError:
        return _timestamp_micros_slow(text)
    return delta.days * MICROS_PER_DAY + delta.seconds * MICROS_PER_SECOND + delta.microseconds


def _timestamp_micros_slow(text: str) -> int:
    """BC years, years past 9999 and infinities, which `datetime` cannot hold."""
    if text == _INFINITY:
        return TIMESTAMP_POS_INFINITY
    if text == _NEG_INFINITY:
        return TIMESTAMP_NEG_INFINITY
    match = _TIMESTAMP.fullmatch(text)
    if match is None:
        raise ConversionError(
            f"unreadable timestamp {text!r}", "set DateStyle=ISO on the worker's connections"
        )
    year, month, day, hour, minute, second, fraction, sign, off_h, off_m, off_s, bc = match.groups()
    days = days_from_civil(_astronomical_year(year, bc), int(month), int(day))
    seconds = days * SECONDS_PER_DAY + int(hour) * SECONDS_PER_HOUR + int(minute) * 60 + int(second)
    if sign:
        offset = int(off_h) * SECONDS_PER_HOUR + int(off_m or 0) * SECONDS_PER_MINUTE + int(off_s or 0)
        seconds -= offset if sign == "+" else -offset
    micros = seconds * MICROS_PER_SECOND + _fraction_micros(fraction)
    if not TIMESTAMP_NEG_INFINITY < micros < TIMESTAMP_POS_INFINITY:
        raise ConversionError(
            f"timestamp {text} is beyond the range of Avro's timestamp-micros",
            "store timestamps within ±292,000 years of 1970",
        )
    return micros


def _fraction_micros(fraction: str | None) -> int:
    return int(fraction.ljust(FRACTION_DIGITS, "0")) if fraction else 0


def _with_fraction(clock: str) -> str:
    """`HH:MM:SS[.f]` -> `HH:MM:SS.ffffff`, the fixed form the JSON contract promises."""
    if len(clock) == len("HH:MM:SS"):
        return clock + ".000000"
    return clock.ljust(len("HH:MM:SS.ffffff"), "0")


def timestamp_json(text: str) -> str:
    """`YYYY-MM-DDTHH:MM:SS.ffffff` on the wall clock, or "infinity"/"-infinity"."""
    if text[4:5] == "-" and text[10:11] == " " and not text.endswith(_BC_SUFFIX):
        return f'"{text[:10]}T{_with_fraction(text[11:])}"'
    return _micros_json(timestamp_micros(text), "")


def timestamptz_json(text: str) -> str:
    """`YYYY-MM-DDTHH:MM:SS.ffffffZ` in UTC, or "infinity"/"-infinity"."""
    if text.endswith(_UTC_SUFFIX) and text[4:5] == "-":
        return f'"{text[:10]}T{_with_fraction(text[11:-3])}Z"'
    return _micros_json(timestamptz_micros(text), "Z")


def _micros_json(micros: int, zone: str) -> str:
    if micros == TIMESTAMP_POS_INFINITY:
        return f'"{_INFINITY}"'
    if micros == TIMESTAMP_NEG_INFINITY:
        return f'"{_NEG_INFINITY}"'
    days, micros_of_day = divmod(micros, MICROS_PER_DAY)
    year, month, day = civil_from_days(days)
    seconds, fraction = divmod(micros_of_day, MICROS_PER_SECOND)
    minutes, second = divmod(seconds, SECONDS_PER_MINUTE)
    hour, minute = divmod(minutes, SECONDS_PER_MINUTE)
    return (
        f'"{iso_year(year)}-{month:02d}-{day:02d}T{hour:02d}:{minute:02d}:{second:02d}.{fraction:06d}{zone}"'
    )


def time_micros(text: str) -> int:
    """time text -> microseconds after midnight (24:00:00, which Postgres allows, is 86,400,000,000)."""
    match = _TIME.fullmatch(text)
    if match is None:
        raise ConversionError(f"unreadable time {text!r}", "report this value as a bug")
    hour, minute, second, fraction = match.groups()
    seconds = int(hour) * SECONDS_PER_HOUR + int(minute) * SECONDS_PER_MINUTE + int(second)
    return seconds * MICROS_PER_SECOND + _fraction_micros(fraction)


def time_json(text: str) -> str:
    return f'"{_with_fraction(text)}"'


# --- intervals -------------------------------------------------------------------------------


def interval_parts(text: str) -> tuple[int, int, int]:
    """IntervalStyle=postgres text -> (months, days, microseconds), Postgres's own three fields."""
    match = _INTERVAL.fullmatch(text)
    if match is None or not text:
        raise ConversionError(
            f"unreadable interval {text!r}", "set IntervalStyle=postgres on the worker's connections"
        )
    years, months, days, sign, hours, minutes, seconds, fraction = match.groups()
    total_months = int(years or 0) * MONTHS_PER_YEAR + int(months or 0)
    micros = 0
    if hours is not None:
        clock = int(hours) * SECONDS_PER_HOUR + int(minutes) * SECONDS_PER_MINUTE + int(seconds)
        micros = clock * MICROS_PER_SECOND + _fraction_micros(fraction)
        if sign == "-":
            micros = -micros
    return total_months, int(days or 0), micros


def interval_record(text: str) -> dict[str, int]:
    months, days, micros = interval_parts(text)
    return {"months": months, "days": days, "micros": micros}


def interval_json(text: str) -> str:
    """ISO-8601 duration exactly as Postgres writes it under IntervalStyle=iso_8601."""
    months, days, micros = interval_parts(text)
    # Postgres splits with C's truncating division, so every part carries the sign of its field.
    years, months = _truncating_divmod(months, MONTHS_PER_YEAR)
    hours, rest = _truncating_divmod(micros, SECONDS_PER_HOUR * MICROS_PER_SECOND)
    minutes, rest = _truncating_divmod(rest, SECONDS_PER_MINUTE * MICROS_PER_SECOND)
    if not (years or months or days or micros):
        return '"PT0S"'
    out = ["P"]
    out += [f"{value}{unit}" for value, unit in ((years, "Y"), (months, "M"), (days, "D")) if value]
    if micros:
        out.append("T")
        out += [f"{value}{unit}" for value, unit in ((hours, "H"), (minutes, "M")) if value]
    if rest:
        seconds, fraction = divmod(abs(rest), MICROS_PER_SECOND)
        digits = f"{seconds}.{fraction:06d}".rstrip("0").rstrip(".")
        out.append(f"{'-' if rest < 0 else ''}{digits}S")
    return '"' + "".join(out) + '"'


def _truncating_divmod(value: int, divisor: int) -> tuple[int, int]:
    quotient = abs(value) // divisor
    if value < 0:
        quotient = -quotient
    return quotient, value - quotient * divisor
