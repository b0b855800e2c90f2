"""Type mapping of dates and times: Avro value after a fastavro round trip, and JSON output.

Sentinels and BC dates are read without the logical type (Python's `date` cannot hold them);
expected values come from the stdlib's calendar and from Postgres 15's own ISO-8601 spellings.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdc_worker.core.pgtypes.oids import PgType
from cdc_worker.core.pgtypes.temporal import (
    DATE_NEG_INFINITY,
    DATE_POS_INFINITY,
    TIMESTAMP_NEG_INFINITY,
    TIMESTAMP_POS_INFINITY,
    civil_from_days,
    days_from_civil,
)
from cdc_worker.core.pgtypes.text import ConversionError
from tests.unit.pgtypes_helpers import EPOCH, avro_round_trip, json_value, mapped

# --- dates and times ---------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["2024-02-29", "1970-01-01", "0001-01-01", "9999-12-31", "1969-12-31"])
def test_date(text: str) -> None:
    column = mapped(PgType.DATE)
    assert column.avro_schema == {"type": "int", "logicalType": "date"}
    assert avro_round_trip(column, text) == date.fromisoformat(text)
    assert json_value(column, text) == text


def test_bc_and_far_future_dates_are_exact_days() -> None:
    column = mapped(PgType.DATE)
    # 1 BC is astronomical year 0, a leap year: 366 days before 0001-01-01.
    first_ad = (date(1, 1, 1) - EPOCH).days
    assert avro_round_trip(column, "0001-01-01 BC", logical=False) == first_ad - 366
    assert avro_round_trip(column, "0001-12-31 BC", logical=False) == first_ad - 1
    assert json_value(column, "0001-01-01 BC") == "0000-01-01"
    assert json_value(column, "0044-03-15 BC") == "-0043-03-15"
    # 10000-01-01 is 365 days after 9999-01-01 (9999 is not a leap year).
    assert avro_round_trip(column, "10000-01-01", logical=False) == (date(9999, 1, 1) - EPOCH).days + 365
    assert json_value(column, "10000-01-01") == "+10000-01-01"


@pytest.mark.parametrize(
    ("text", "sentinel"), [("infinity", DATE_POS_INFINITY), ("-infinity", DATE_NEG_INFINITY)]
)
def test_date_infinities_are_sentinels(text: str, sentinel: int) -> None:
    column = mapped(PgType.DATE)
    assert avro_round_trip(column, text, logical=False) == sentinel
    assert json_value(column, text) == text


@given(st.integers(min_value=-3_000_000, max_value=3_000_000))
def test_civil_calendar_round_trips(days: int) -> None:
    year, month, day = civil_from_days(days)
    assert days_from_civil(year, month, day) == days
    if 1 <= year <= 9999:
        assert date(year, month, day) == EPOCH + timedelta(days=days)


@pytest.mark.parametrize(
    "text",
    ["2024-01-02 03:04:05.123456", "2024-01-02 03:04:05", "1900-02-28 23:59:59.5", "0001-01-01 00:00:00"],
)
def test_timestamp_is_local_micros(text: str) -> None:
    column = mapped(PgType.TIMESTAMP)
    assert column.avro_schema == {"type": "long", "logicalType": "local-timestamp-micros"}
    expected = datetime.fromisoformat(text)
    assert avro_round_trip(column, text) == expected
    assert json_value(column, text) == expected.isoformat(timespec="microseconds")


@pytest.mark.parametrize(
    "text",
    [
        "2024-01-02 03:04:05.123456+00",
        "2024-01-02 08:34:05.5+05:30",
        "2023-12-31 22:04:05-05",
        "1800-01-01 05:53:28+05:53:28",
        "1969-12-31 23:59:59.999999+00",
    ],
)
def test_timestamptz_is_utc_micros_whatever_the_offset(text: str) -> None:
    column = mapped(PgType.TIMESTAMPTZ)
    assert column.avro_schema == {"type": "long", "logicalType": "timestamp-micros"}
    hours, _, rest = text.rpartition("+") if "+" in text[19:] else text.rpartition("-")
    offset_text = text[len(hours) :]
    sign = 1 if offset_text[0] == "+" else -1
    parts = [int(p) for p in offset_text[1:].split(":")] + [0, 0]
    offset = timezone(sign * timedelta(hours=parts[0], minutes=parts[1], seconds=parts[2]))
    expected = datetime.fromisoformat(hours).replace(tzinfo=offset).astimezone(UTC)
    assert avro_round_trip(column, text) == expected
    assert json_value(column, text) == expected.replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"


def test_bc_timestamps_are_exact() -> None:
    column = mapped(PgType.TIMESTAMPTZ)
    first_ad = (date(1, 1, 1) - EPOCH).days
    micros = avro_round_trip(column, "0001-12-31 23:00:00+00 BC", logical=False)
    assert micros == ((first_ad - 1) * 86_400 + 23 * 3600) * 1_000_000
    assert json_value(column, "0001-12-31 23:00:00+00 BC") == "0000-12-31T23:00:00.000000Z"
    assert json_value(mapped(PgType.TIMESTAMP), "0044-03-15 12:00:00 BC") == "-0043-03-15T12:00:00.000000"


@pytest.mark.parametrize("oid", [PgType.TIMESTAMP, PgType.TIMESTAMPTZ])
@pytest.mark.parametrize(
    ("text", "sentinel"), [("infinity", TIMESTAMP_POS_INFINITY), ("-infinity", TIMESTAMP_NEG_INFINITY)]
)
def test_timestamp_infinities_are_sentinels(oid: int, text: str, sentinel: int) -> None:
    column = mapped(oid)
    assert avro_round_trip(column, text, logical=False) == sentinel
    assert json_value(column, text) == text


def test_timestamp_beyond_avro_long_is_a_data_error() -> None:
    with pytest.raises(ConversionError, match="timestamp-micros"):
        mapped(PgType.TIMESTAMPTZ).avro_value("294276-12-31 23:59:59+00")


@pytest.mark.parametrize("text", ["00:00:00", "04:05:06.789", "23:59:59.999999"])
def test_time(text: str) -> None:
    column = mapped(PgType.TIME)
    assert column.avro_schema == {"type": "long", "logicalType": "time-micros"}
    assert avro_round_trip(column, text) == time.fromisoformat(text)
    assert json_value(column, text) == time.fromisoformat(text).isoformat(timespec="microseconds")


def test_time_end_of_day() -> None:
    column = mapped(PgType.TIME)
    assert avro_round_trip(column, "24:00:00", logical=False) == 86_400 * 1_000_000
    assert json_value(column, "24:00:00") == "24:00:00.000000"


def test_timetz_is_its_iso_text() -> None:
    column = mapped(PgType.TIMETZ)
    assert column.avro_schema == "string"
    assert avro_round_trip(column, "04:05:06.5+05:30") == "04:05:06.5+05:30"
    assert json_value(column, "04:05:06-08") == "04:05:06-08"


@pytest.mark.parametrize(
    ("text", "months", "days", "micros"),
    [
        ("00:00:00", 0, 0, 0),
        ("1 year 2 mons 3 days 04:05:06.5", 14, 3, (4 * 3600 + 5 * 60 + 6) * 1_000_000 + 500_000),
        ("-1 years -2 mons +3 days -04:05:06.5", -14, 3, -((4 * 3600 + 5 * 60 + 6) * 1_000_000 + 500_000)),
        ("1 day 25:00:00", 0, 1, 25 * 3600 * 1_000_000),
        ("-00:00:00.000001", 0, 0, -1),
        ("1 mon", 1, 0, 0),
        ("2562047788:00:54.775807", 0, 0, 2**63 - 1),
    ],
)
def test_interval_record(text: str, months: int, days: int, micros: int) -> None:
    column = mapped(PgType.INTERVAL)
    assert column.avro_schema["type"] == "record"  # type: ignore[index]
    assert avro_round_trip(column, text) == {"months": months, "days": days, "micros": micros}


@pytest.mark.parametrize(
    ("text", "iso"),
    [
        ("00:00:00", "PT0S"),
        ("-1 years -2 mons +3 days -04:05:06.5", "P-1Y-2M3DT-4H-5M-6.5S"),
        ("1 day 25:00:00", "P1DT25H"),
        ("-00:00:00.5", "PT-0.5S"),
        ("1 mon -00:00:00.000001", "P1MT-0.000001S"),
    ],
)
def test_interval_json_is_postgres_iso_8601(text: str, iso: str) -> None:
    # The expected spellings are Postgres 15's own under IntervalStyle=iso_8601 for the same values.
    assert json_value(mapped(PgType.INTERVAL), text) == iso
