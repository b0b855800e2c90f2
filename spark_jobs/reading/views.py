"""A consistent read as SQL: every table of it registered as a temporary view in one call.

    read = read_consistent(spark, warehouse, ["public.accounts", "public.transfers"], tail_from=options)
    read.register_views()  # {"public.accounts": "accounts", "public.transfers": "transfers"}
    spark.sql("SELECT sum(balance) FROM accounts")  # every view at read.position

The views are the read's frames (a mirror version, its changelog tail applied, or the history table
at the position), so SQL over several of them sees each transaction whole or not at all, like the
DataFrames. Temporary views live in the session: a later `register_views` replaces them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from kafka_contract.topics import DEFAULT_SCHEMA

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

# The CLI's `--sql` prints this many rows at most (a larger answer is for a DataFrame, not a terminal).
PRINTED_ROWS = 1000


def view_names(names: Iterable[str], prefix: str = "") -> dict[str, str]:
    """`schema.table` -> its view's name: `<prefix><table>` for the default schema, else
    `<prefix><schema>_<table>` (a temporary view has no schema). Raises ValueError when two tables
    would share a view."""
    tables: dict[str, str] = {}  # view -> table
    for name in names:
        schema, _, table = name.rpartition(".")
        view = prefix + (table if schema in ("", DEFAULT_SCHEMA) else f"{schema}_{table}")
        if view in tables:
            raise ValueError(
                f"{tables[view]} and {name} would both be the view {view}: "
                "register them with different prefixes"
            )
        tables[view] = name
    return {name: view for view, name in tables.items()}


def register_views(frames: Mapping[str, DataFrame], prefix: str = "") -> dict[str, str]:
    """Registers (or replaces) a temporary view per table of a read (`ConsistentRead.register_views`);
    returns table -> view."""
    views = view_names(frames, prefix)
    for name, view in views.items():
        frames[name].createOrReplaceTempView(view)
    return views


def query_rows(spark: SparkSession, query: str, limit: int = PRINTED_ROWS) -> dict[str, object]:
    """The first `limit` rows of a SQL query (as dicts) and whether there were more."""
    rows = spark.sql(query).limit(limit + 1).collect()
    return {"rows": [r.asDict(recursive=True) for r in rows[:limit]], "truncated": len(rows) > limit}
