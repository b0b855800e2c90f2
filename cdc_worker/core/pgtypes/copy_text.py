"""Parser for PostgreSQL's COPY TEXT format, as `COPY ... TO STDOUT` writes it.

The snapshot reads each table with COPY and must produce the same values pgoutput sends while
streaming: both are the type's text output, so a snapshot row and a streamed row of the same data
go through the same converters. In COPY TEXT, a row is one line (`\\n` ends it), columns are
separated by tabs, `\\N` is NULL, and tab, newline, carriage return and backslash inside a value are
backslash-escaped. On input Postgres also accepts `\\b \\f \\v`, 1-3 octal digits and `\\x` with 1-2 hex
digits, which name single bytes of the UTF-8 text; those are parsed too.

Parsing is at the byte level so that an octal or hex escape can produce one byte of a multibyte
character, then each value is decoded as UTF-8 (the worker requires UTF8 databases).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

CopyRow = tuple[str | None, ...]

_TAB = b"\t"
_NEWLINE = b"\n"
_BACKSLASH = b"\\"
_NULL_MARKER = b"\\N"  # the whole raw field, before unescaping: `\\N` escaped is the text "\N"
_OCTAL_DIGITS = frozenset(b"01234567")
_HEX_DIGITS = frozenset(b"0123456789abcdefABCDEF")
_MAX_OCTAL_DIGITS = 3
_MAX_HEX_DIGITS = 2
_OCTAL_BASE = 8
_HEX_BASE = 16
_BYTE_MASK = 0xFF  # Postgres keeps the low 8 bits of an octal escape such as \777
_HEX_PREFIX = ord("x")
_SIMPLE_ESCAPES = {
    ord("b"): b"\b",
    ord("f"): b"\f",
    ord("n"): b"\n",
    ord("r"): b"\r",
    ord("t"): b"\t",
    ord("v"): b"\v",
}


class CopyTextError(ValueError):
    """A line that is not valid COPY TEXT (a lone trailing backslash, invalid UTF-8...)."""


def _unescape(field: bytes) -> str:
    """One raw field that contains a backslash -> its text."""
    out = bytearray()
    size = len(field)
    pos = 0
    while True:
        escape = field.find(_BACKSLASH, pos)
        if escape < 0:
            out += field[pos:]
            break
        out += field[pos:escape]
        pos = escape + 1
        if pos >= size:
            raise CopyTextError(f"field {field!r} ends with a lone backslash")
        char = field[pos]
        pos += 1
        if char in _OCTAL_DIGITS:
            value = char - ord("0")
            end = min(pos + _MAX_OCTAL_DIGITS - 1, size)
            while pos < end and field[pos] in _OCTAL_DIGITS:
                value = value * _OCTAL_BASE + field[pos] - ord("0")
                pos += 1
            out.append(value & _BYTE_MASK)
        elif char == _HEX_PREFIX and pos < size and field[pos] in _HEX_DIGITS:
            end = min(pos + _MAX_HEX_DIGITS, size)
            start = pos
            while pos < end and field[pos] in _HEX_DIGITS:
                pos += 1
            out.append(int(field[start:pos], _HEX_BASE))
        else:
            # \b \f \n \r \t \v are control characters; any other escaped byte stands for itself
            # (\\ is a backslash, \x without hex digits is an "x").
            out += _SIMPLE_ESCAPES.get(char) or bytes((char,))
    try:
        return out.decode()
    except UnicodeDecodeError as exc:
        raise CopyTextError(f"field {field!r} is not valid UTF-8 once unescaped: {exc}") from exc


def parse_copy_text_line(line: bytes) -> CopyRow:
    """One COPY TEXT line (with or without its trailing newline) -> its values, NULL as None."""
    if line.endswith(_NEWLINE):
        line = line[:-1]
    try:
        if _BACKSLASH not in line:
            # The common case: no NULL, no escape; one decode and one split in C.
            return tuple(line.decode().split("\t"))
        return tuple(
            None if field == _NULL_MARKER else (_unescape(field) if _BACKSLASH in field else field.decode())
            for field in line.split(_TAB)
        )
    except UnicodeDecodeError as exc:
        raise CopyTextError(f"COPY line {line[:80]!r} is not valid UTF-8: {exc}") from exc


class CopyTextReader:
    """Splits COPY output arriving in chunks of any size into rows.

    psycopg2's `copy_expert` calls `write(chunk)` with chunks that do not end at line boundaries;
    an escaped newline is `\\n` in the data, so every raw newline ends a row.
    """

    def __init__(self) -> None:
        self._partial = b""
        self.rows_read = 0

    def feed(self, chunk: bytes) -> list[CopyRow]:
        """The rows completed by `chunk`."""
        lines = (self._partial + chunk).split(_NEWLINE) if self._partial else chunk.split(_NEWLINE)
        self._partial = lines.pop()  # the text after the last newline: an unfinished row
        self.rows_read += len(lines)
        return [parse_copy_text_line(line) for line in lines]

    def close(self) -> None:
        """End of data: a row without its newline means the COPY was cut short."""
        if self._partial:
            raise CopyTextError(
                f"COPY data ended in the middle of a row ({len(self._partial)} bytes after the last "
                f"newline, {self._partial[:80]!r}); the COPY was interrupted"
            )


def iter_copy_text_rows(chunks: Iterable[bytes]) -> Iterator[CopyRow]:
    """Every row of COPY TEXT data given in chunks of any size."""
    reader = CopyTextReader()
    for chunk in chunks:
        yield from reader.feed(chunk)
    reader.close()
