"""What a consistent read returns: each table's frame and where it came from (`TableRead`), the
position they are all at (`ConsistentRead`), and the summary the CLI prints and Dagster shows."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from spark_jobs.reading import views

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


@dataclass(frozen=True)
class TableRead:
    """One table of a consistent read: its frame and where it came from (a mirror version, or the
    history table when `version` is None), and, when the changelog's tail was applied to the version,
    the position the tail starts after (`tail_after`, the version's watermark)."""

    name: str
    frame: DataFrame
    version: int | None
    tail_after: int | None = None


@dataclass(frozen=True)
class ConsistentRead:
    """`position`: the commit LSN the tables are read at (every transaction at or before it, none
    after). `newest`: the newest watermark any of them reached; `proven_at`: when the worker proved
    `position` (epoch microseconds), so `lag_s` is how old that proof is."""

    position: int
    tables: dict[str, TableRead]
    newest: int
    proven_at: int | None
    changelog_version: int | None = None
    # Why the read is not through the changelog (None when it is): it is then at the mirrors' common
    # position, as fresh as the mirrors.
    not_fresh: str | None = None

    @property
    def lag_s(self) -> float | None:
        return None if self.proven_at is None else max(0.0, time.time() - self.proven_at / 1e6)

    def frame(self, name: str) -> DataFrame:
        return self.tables[name].frame

    def register_views(self, prefix: str = "") -> dict[str, str]:
        """Every table as a temporary SQL view at `position` (`reading.views`: public.accounts is
        `<prefix>accounts`, sales.orders `<prefix>sales_orders`). Returns table -> view."""
        return views.register_views({n: t.frame for n, t in self.tables.items()}, prefix)


def summary(read: ConsistentRead) -> dict[str, object]:
    """What the CLI prints (and Dagster shows): the position, its lag, and each table's source."""
    return {
        "position": read.position,
        "newest_watermark": read.newest,
        "lag_s": None if read.lag_s is None else round(read.lag_s, 3),
        "changelog_version": read.changelog_version,
        "not_fresh": read.not_fresh,
        "tables": {name: _source(t) for name, t in read.tables.items()},
    }


def _source(table: TableRead) -> dict[str, object]:
    if table.version is None:
        return {"version": None, "from": "history"}
    if table.tail_after is None:
        return {"version": table.version, "from": "mirror"}
    return {"version": table.version, "from": "mirror+changelog", "tail_after": table.tail_after}
