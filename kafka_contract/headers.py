"""The `bw.*` headers every message carries, and reading them back.

`(bw.lsn, bw.seq)` totally orders the changes of one database; snapshot reads carry the slot's
consistent LSN. `bw.unchanged` names the unchanged TOASTed columns whose value the row does not
carry (comma-separated; absent when none).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

HEADER_OP = "bw.op"
HEADER_LSN = "bw.lsn"
HEADER_SEQ = "bw.seq"
HEADER_XID = "bw.xid"
HEADER_COMMIT_TS = "bw.commit_ts"
HEADER_UNCHANGED = "bw.unchanged"

# `bw.op` values: row changes on table topics, and TRUNCATE on the control topic.
OP_READ = "r"
OP_INSERT = "c"
OP_UPDATE = "u"
OP_DELETE = "d"
OP_TRUNCATE = "t"

MICROS_PER_SECOND = 1_000_000
SECONDS_PER_DAY = 86_400
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class WireFormatError(ValueError):
    """A message that breaks the Kafka contract; the text says what is wrong and how to fix it."""


@dataclass(frozen=True, slots=True)
class EventHeaders:
    """The `bw.*` headers of one message."""

    op: str
    lsn: int
    seq: int
    xid: int
    commit_ts_micros: int
    unchanged: tuple[str, ...]


def header_map(headers: list[tuple[str, bytes | None]] | None) -> dict[str, bytes]:
    return {k: v for k, v in headers or () if v is not None}


def parse_headers(headers: dict[str, bytes], ts_cache: dict[bytes, int] | None = None) -> EventHeaders:
    """The `bw.*` headers; a missing or malformed one is a contract violation, never a default."""
    try:
        op = headers[HEADER_OP].decode()
        lsn = int(headers[HEADER_LSN])
        seq = int(headers[HEADER_SEQ])
        xid = int(headers.get(HEADER_XID, b"0"))
        raw_ts = headers[HEADER_COMMIT_TS]
    except KeyError as exc:
        raise WireFormatError(
            f"message without the {exc.args[0]} header: not written by bottledwater"
        ) from exc
    except ValueError as exc:
        raise WireFormatError(f"malformed bw.* header ({exc})") from exc
    # Every message of a transaction carries the same commit_ts text: parse it once.
    commit_ts = ts_cache.get(raw_ts) if ts_cache is not None else None
    if commit_ts is None:
        commit_ts = iso_micros(raw_ts.decode())
        if ts_cache is not None:
            ts_cache[raw_ts] = commit_ts
    unchanged_raw = headers.get(HEADER_UNCHANGED)
    unchanged = tuple(unchanged_raw.decode().split(",")) if unchanged_raw else ()
    return EventHeaders(op, lsn, seq, xid, commit_ts, unchanged)


def produced_before_commit(headers: Sequence[tuple[str, bytes | None]]) -> bool:
    """A change produced before its commit (a large transaction under exactly-once): `bw.op`,
    `bw.seq`, `bw.xid` first, with no `bw.lsn` nor `bw.commit_ts`; its transaction's commit event on
    the control topic (`control.STREAMED_COMMIT`) gives them."""
    return len(headers) >= 3 and headers[1][0] == HEADER_SEQ


def resolved_headers(
    headers: Sequence[tuple[str, bytes | None]], lsn: int, commit_ts: str
) -> list[tuple[str, bytes | None]]:
    """A change produced before its commit, with its commit's `bw.lsn` and `bw.commit_ts` (the
    commit event's `lsn` and `commit_ts` text), in the layout of every other change."""
    op, seq, xid, *rest = headers
    return [op, (HEADER_LSN, str(lsn).encode()), seq, xid, (HEADER_COMMIT_TS, commit_ts.encode()), *rest]


def iso_utc(timestamp: datetime) -> str:
    """`bw.commit_ts`'s text: ISO-8601 in UTC with microseconds and `Z` (naive: taken as UTC)."""
    utc = timestamp.astimezone(UTC).replace(tzinfo=None) if timestamp.tzinfo else timestamp
    return utc.isoformat(timespec="microseconds") + "Z"  # isoformat pads years < 1000; strftime does not


def iso_micros(text: str) -> int:
    """Microseconds since the epoch of an ISO-8601 timestamp (`Z` or an offset; none means UTC)."""
    parsed = datetime.fromisoformat(text)
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    delta = parsed - _EPOCH
    return (delta.days * SECONDS_PER_DAY + delta.seconds) * MICROS_PER_SECOND + delta.microseconds
