"""Which mirrors a round merges when the merge works behind the lake's changelog (`--mirror-budget`).

Once a batch's changelog commit is written its transactions are in the lake for every table, and
reads at the changelog's position see them (mirror + tail). The mirrors' MERGEs, one Delta commit
each, are then merged off the batches in rounds (`merging.mirrors_behind`), each with a time budget:
the tables are started in `merge_order` (the one waiting longest first, then the one with most
records waiting), and a table not started when the budget is spent waits for a later round, unless
it `must_merge` (it has waited the maximum lag). So the next changelog commit never waits for a
mirror, and with hundreds of busy tables the ones waiting longest go first.

Pure: no Spark, no clock (the caller passes the waits).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Pending:
    """A table a round could merge: `messages`, its records waiting; `waiting_s`, how long its oldest
    deferred slice has waited (None: none is deferred)."""

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
