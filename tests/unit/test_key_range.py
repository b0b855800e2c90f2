"""The batch's key range the MERGE bounds its target by (`spark_jobs.rules.key_range`): which key column,
which types, and when there is none. Pure: no Spark session."""

from __future__ import annotations

from datetime import date
from decimal import Decimal

from pyspark.sql.types import (
    BinaryType,
    DateType,
    DecimalType,
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    TimestampType,
)

from spark_jobs.rules.key_range import KeyRange, bounds, range_column


def test_an_integer_key_is_bounded_by_the_batchs_lowest_and_highest_value() -> None:
    assert range_column(("id",), {"id": LongType(), "note": StringType()}) == "id"
    assert bounds("id", 17, 4_000_000) == KeyRange("id", 17, 4_000_000)
    assert range_column(("id",), {"id": IntegerType()}) == "id"


def test_a_text_decimal_or_date_key_is_bounded_too() -> None:
    assert range_column(("code",), {"code": StringType()}) == "code"
    assert bounds("code", "AB-1", "zz") == KeyRange("code", "AB-1", "zz")
    assert range_column(("n",), {"n": DecimalType(20, 0)}) == "n"
    assert bounds("n", Decimal("1"), Decimal("9")) == KeyRange("n", Decimal("1"), Decimal("9"))
    assert range_column(("day",), {"day": DateType()}) == "day"
    assert bounds("day", date(2024, 1, 1), date(2024, 2, 1)) == KeyRange(
        "day", date(2024, 1, 1), date(2024, 2, 1)
    )


def test_a_composite_key_is_bounded_by_its_leading_column_only() -> None:
    types = {"tenant": StringType(), "id": LongType()}
    assert range_column(("tenant", "id"), types) == "tenant"
    assert range_column(("id", "tenant"), types) == "id"
    # An unkeyed table's row identity (lsn, seq): its newest LSNs.
    assert range_column(("_bw_lsn", "_bw_seq"), {"_bw_lsn": LongType(), "_bw_seq": LongType()}) == "_bw_lsn"
    # A leading column of a type that cannot be bounded: no range, even if the second one could be.
    assert range_column(("at", "id"), {"at": TimestampType(), "id": LongType()}) is None


def test_no_range_without_a_key_for_unsafe_types_or_without_values() -> None:
    assert range_column((), {"id": LongType()}) is None
    assert range_column(("id",), {}) is None  # not among the batch's columns
    for unsafe in (TimestampType(), DoubleType(), BinaryType()):
        assert range_column(("k",), {"k": unsafe}) is None
    assert bounds(None, 1, 2) is None
    assert bounds("id", None, None) is None  # an empty batch: min and max are null
