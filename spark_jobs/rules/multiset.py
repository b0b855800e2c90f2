"""How `verify` compares a mirror without a key with its Postgres table: as multisets of rows.

A table captured with `--allow-unkeyed` has no row identity, so its mirror keeps every published
event as a row (docs/lakehouse.md, "Tables without a key"). While the table is insert-only that is
exactly Postgres's rows, duplicates included, so each distinct row must occur as often on both
sides; a count that differs is reported in both directions, the surplus counted row by row.

Once its topic carried an update (REPLICA IDENTITY FULL publishes them without a key), the mirror
holds the row's new version beside its old one, which nothing can find again without a key: no
comparison by value can tell that old version from a row lost or duplicated by the pipeline, so
such a table is refused in one line instead of reported as different. Deletes never reach the topic
(the worker publishes none for an unkeyed table), so the mirror cannot show them: a row deleted in
Postgres is reported as extra in Delta, with a hint saying why it can be.

Pure Python, no Spark: `verify` feeds it the per-row counts it computes, the unit tests literal ones.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

# `_bw_op` values of the events an insert-only table publishes: snapshot reads and inserts. Anything
# else (an update, or an op this code does not know) means rows were replaced, not only added.
INSERT_ONLY_OPS = frozenset({"r", "c"})
OP_NAMES = {"u": "update", "d": "delete"}

# Why a keyless table that differs may still be faithful to its topic: said under its report.
UNCAPTURED_HINT = (
    "no key: deletes of this table are never published (nor updates, without REPLICA IDENTITY FULL), "
    "so rows deleted or updated in Postgres stay in Delta; add a primary key to capture them"
)


@dataclass(frozen=True)
class RowCount:
    """One distinct row (by its hash) and how often each side holds it; `text` shows it to people."""

    text: str
    delta: int
    postgres: int


@dataclass
class MultisetDiff:
    """Occurrences Postgres holds more often than Delta (`missing_in_delta`) and the reverse,
    counted with multiplicity, plus up to `shown` of each kind for the report."""

    missing_in_delta: int = 0
    extra_in_delta: int = 0
    missing_rows: list[str] = field(default_factory=list)
    extra_rows: list[str] = field(default_factory=list)
    # The occurrences the shown rows stand for, so that a report can say how many more there are.
    missing_shown: int = 0
    extra_shown: int = 0

    @property
    def equal(self) -> bool:
        return self.missing_in_delta == 0 and self.extra_in_delta == 0


def shown_row(text: str, times: int) -> str:
    """A row as the report prints it: `×n` after it when it is off by more than one occurrence."""
    return text if times == 1 else f"{text} ×{times}"


def compare(rows: Iterable[RowCount], shown: int) -> MultisetDiff:
    """Both directions at once: a row held 3 times in Postgres and once in Delta is 2 missing."""
    diff = MultisetDiff()
    for row in rows:
        surplus = row.delta - row.postgres
        if surplus > 0:
            diff.extra_in_delta += surplus
            if len(diff.extra_rows) < shown:
                diff.extra_rows.append(shown_row(row.text, surplus))
                diff.extra_shown += surplus
        elif surplus < 0:
            diff.missing_in_delta -= surplus
            if len(diff.missing_rows) < shown:
                diff.missing_rows.append(shown_row(row.text, -surplus))
                diff.missing_shown -= surplus
    return diff


def unreconcilable_reason(op_counts: Mapping[str, int]) -> str | None:
    """Why a keyless mirror holding these `_bw_op` counts cannot be compared by value, or None when
    every row it holds came from a snapshot read or an insert."""
    replaced = {op: n for op, n in sorted(op_counts.items()) if op not in INSERT_ONLY_OPS and n > 0}
    if not replaced:
        return None
    what = ", ".join(f"{n} {OP_NAMES.get(op, repr(op))} event(s)" for op, n in replaced.items())
    return (
        f"no key and its topic carries {what}: the mirror keeps every version of a changed row, so "
        "it cannot be compared with Postgres by value; to verify it, add a primary key (or REPLICA "
        'IDENTITY USING INDEX) and rebuild its mirror (docs/lakehouse.md, "A table that fails")'
    )
