"""Which mirrors a batch merges when the merge works behind the lake's changelog (`--mirror-budget`).

Once a batch's changelog commit is written its transactions are in the lake for every table, and
reads at the changelog's position see them (mirror + tail). The mirrors' MERGEs, one Delta commit
each, then get a time budget per batch: the tables are started in `merge_order` (the one waiting
longest first, then the one with most records in the batch), and a table not started when the budget
is spent is deferred, its slice left in the changelog for a later batch, unless it `must_merge`
(it has waited the maximum lag) or has no mirror yet (the caller's check: a read through the
changelog starts from a mirror version). So with few busy tables every mirror is merged every batch, as
without a budget; with hundreds, the mirrors trail by at most about the maximum lag, and the batch
(so the next changelog commit) never waits for all of them.

Pure: no Spark, no clock (the caller passes the waits).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Pending:
    """A table the batch could merge: `messages`, its records in the batch (0: only deferred ones
    wait); `waiting_s`, how long its oldest deferred slice has waited (None: none is deferred)."""

    topic: str
    messages: int
    waiting_s: float | None = None


def merge_order(tables: Iterable[Pending]) -> list[str]:
    """Tables with deferred slices first, the longest waiting first; then by records, most first."""

    def rank(table: Pending) -> tuple[float, int, str]:
        waited = -1.0 if table.waiting_s is None else table.waiting_s
        return (-waited, -table.messages, table.topic)

    return [t.topic for t in sorted(tables, key=rank)]


def must_merge(waiting_s: float | None, max_lag_s: float) -> bool:
    """A table whose oldest deferred slice has waited `max_lag_s` is merged whatever the budget."""
    return waiting_s is not None and waiting_s >= max_lag_s
