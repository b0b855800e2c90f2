"""A table's source watermark: the highest commit LSN up to which the lake holds every transaction.

Pure logic, no Spark (the I/O is in `watermark_io`). docs/lakehouse.md ("The lake's consistency
across tables") holds the argument; in short:

- The worker publishes **progress** events to the control topic (`kafka_contract.control`): `lsn`,
  the highest commit LSN of which every transaction had been acknowledged by Kafka before the event
  was made, and for every partition of its topics an offset bound taken afterwards: each message of
  those transactions lies below it (Kafka's high watermark only passes a message once acks=all
  acknowledged it, and only grows).
- A merge batch reads every partition of its topics from the previous batch's end offsets up to its
  own (`ends`, exact: what the streaming checkpoint planned, not the largest offset seen, which on a
  compacted topic or after transaction markers lies below the end). Batches commit in order, so once
  a batch committed, everything below its ends is applied.
- So a progress event is **proven** for a table once a committed batch's ends reach its bound on every
  partition of the table's topic and of the control topic (TRUNCATE and DDL events live there). A
  partition the event does not list held nothing of those transactions (the worker lists every topic
  of its prefix it sees and every one it wrote to), so it needs no bound.

A table version's `Mark` holds two positions: `watermark`, every transaction committed at or before
it is applied, and `applied`, the newest change applied at all. The version equals the source as of
W exactly when `applied <= W <= watermark`: every transaction up to W is in, none after it.

A table with nothing in a batch has no commit to carry its mark: the batch records it in the lake's
**idle marks** instead (`IdleMark`, one commit per batch for all such tables), and readers add those
to the table's own marked versions (`with_idle`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kafka_contract import control

# (topic, partition) -> offset
Offsets = Mapping[tuple[str, int], int]
# Unproven progress events kept between batches: beyond this the oldest go (a newer proven event
# implies every older one, so dropping them only delays the watermark, never falsifies it).
MAX_PENDING = 512
METADATA_KEY = "bottledwater"
IDLE_KEY = "idle"
WATERMARK_PROPERTY = "bottledwater.watermark"
NO_POSITION = 0  # no LSN is 0 in Postgres


@dataclass(frozen=True)
class Progress:
    """One progress event: every transaction committed at or before `lsn` lies below `offsets`."""

    lsn: int
    offsets: Offsets
    at: datetime | None = None

    def proven(self, ends: Offsets, topics: Iterable[str]) -> bool:
        """Whether a batch that read up to `ends` holds every message of `topics` this event covers."""
        wanted = frozenset(topics)
        for (topic, partition), bound in self.offsets.items():
            if topic in wanted and bound > 0 and ends.get((topic, partition), 0) < bound:
                return False
        return True


def progress_of(record: Mapping[str, Any]) -> Progress | None:
    """The progress event in a decoded control record, None for any other control event."""
    if record.get("op") != control.PROGRESS:
        return None
    at = record.get("commit_ts")
    return Progress(
        int(record["lsn"]), control.progress_offsets(record), at if isinstance(at, datetime) else None
    )


def spark_end_offsets(offsets_file: str) -> dict[tuple[str, int], int]:
    """The end offsets of a micro-batch from Structured Streaming's `offsets/<batchId>` file: a version
    line, the batch metadata, then one JSON line per source (the Kafka source's `{topic: {partition:
    offset}}`; several sources are merged)."""
    lines = [line for line in offsets_file.splitlines() if line.strip()]
    if not lines or not lines[0].startswith("v"):
        raise ValueError(
            "not a Structured Streaming offsets file (no version line): is the checkpoint path right?"
        )
    ends: dict[tuple[str, int], int] = {}
    for line in lines[2:]:
        parsed = json.loads(line)
        if not isinstance(parsed, dict):
            continue  # another source's offset form
        for topic, partitions in parsed.items():
            if isinstance(partitions, dict):
                for partition, offset in partitions.items():
                    ends[(str(topic), int(partition))] = int(offset)
    return ends


@dataclass(frozen=True)
class Mark:
    """What a table version holds: every transaction committed at or before `watermark`, and no
    change after `applied` (NO_POSITION: none yet). `at`: when the worker took the offsets that
    proved `watermark` (its clock, epoch microseconds; None if unknown), for the lag."""

    watermark: int
    applied: int
    at: int | None = None

    def exact_at(self, position: int) -> bool:
        """The version equals the source as of `position` (a commit LSN)."""
        return self.applied <= position <= self.watermark

    def advanced(self, proven: Progress | None, batch_applied: int | None) -> Mark:
        """The mark after a batch: neither position ever goes back (a replayed or restored batch
        changes no row it already applied, so what the table held, it still holds). An event that
        proves the same watermark again, later, moves its `at` on (`refreshed`)."""
        applied = self.applied if batch_applied is None else max(self.applied, batch_applied)
        if proven is None or proven.lsn < self.watermark:
            return Mark(self.watermark, applied, self.at)
        if proven.lsn == self.watermark:
            return Mark(self.watermark, applied, self.refreshed_at(proven))
        return Mark(proven.lsn, applied, None if proven.at is None else epoch_micros(proven.at))

    def refreshed_at(self, proven: Progress) -> int | None:
        """`at` after `proven`, an event of this watermark: the later of the two proofs. The worker
        publishes the same position again only while Postgres has nothing newer to send
        (cdc_worker.shell.stream.progress), so a later proof of it says the source was still there
        then: on an idle source the lag stays about the worker's idle interval."""
        if proven.lsn != self.watermark or proven.at is None:
            return self.at
        again = epoch_micros(proven.at)
        return again if self.at is None else max(self.at, again)

    def same_positions(self, other: Mark) -> bool:
        """Both marks hold the same transactions (whenever each was proven)."""
        return (self.watermark, self.applied) == (other.watermark, other.applied)

    def metadata(self) -> str:
        """The Delta commit's user metadata."""
        fields = {"watermark": self.watermark, "applied": self.applied, "at": self.at}
        return json.dumps({METADATA_KEY: fields}, sort_keys=True)

    def property_value(self) -> str:
        """The table property's value, `<watermark>/<applied>`."""
        return f"{self.watermark}/{self.applied}"


START = Mark(NO_POSITION, NO_POSITION)


def parse_mark(text: str | None) -> Mark | None:
    """A Mark back from a commit's user metadata or the table property (None: not one of ours)."""
    if not text:
        return None
    if not text.startswith("{"):
        watermark, _, applied = text.partition("/")
        return Mark(int(watermark), int(applied or NO_POSITION)) if watermark.isdigit() else None
    try:
        parsed = json.loads(text)
    except ValueError:
        return None
    inner = parsed.get(METADATA_KEY) if isinstance(parsed, dict) else None
    if not isinstance(inner, dict) or "watermark" not in inner:
        return None
    at = inner.get("at")
    return Mark(
        int(inner["watermark"]), int(inner.get("applied", NO_POSITION)), None if at is None else int(at)
    )


def epoch_micros(at: datetime) -> int:
    """A timezone-aware time as epoch microseconds."""
    delta = at - datetime(1970, 1, 1, tzinfo=UTC)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def applied_position(lsn: int, op: str | None) -> int:
    """The source position a change stands for: a snapshot row (op r) carries the slot's consistent
    point C and shows the table as of every transaction committed before C, so it counts as C - 1."""
    return lsn - 1 if op == "r" else lsn


def table_control_position(records: Iterable[Mapping[str, Any]], topic: str) -> int | None:
    """The newest TRUNCATE or DDL event of the table behind `topic`: they change the table too."""
    positions = [
        int(r["lsn"])
        for r in records
        if r.get("topic") == topic and r.get("op") in (control.TRUNCATE, control.DDL)
    ]
    return max(positions, default=None)


def newest(*positions: int | None) -> int | None:
    """The largest of the positions given, None when none is."""
    return max((p for p in positions if p is not None), default=None)


def _recency(mark: Mark) -> tuple[int, int, int]:
    return mark.watermark, mark.applied, -1 if mark.at is None else mark.at


def newest_mark(marks: Iterable[Mark]) -> Mark | None:
    """The mark with the highest watermark (ties: the highest applied, then the latest proof), None
    of none."""
    return max(marks, key=_recency, default=None)


def newer(first: Mark, second: Mark | None) -> Mark:
    """The newer of two marks, as `newest_mark` orders them; `first` when `second` is None."""
    return first if second is None else max(first, second, key=_recency)


def table_key(mirror_path: str) -> str:
    """The key of a mirror in the idle marks: `schema/table`, its path's last two parts (the same
    whatever the warehouse's URI scheme)."""
    return "/".join(mirror_path.rstrip("/").split("/")[-2:])


def warehouse_of(mirror_path: str) -> str:
    """The warehouse of a mirror at `<warehouse>/<schema>/<table>`."""
    return mirror_path.rstrip("/").rsplit("/", 2)[0]


@dataclass(frozen=True)
class IdleMark:
    """A table with nothing in a batch: its mirror's `version` (unchanged by the batch) holds every
    transaction up to `mark.watermark`, and so does its history table's `history_version` (None: it
    has none). `table`: `table_key` of the mirror."""

    table: str
    version: int
    history_version: int | None
    mark: Mark


def idle_metadata(marks: Iterable[IdleMark]) -> str:
    """The user metadata of an idle-marks commit."""
    entries = [
        {
            "table": m.table,
            "version": m.version,
            "history": m.history_version,
            "watermark": m.mark.watermark,
            "applied": m.mark.applied,
            "at": m.mark.at,
        }
        for m in marks
    ]
    return json.dumps({METADATA_KEY: {IDLE_KEY: entries}}, sort_keys=True)


def by_table(marks: Iterable[IdleMark]) -> dict[str, list[IdleMark]]:
    """Idle marks grouped by their table's key, each table's in the order given."""
    grouped: dict[str, list[IdleMark]] = {}
    for mark in marks:
        grouped.setdefault(mark.table, []).append(mark)
    return grouped


def parse_idle(text: str | None) -> list[IdleMark]:
    """The idle marks of a commit's user metadata ([] for any other commit)."""
    try:
        parsed = json.loads(text) if text and text.startswith("{") else None
    except ValueError:
        return []
    inner = parsed.get(METADATA_KEY) if isinstance(parsed, dict) else None
    entries = inner.get(IDLE_KEY) if isinstance(inner, dict) else None
    if not isinstance(entries, list):
        return []
    marks = []
    for e in entries:
        at, history = e.get("at"), e.get("history")
        mark = Mark(int(e["watermark"]), int(e["applied"]), None if at is None else int(at))
        marks.append(
            IdleMark(str(e["table"]), int(e["version"]), None if history is None else int(history), mark)
        )
    return marks


class ProgressLog:
    """The progress events a merge has read and not yet proven, across its batches."""

    def __init__(self) -> None:
        self._pending: list[Progress] = []

    def add(self, events: Iterable[Progress]) -> None:
        self._pending.extend(events)
        self._pending.sort(key=lambda p: p.lsn)
        del self._pending[:-MAX_PENDING]

    def proven(self, ends: Offsets, topics: Iterable[str]) -> Progress | None:
        """The newest event proven for a table read from `topics` up to `ends` (None: none yet)."""
        wanted = tuple(topics)
        for event in reversed(self._pending):
            if event.proven(ends, wanted):
                return event
        return None

    def forget_through(self, lsn: int) -> None:
        """Drop events no newer than `lsn` (proven for every table the merge serves)."""
        self._pending = [p for p in self._pending if p.lsn > lsn]

    def __len__(self) -> int:
        return len(self._pending)


@dataclass(frozen=True)
class Version:
    """One Delta version of a table and its mark (history tables: the watermark alone matters)."""

    version: int
    mark: Mark


def marked_in(commits: Iterable[tuple[int, str | None]]) -> list[Version]:
    """The versions whose commit's user metadata is a mark, oldest first, of (version, metadata)."""
    marks = ((version, parse_mark(metadata)) for version, metadata in commits)
    return sorted((Version(v, m) for v, m in marks if m is not None), key=lambda v: v.version)


@dataclass(frozen=True)
class TableVersions:
    """A table's marked versions, oldest first, and the positions its SCD2 history table can serve
    (a history table answers as-of queries by its validity columns, at any position from its first
    version's watermark up to its newest)."""

    name: str
    versions: Sequence[Version]
    history: tuple[int, int] | None = None


def readable_at(table: TableVersions, position: int) -> Version | None:
    """The newest version of `table` exactly at `position`, if there is one."""
    for candidate in reversed(table.versions):
        if candidate.mark.exact_at(position):
            return candidate
    return None


def with_idle(table: TableVersions, idle: Iterable[IdleMark]) -> TableVersions:
    """A table's versions with its own idle marks: each is one more marked version of the mirror,
    and extends what its history table serves."""
    versions = [*table.versions, *(Version(m.version, m.mark) for m in idle)]
    versions.sort(key=lambda v: (v.version, v.mark.watermark, v.mark.applied))
    history = table.history
    served = [m.mark.watermark for m in idle if m.history_version is not None]
    if history is not None and served:
        history = (history[0], max(history[1], *served))
    return TableVersions(table.name, versions, history)


def common_watermark(tables: Sequence[TableVersions], at_most: int | None = None) -> int | None:
    """The newest position W (<= `at_most`) at which every table can be read whole: a mirror version
    with applied <= W <= watermark, or a history table serving W. None: no such W.

    The answer is always some version's watermark (the upper end of an interval) or a history
    watermark, so those are the only candidates tried, newest first."""
    if not tables:
        return None
    candidates = {v.mark.watermark for t in tables for v in t.versions}
    candidates |= {t.history[1] for t in tables if t.history is not None}
    if at_most is not None:
        candidates.add(at_most)  # a position asked for is its own best answer when all serve it
    for position in sorted((c for c in candidates if c > NO_POSITION), reverse=True):
        if at_most is not None and position > at_most:
            continue
        if all(_serves(t, position) for t in tables):
            return position
    return None


def proven_at(tables: Iterable[TableVersions], position: int | None) -> int | None:
    """When the worker last proved `position` (epoch microseconds), from the tables' versions marked
    at it; None when none says."""
    return max(
        (
            v.mark.at
            for t in tables
            for v in t.versions
            if v.mark.at is not None and v.mark.watermark == position
        ),
        default=None,
    )


def _serves(table: TableVersions, position: int) -> bool:
    if table.history is not None and table.history[0] <= position <= table.history[1]:
        return True
    return readable_at(table, position) is not None


def tail_base(table: TableVersions, position: int) -> Version | None:
    """The version a read at `position` applies the changelog's tail to: of the versions holding
    nothing after it (applied <= position), the one holding the most (the newest watermark, then the
    newest version), so its tail is the shortest. None: every version is past `position`."""
    below = [v for v in table.versions if v.mark.applied <= position]
    return max(below, key=lambda v: (v.mark.watermark, v.version), default=None)
