"""A per-relation compiled reader of the common pgoutput Insert: its tuple straight into a row.

`pgoutput.decode_message` reads any message, column by column in a loop, into an `Insert` that the
assembler turns into a `ChangeEvent` that the serializer unpacks again. For the Insert of a known
relation version outside a stream, which is nearly every message of a busy stream, the fused path
(`fast_insert`) skips all three: `compile_insert_reader` generates one straight-line function per
column count that reads the tuple into the row tuple the encoders take.

The reader accepts only what the general decoder reads without surprise: text and NULL columns,
exactly `column_count` of them, the buffer consumed to its last byte. Anything else (unchanged
TOAST, binary values, a wrong count, a truncated or padded buffer) makes it return None, and the
caller hands the message to the general path, which decodes it again and reports any error exactly.

`raw_strings` columns are left as their UTF-8 bytes instead of `str`, for an Avro writer that copies
them into the message as they are (an Avro string is its UTF-8 bytes). They are validated the cheap
way: an ASCII slice is valid UTF-8 by definition, any other is decoded (and the result dropped), so
invalid UTF-8 still raises here, and the general path then raises `PgOutputDecodeError` for it.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Collection, Sequence
from typing import Any

from cdc_worker.core.model import ColumnValue
from cdc_worker.core.pgoutput.messages import ColumnKind, MessageType, TupleKind

# A row of text (`str`), raw UTF-8 (`bytes`, for `raw_strings` columns) or NULL values.
InsertReader = Callable[[bytes], tuple[ColumnValue, ...] | None]

INSERT_CODE = MessageType.INSERT.value
NEW_TUPLE = TupleKind.NEW.value
# Byte 0 the message type, 1-4 the relation OID, 5 the tuple kind, 6-7 the column count.
INSERT_HEADER = struct.Struct(">IBH")
INSERT_HEADER_OFFSET = 1
TUPLE_DATA_OFFSET = INSERT_HEADER_OFFSET + INSERT_HEADER.size
# A text column: its kind byte, then its length as an Int32, then the bytes.
_TEXT_HEADER_SIZE = 5


def insert_reader_source(column_count: int, raw_strings: Collection[int] = ()) -> list[str]:
    """The body lines of a reader of an Insert's `column_count` columns from `buf`: they bind
    `v0`, `v1`, ... or `return None` (see `compile_insert_reader`); the names they use are
    `READER_SCOPE`'s. `avro_binary.compile_fused_writer` puts them in front of an Avro writer."""
    lines = [f"    p = {TUPLE_DATA_OFFSET}"]
    for index in range(column_count):
        v = f"v{index}"
        lines += [
            "    k = buf[p]",
            f"    if k == {ColumnKind.TEXT.value}:",
            f"        s = p + {_TEXT_HEADER_SIZE}",
            "        p = s + _u32(buf, p + 1)[0]",
        ]
        if index in raw_strings:
            lines += [
                f"        {v} = buf[s:p]",
                f"        if not {v}.isascii():",
                f"            {v}.decode()",
            ]
        else:
            lines.append(f"        {v} = buf[s:p].decode()")
        lines += [
            f"    elif k == {ColumnKind.NULL.value}:",
            f"        {v} = None",
            "        p += 1",
            "    else:",  # unchanged TOAST, binary or garbage: the general path's business
            "        return None",
        ]
    # A length running past the end leaves a short slice and `p` beyond the end: caught here.
    lines.append("    if p != len(buf):")
    lines.append("        return None")
    return lines


READER_SCOPE: dict[str, object] = {"_u32": struct.Struct(">I").unpack_from}


def compile_insert_reader(column_count: int, raw_strings: Collection[int] = ()) -> InsertReader:
    """A function reading the new tuple of an Insert message of `column_count` columns, or None.

    The caller checks the header (type, tuple kind, count) first: the reader starts at the first
    column. It may raise (struct.error, IndexError, UnicodeDecodeError) on a malformed buffer; the
    caller treats that as None, the general path then reports it.
    """
    lines = ["def read(buf):", *insert_reader_source(column_count, raw_strings)]
    lines.append("    return (" + "".join(f"v{index}, " for index in range(column_count)) + ")")
    source = "\n".join(lines) + "\n"
    scope = dict(READER_SCOPE)
    # Built from the column count and constants only, never from names or data.
    exec(compile(source, f"<insert reader of {column_count} columns>", "exec"), scope)
    reader: InsertReader = scope["read"]  # type: ignore[assignment]
    reader.__doc__ = source
    return reader


def reading_into(
    read: InsertReader, write: Callable[[Sequence[Any]], tuple[bytes | None, bytes]]
) -> Callable[[bytes], tuple[bytes | None, bytes] | None]:
    """`read` then `write` the row it read (the JSON encoder's fused path); None when `read` declines."""

    def encode(message: bytes) -> tuple[bytes | None, bytes] | None:
        row = read(message)
        return None if row is None else write(row)

    return encode


class InsertTupleReading:
    """The encoders' `TupleReading` for an Insert's new tuple: this module's generated readers."""

    def source(self, column_count: int, raw_strings: Collection[int]) -> tuple[list[str], dict[str, object]]:
        return insert_reader_source(column_count, raw_strings), READER_SCOPE

    def reader(self, column_count: int) -> InsertReader:
        return compile_insert_reader(column_count)


INSERT_TUPLE_READING = InsertTupleReading()
