"""The lake's conventions for values Spark's readers give otherwise, as Spark expressions: dates and
timestamps clamped into Spark's range (the ±infinity sentinels included), time as `HH:MM:SS.ffffff`
text, decimals wider than 38 digits as exact text, ISO-8601 durations as the interval struct, and
JSON text in Python's `json.dumps` spelling. Each mirrors its Python reference in
tests/reference/wire.py. The Avro decoding's converters (`*_sql`) are Spark SQL text over a value's
reference, so that a table's decoding is a few expressions the JVM parses in one call each; the
JSON decoding's are Columns.

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


def _range_sql(data_type: DataType) -> tuple[str, str]:
    """The first and last date or timestamp Spark can format, as Spark SQL text."""
    if isinstance(data_type, DateType):
        return f"date_from_unix_date({SPARK_MIN_DAYS})", f"date_from_unix_date({SPARK_MAX_DAYS})"
    if isinstance(data_type, TimestampType):
        return f"timestamp_micros({SPARK_MIN_MICROS})", f"timestamp_micros({SPARK_MAX_MICROS})"
    return "make_timestamp_ntz(1, 1, 1, 0, 0, 0)", "make_timestamp_ntz(9999, 12, 31, 23, 59, 59.999999)"


def clamp_sql(value: str, data_type: DataType) -> str:
    """A date or timestamp held inside the range Spark can format (the ±infinity sentinels
    included), as Spark SQL text over `value`."""
    low, high = _range_sql(data_type)
    # least/greatest skip nulls: a null stays null only behind the guard.
    return f"CASE WHEN {value} IS NOT NULL THEN greatest(least({value}, {high}), {low}) END"


def time_text_sql(micros: str) -> str:
    """time-micros -> `HH:MM:SS.ffffff` (24:00:00 kept), as the reference's `wire.time_text`; Spark
    SQL text over `micros`, a non-negative long (`div` is exact on it)."""
    minutes = f"({micros} div {MICROS_PER_SECOND * SECONDS_PER_MINUTE})"
    return (
        f"format_string('%02d:%02d:%02d.%06d', {minutes} div {MINUTES_PER_HOUR},"
        f" {minutes} % {MINUTES_PER_HOUR}, ({micros} div {MICROS_PER_SECOND}) % {SECONDS_PER_MINUTE},"
        f" {micros} % {MICROS_PER_SECOND})"
    )


def _let(value: str, name: str, body: str) -> str:
    """`body` with the lambda variable `name` bound to `value`, which is then written (and
    evaluated) once however often `body` uses it."""
    return f"element_at(transform(array({value}), {name} -> {body}), 1)"


def _times_plus_sql(limbs: str, factor: int, addend: str) -> str:
    """limbs * factor + addend, little-endian base-10^9 limbs, the carry walked through them."""
    total = f"(bw_limb * {factor} + bw_state.carry)"
    step = (
        f"(bw_state, bw_limb) -> named_struct('out', concat(bw_state.out, array({total} % {_LIMB})),"
        f" 'carry', {total} div {_LIMB})"
    )
    carried = "concat(bw_state.out, array(bw_state.carry))"
    finish = f"bw_state -> CASE WHEN bw_state.carry > 0 THEN {carried} ELSE bw_state.out END"
    start = f"named_struct('out', CAST(array() AS array<bigint>), 'carry', CAST({addend} AS bigint))"
    return f"aggregate({limbs}, {start}, {step}, {finish})"


def wide_decimal_text_sql(data: str, scale: int) -> str:
    """A decimal's two's-complement big-endian bytes -> its exact text with `scale` digits after the
    point, as `format(Decimal, "f")`: for precisions Spark's decimal cannot hold. Spark SQL text
    over `data`."""

    def byte_at(i: str) -> str:
        return f"CAST(conv(hex(substr({data}, {i}, 1)), 16, 10) AS bigint)"

    negative = f"{byte_at('1')} >= 128"
    # A negative number's magnitude is its bytes complemented, plus one.
    values = (
        f"transform(sequence(1, length({data})),"
        f" bw_i -> CASE WHEN {negative} THEN 255 - {byte_at('bw_i')} ELSE {byte_at('bw_i')} END)"
    )
    magnitude = (
        f"aggregate({values}, array(CAST(0 AS bigint)), (bw_acc, bw_byte) ->"
        f" {_times_plus_sql('bw_acc', _BYTE, 'bw_byte')})"
    )
    limbs = _let(
        magnitude, "bw_m", f"CASE WHEN {negative} THEN {_times_plus_sql('bw_m', 1, '1')} ELSE bw_m END"
    )
    rest = (
        "array_join(transform(slice(bw_hf, 2, size(bw_hf)), bw_d -> lpad(CAST(bw_d AS string), 9, '0')), '')"
    )
    digits = _let(f"reverse({limbs})", "bw_hf", f"concat(CAST(get(bw_hf, 0) AS string), {rest})")
    if scale > 0:
        padded = f"lpad(bw_digits, greatest(length(bw_digits), {scale + 1}), '0')"
        split = (
            f"concat(substr(bw_pad, 1, length(bw_pad) - {scale}), '.',"
            f" substr(bw_pad, length(bw_pad) - {scale - 1}, {scale}))"
        )
        digits = _let(digits, "bw_digits", _let(padded, "bw_pad", split))
    sign = f"CASE WHEN {negative} THEN '-' ELSE '' END"
    return f"CASE WHEN {data} IS NOT NULL THEN concat({sign}, {digits}) END"


def python_json_spelling(text: Column) -> Column:
    """Spark's compact JSON -> `json.dumps`'s (a space after `,` and `:` outside strings)."""
    from pyspark.sql import functions as F

    return F.regexp_replace(text, _JSON_SEPARATOR, "$1$2 ")


def json_date(text: Column, data_type: DataType) -> Column:
    from pyspark.sql import functions as F

    year = F.regexp_extract(text, _DATE_TEXT, 1).cast("int")
    unreadable = fail(F.lit("JSON date/timestamp"), "unreadable")
    if isinstance(data_type, DateType):
        parsed = F.make_date(year, F.regexp_extract(text, _DATE_TEXT, 2).cast("int"),
                             F.regexp_extract(text, _DATE_TEXT, 3).cast("int"))  # fmt: skip
    elif isinstance(data_type, TimestampType):
        parsed = text.cast("timestamp")
    else:
        parsed = text.cast("timestamp_ntz")
    low_v, high_v = (F.expr(bound) for bound in _range_sql(data_type))
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
