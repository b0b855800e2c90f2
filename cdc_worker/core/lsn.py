"""Log sequence numbers: Postgres' `pg_lsn` text form <-> the unsigned 64-bit integer the wire uses.

Postgres prints an LSN as two hexadecimal halves, `%X/%X` (high and low 32 bits, upper case, no
padding), e.g. `16/B374D848`. The replication protocol carries the same value as an Int64, and the
Kafka `bw.lsn` header carries it as a decimal integer, so everything inside the worker is an `int`.
"""

from __future__ import annotations

import re

_HALF_BITS = 32
_HALF_MASK = (1 << _HALF_BITS) - 1
MAX_LSN = (1 << (2 * _HALF_BITS)) - 1
INVALID_LSN = 0  # Postgres' InvalidXLogRecPtr, "0/0"

# Each half is at most 8 hex digits, as pg_lsn's input function accepts.
_LSN_TEXT = re.compile(r"([0-9A-Fa-f]{1,8})/([0-9A-Fa-f]{1,8})")


class LsnError(ValueError):
    """An LSN that is not valid text or not in the unsigned 64-bit range."""


def parse_lsn(text: str) -> int:
    """`"16/B374D848"` -> `0x16B374D848`. Raises `LsnError` for anything `pg_lsn` would reject."""
    if not isinstance(text, str):
        raise LsnError(f"an LSN must be text like '16/B374D848', got {type(text).__name__} {text!r}")
    match = _LSN_TEXT.fullmatch(text.strip())
    if match is None:
        raise LsnError(
            f"invalid LSN {text!r}: expected two hexadecimal halves of at most 8 digits, like '16/B374D848'"
        )
    return (int(match.group(1), 16) << _HALF_BITS) | int(match.group(2), 16)


def format_lsn(lsn: int) -> str:
    """`0x16B374D848` -> `"16/B374D848"`, the text Postgres prints and accepts."""
    if isinstance(lsn, bool) or not isinstance(lsn, int):
        raise LsnError(f"an LSN must be an int, got {type(lsn).__name__} {lsn!r}")
    if not 0 <= lsn <= MAX_LSN:
        raise LsnError(f"LSN {lsn} is outside the unsigned 64-bit range 0..{MAX_LSN}")
    return f"{lsn >> _HALF_BITS:X}/{lsn & _HALF_MASK:X}"
