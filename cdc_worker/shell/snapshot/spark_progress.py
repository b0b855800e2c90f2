"""The Spark snapshot's progress as the worker's log (and a Dagster run, which takes the worker's
log lines) shows it: tables and ranges done, rows published, rows/s, ETA.

Counts reach the driver as tasks finish (a Spark accumulator of rows and ranges per table), so
they move a range at a time. A line is logged when a table's last range is done, and every
`interval` seconds in between; the ETA comes from `pg_class.reltuples` (none for a table never
analyzed). No pyspark here: the accumulator's parameter is a plain object with `zero` and
`addInPlace`, which is all `SparkContext.accumulator` asks of it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

# Per table (qualified name): rows published and acknowledged, ranges done.
Counts = dict[str, tuple[int, int]]


class CountsParam:
    """The accumulator's parameter: sums `Counts` table by table."""

    def zero(self, value: Counts) -> Counts:
        return {}

    def addInPlace(self, first: Counts, second: Counts) -> Counts:
        for table, (rows, ranges) in second.items():
            had_rows, had_ranges = first.get(table, (0, 0))
            first[table] = (had_rows + rows, had_ranges + ranges)
        return first


@dataclass
class LoadProgress:
    """What the driver knows of a running load and the lines it logs about it."""

    ranges: Mapping[str, int]  # per table: its ranges
    expected_rows: int  # sum of the tables' estimates, 0 when unknown
    interval: float
    started: float
    _finished: set[str] = field(default_factory=set)
    _last_line: float = 0.0

    def __post_init__(self) -> None:
        self._last_line = self.started

    def lines(self, counts: Counts, now: float) -> list[str]:
        """The lines to log now: one per table just finished, and the summary when one of them
        finished or `interval` has passed since the last line."""
        lines = []
        for table, (rows, done) in sorted(counts.items()):
            if table not in self._finished and done >= self.ranges.get(table, 0):
                self._finished.add(table)
                lines.append(f"spark snapshot: {table} done, {rows:,} rows")
        if lines or now - self._last_line >= self.interval:
            lines.append(self.summary(counts, now))
            self._last_line = now
        return lines

    def summary(self, counts: Counts, now: float) -> str:
        rows = sum(r for r, _ in counts.values())
        done = sum(d for _, d in counts.values())
        elapsed = now - self.started
        rate = rows / elapsed if elapsed > 0 else 0.0
        line = (
            f"spark snapshot: {len(self._finished)}/{len(self.ranges)} tables, "
            f"{done}/{sum(self.ranges.values())} ranges, {rows:,} rows, {rate:,.0f} rows/s"
        )
        if self.expected_rows > 0:
            percent = min(100.0, 100.0 * rows / self.expected_rows)
            line += f", {percent:.0f}% of ~{self.expected_rows:,}"
            if rate > 0 and self.expected_rows > rows:
                line += f", ETA {(self.expected_rows - rows) / rate:,.0f}s"
        return line
