"""The lake's conventions for values Spark's readers give otherwise, as Spark expressions: dates and
timestamps clamped into Spark's range (the ±infinity sentinels included), time as `HH:MM:SS.ffffff`
text, decimals wider than 38 digits as exact text, ISO-8601 durations as the interval struct, and
JSON text in Python's `json.dumps` spelling. Each mirrors its Python reference in
tests/reference/wire.py.

Shared by the Avro and JSON decoding of `spark_decode`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyspark.sql.types import DataType, DateType, TimestampType

from spark_jobs.decoding.spark_envelope import fail
from spark_jobs.decoding.spark_types import SPARK_MAX_DAYS, SPARK_MAX_MICROS, SPARK_MIN_DAYS, SPARK_MIN_MICROS

if TYPE_CHECKING:
    from pyspark.sql import Column

MICROS_PER_SECOND = 1_000_000
MICROS_PER_MILLI = 1000
SECONDS_PER_MINUTE = 60
MINUTES_PER_HOUR = 60
MIN_YEAR, MAX_YEAR = 1, 9999
# Base of the limbs a wide decimal's magnitude is accumulated in: 9 decimal digits, so that
# limb * 256 + carry stays far inside a long.
_LIMB = 1_000_000_000
_LIMB_DIGITS = 9
_BYTE = 256
_DATE_TEXT = r"^([+-]?\d{4,})-(\d\d)-(\d\d)"
_ISO_DURATION = (
    r"^(-)?P(?:(-?\d+)Y)?(?:(-?\d+)M)?(?:(-?\d+)W)?(?:(-?\d+)D)?"
    r"(?:T(?:(-?\d+)H)?(?:(-?\d+)M)?(?:(-?\d+(?:\.\d+)?)S)?)?$"
)
# One JSON token outside a string, or a whole string, up to a separator: anchored with \G to where
# the previous match ended, so a separator inside a string is never taken for one.
_JSON_SEPARATOR = r"""\G((?:"(?:[^"\\]|\\.)*"|[^",:])*)([,:])"""
_INTERVAL_FIELDS = ("months", "days", "micros")


# --- value converters shared by Avro and JSON ------------------------------------------------------


def _max_ntz() -> Column:
    from pyspark.sql import functions as F

    return F.expr("make_timestamp_ntz(9999, 12, 31, 23, 59, 59.999999)")


def clamp(column: Column, data_type: DataType) -> Column:
    """A date or timestamp held inside the range Spark can format (the ±infinity sentinels included)."""
    from pyspark.sql import functions as F

    if isinstance(data_type, DateType):
        low = F.date_from_unix_date(F.lit(SPARK_MIN_DAYS))
        high = F.date_from_unix_date(F.lit(SPARK_MAX_DAYS))
    elif isinstance(data_type, TimestampType):
        low = F.timestamp_micros(F.lit(SPARK_MIN_MICROS))
        high = F.timestamp_micros(F.lit(SPARK_MAX_MICROS))
    else:
        low, high = F.expr("make_timestamp_ntz(1, 1, 1, 0, 0, 0)"), _max_ntz()
    # least/greatest skip nulls: a null stays null only behind the guard.
    return F.when(column.isNotNull(), F.greatest(F.least(column, high), low))


def _div(column: Column, divisor: int) -> Column:
    """Integer division of a non-negative long (exact: the quotient of a multiple is an integer)."""
    return ((column - column % divisor) / divisor).cast("long")


def time_text(micros: Column) -> Column:
    """time-micros -> `HH:MM:SS.ffffff` (24:00:00 kept), as the reference's `wire.time_text`."""
    from pyspark.sql import functions as F

    seconds = _div(micros, MICROS_PER_SECOND)
    minutes = _div(seconds, SECONDS_PER_MINUTE)
    return F.format_string(
        "%02d:%02d:%02d.%06d",
        _div(minutes, MINUTES_PER_HOUR),
        minutes % MINUTES_PER_HOUR,
        seconds % SECONDS_PER_MINUTE,
        micros % MICROS_PER_SECOND,
    )


def _times_plus(limbs: Column, factor: int, addend: Column) -> Column:
    """limbs * factor + addend, little-endian base-10^9 limbs, the carry walked through them."""
    from pyspark.sql import functions as F

    start = F.struct(F.array().cast("array<bigint>").alias("out"), addend.cast("long").alias("carry"))

    def step(state: Column, limb: Column) -> Column:
        total = limb * factor + state["carry"]
        return F.struct(
            F.concat(state["out"], F.array(total % _LIMB)).alias("out"), _div(total, _LIMB).alias("carry")
        )

    def finish(state: Column) -> Column:
        return F.when(state["carry"] > 0, F.concat(state["out"], F.array(state["carry"]))).otherwise(
            state["out"]
        )

    return F.aggregate(limbs, start, step, finish)


def wide_decimal_text(data: Column, scale: int) -> Column:
    """A decimal's two's-complement big-endian bytes -> its exact text with `scale` digits after the
    point, as `format(Decimal, "f")`: for precisions Spark's decimal cannot hold."""
    from pyspark.sql import functions as F

    def byte_at(i: Column) -> Column:
        return F.conv(F.hex(data.substr(i, F.lit(1))), 16, 10).cast("long")

    negative = byte_at(F.lit(1)) >= 128
    # A negative number's magnitude is its bytes complemented, plus one.
    values = F.transform(
        F.sequence(F.lit(1), F.length(data)),
        lambda i: F.when(negative, 255 - byte_at(i)).otherwise(byte_at(i)),
    )
    limbs = F.aggregate(values, F.array(F.lit(0).cast("long")), lambda acc, b: _times_plus(acc, _BYTE, b))
    limbs = F.when(negative, _times_plus(limbs, 1, F.lit(1))).otherwise(limbs)
    high_first = F.reverse(limbs)
    digits = F.concat(
        F.get(high_first, 0).cast("string"),
        F.array_join(
            F.transform(
                F.slice(high_first, 2, F.size(high_first)), lambda d: F.lpad(d.cast("string"), 9, "0")
            ),
            "",
        ),
    )
    if scale > 0:
        padded = F.lpad(digits, F.greatest(F.length(digits), F.lit(scale + 1)), "0")
        whole = padded.substr(F.lit(1), F.length(padded) - scale)
        digits = F.concat(whole, F.lit("."), padded.substr(F.length(padded) - scale + 1, F.lit(scale)))
    return F.when(data.isNotNull(), F.concat(F.when(negative, F.lit("-")).otherwise(F.lit("")), digits))


def python_json_spelling(text: Column) -> Column:
    """Spark's compact JSON -> `json.dumps`'s (a space after `,` and `:` outside strings)."""
    from pyspark.sql import functions as F

    return F.regexp_replace(text, _JSON_SEPARATOR, "$1$2 ")


def json_date(text: Column, data_type: DataType) -> Column:
    from pyspark.sql import functions as F

    year = F.regexp_extract(text, _DATE_TEXT, 1).cast("int")
    unreadable = fail(F.lit("JSON date/timestamp"), "unreadable")
    if isinstance(data_type, DateType):
        low_v = F.date_from_unix_date(F.lit(SPARK_MIN_DAYS))
        high_v = F.date_from_unix_date(F.lit(SPARK_MAX_DAYS))
        parsed = F.make_date(year, F.regexp_extract(text, _DATE_TEXT, 2).cast("int"),
                             F.regexp_extract(text, _DATE_TEXT, 3).cast("int"))  # fmt: skip
    elif isinstance(data_type, TimestampType):
        low_v = F.timestamp_micros(F.lit(SPARK_MIN_MICROS))
        high_v = F.timestamp_micros(F.lit(SPARK_MAX_MICROS))
        parsed = text.cast("timestamp")
    else:
        low_v, high_v = F.expr("make_timestamp_ntz(1, 1, 1, 0, 0, 0)"), _max_ntz()
        parsed = text.cast("timestamp_ntz")
    return (
        F.when(text.isNull(), F.lit(None).cast(data_type))
        .when(text == F.lit("infinity"), high_v)
        .when(text == F.lit("-infinity"), low_v)
        .when(~text.rlike(_DATE_TEXT), unreadable)
        .when(year < MIN_YEAR, low_v)
        .when(year > MAX_YEAR, high_v)
        .otherwise(parsed)
    )


def interval_from_iso(text: Column) -> Column:
    """An ISO-8601 duration -> struct<months, days, micros>, as the reference's `wire.interval_from_iso`."""
    from pyspark.sql import functions as F

    def part(group: int) -> Column:
        return F.coalesce(F.nullif(F.regexp_extract(text, _ISO_DURATION, group), F.lit("")), F.lit("0"))

    sign = F.when(F.regexp_extract(text, _ISO_DURATION, 1) == F.lit("-"), -1).otherwise(1)
    months = part(2).cast("int") * 12 + part(3).cast("int")
    days = part(4).cast("int") * 7 + part(5).cast("int")
    micros = (part(6).cast("long") * 3600 + part(7).cast("long") * 60) * MICROS_PER_SECOND + (
        part(8).cast("decimal(38,6)") * MICROS_PER_SECOND
    ).cast("long")
    unreadable = ~text.rlike(_ISO_DURATION) | text.isin("P", "PT")
    return F.when(unreadable, fail(F.concat(F.lit("JSON interval "), text), "unreadable ISO-8601")).otherwise(
        F.struct(
            (sign * months).cast("int").alias("months"),
            (sign * days).cast("int").alias("days"),
            (sign * micros).cast("long").alias("micros"),
        )
    )
