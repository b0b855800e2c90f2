"""LSN text <-> int, against values Postgres itself prints (`SELECT '16/B374D848'::pg_lsn - '0/0'`)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdc_worker.core.lsn import MAX_LSN, LsnError, format_lsn, parse_lsn


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("0/0", 0),
        ("16/B374D848", 0x16_B374_D848),
        ("0/1", 1),
        ("1/0", 1 << 32),
        ("FFFFFFFF/FFFFFFFF", MAX_LSN),
        ("0/16B3748", 23803720),
    ],
)
def test_known_values_both_ways(text: str, value: int) -> None:
    assert parse_lsn(text) == value
    assert format_lsn(value) == text


def test_parse_accepts_lower_case_and_padding() -> None:
    assert parse_lsn("16/b374d848") == 0x16_B374_D848
    assert parse_lsn("00000016/0B374D84") == 0x16_0B37_4D84


@pytest.mark.parametrize(
    "text",
    ["", "16", "16/", "/B374D848", "16/B374D848/1", "G/0", "123456789/0", "0/123456789", "-1/0", "16 /1"],
)
def test_parse_rejects_bad_text(text: str) -> None:
    with pytest.raises(LsnError, match="invalid LSN"):
        parse_lsn(text)


def test_parse_rejects_non_text() -> None:
    with pytest.raises(LsnError):
        parse_lsn(123)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [-1, MAX_LSN + 1])
def test_format_rejects_out_of_range(value: int) -> None:
    with pytest.raises(LsnError, match="outside"):
        format_lsn(value)


@pytest.mark.parametrize("value", [1.5, "16/0", True, None])
def test_format_rejects_non_int(value: object) -> None:
    with pytest.raises(LsnError):
        format_lsn(value)  # type: ignore[arg-type]


@given(st.integers(min_value=0, max_value=MAX_LSN))
def test_round_trip(value: int) -> None:
    text = format_lsn(value)
    assert parse_lsn(text) == value
    # Same text Postgres prints: no padding, upper case.
    high, low = text.split("/")
    assert high == f"{value >> 32:X}" and low == f"{value & 0xFFFFFFFF:X}"
