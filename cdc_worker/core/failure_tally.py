"""Repeated failures told once each: the first of a kind in full, the rest counted, and one summary
line per kind at the end.

A broker outage fails every message in flight with the same error (7,176 lines for one 30 s outage,
found in a fault experiment): a log that long hides the one line that matters. The caller logs a
failure only when `record` says it is the first of its kind, and logs `summary()` when it stops.
Pure: no logging here, so the snapshot and the stream word their lines themselves.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# What makes failures "the same": what failed, worded for the summary line (`messages not
# delivered: Local: Message timed out`), and the table.
FailureKind = tuple[str, str]


@dataclass
class FailureTally:
    """Counts failures by kind, remembering the first reason of each."""

    _first: dict[FailureKind, str] = field(default_factory=dict)
    _counts: dict[FailureKind, int] = field(default_factory=dict)

    def record(self, kind: FailureKind, reason: str) -> bool:
        """Count one failure; True when it is the first of its kind (the one to log in full)."""
        count = self._counts.get(kind, 0)
        self._counts[kind] = count + 1
        if count:
            return False
        self._first[kind] = reason
        return True

    def count(self, kind: FailureKind) -> int:
        return self._counts.get(kind, 0)

    def summary(self) -> list[str]:
        """One line per kind that failed more than once, with its count and first reason; kinds
        seen once were told in full already."""
        return [
            f"{what} ({table}): {count} in all, the first: {self._first[(what, table)]}"
            for (what, table), count in self._counts.items()
            if count > 1
        ]
