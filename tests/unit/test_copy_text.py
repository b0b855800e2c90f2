"""COPY TEXT parsing: escapes, NULL, chunked input. `test_pgoutput_captured.py` also checks it
against real `COPY ... TO STDOUT` output of the rows pgoutput streamed."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdc_worker.core.pgtypes.copy_text import (
    CopyTextError,
    CopyTextReader,
    iter_copy_text_rows,
    parse_copy_text_line,
)


def escape_like_postgres(value: str | None) -> bytes:
    """What COPY TO writes for one value (CopySendAttributeOut for the text format)."""
    if value is None:
        return b"\\N"
    out = value.replace("\\", "\\\\")
    for char, escaped in (
        ("\b", "\\b"),
        ("\f", "\\f"),
        ("\n", "\\n"),
        ("\r", "\\r"),
        ("\t", "\\t"),
        ("\v", "\\v"),
    ):
        out = out.replace(char, escaped)
    return out.encode()


def test_plain_line_fast_path() -> None:
    assert parse_copy_text_line(b"1\tann\t2024-01-01\n") == ("1", "ann", "2024-01-01")
    assert parse_copy_text_line(b"single") == ("single",)


def test_empty_strings_are_not_null() -> None:
    assert parse_copy_text_line(b"\t\n") == ("", "")
    assert parse_copy_text_line(b"\n") == ("",)


def test_null_marker_only_as_a_whole_raw_field() -> None:
    assert parse_copy_text_line(b"1\t\\N\t\\N\n") == ("1", None, None)
    # An escaped backslash followed by N is the two-character text "\N", not NULL.
    assert parse_copy_text_line(b"\\\\N\tx") == ("\\N", "x")
    # Inside a longer field \N is just an escaped "N".
    assert parse_copy_text_line(b"a\\Nb") == ("aNb",)


@pytest.mark.parametrize(
    ("raw", "value"),
    [
        (b"a\\tb", "a\tb"),
        (b"line1\\nline2", "line1\nline2"),
        (b"\\r\\b\\f\\v", "\r\b\f\v"),
        (b"back\\\\slash", "back\\slash"),
        (b"\\101\\1012", "AA2"),  # octal: at most three digits
        (b"\\7", "\x07"),
        (b"\\x41\\x4a\\x4", "AJ\x04"),  # hex: one or two digits
        (b"\\xg", "xg"),  # \x without a hex digit is an "x"
        (b"\\q\\:", "q:"),  # any other escaped character stands for itself
        (b"\\303\\251t\\xc3\\xa9", "été"),  # escapes name bytes of a UTF-8 sequence
        ("Zoë 🚀 \\t".encode(), "Zoë 🚀 \t"),
    ],
)
def test_escapes(raw: bytes, value: str) -> None:
    assert parse_copy_text_line(raw) == (value,)
    assert parse_copy_text_line(b"k\t" + raw + b"\t\\N\n") == ("k", value, None)


@pytest.mark.parametrize(
    ("raw", "match"),
    [(b"abc\\", "lone backslash"), (b"\xff\xfe", "not valid UTF-8"), (b"\\377\tx", "not valid UTF-8")],
)
def test_invalid_lines(raw: bytes, match: str) -> None:
    with pytest.raises(CopyTextError, match=match):
        parse_copy_text_line(raw)


values = st.one_of(st.none(), st.text(st.characters(codec="utf-8", exclude_characters="\x00")))


@given(st.lists(st.lists(values, min_size=1, max_size=6), max_size=8), st.data())
def test_round_trip_in_random_chunks(rows: list[list[str | None]], data: st.DataObject) -> None:
    stream = b"".join(b"\t".join(escape_like_postgres(v) for v in row) + b"\n" for row in rows)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=10)))
    chunks = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
    assert list(iter_copy_text_rows(chunks)) == [tuple(row) for row in rows]


def test_reader_counts_rows_and_rejects_a_cut_row() -> None:
    reader = CopyTextReader()
    assert reader.feed(b"1\ta\n2\t") == [("1", "a")]
    assert reader.feed(b"b\n") == [("2", "b")]
    assert reader.rows_read == 2
    reader.close()
    assert reader.feed(b"3\tc") == []
    with pytest.raises(CopyTextError, match="middle of a row"):
        reader.close()
