"""The batch's key range as a predicate on the MERGE's target, so Delta skips the files outside it.

Delta prunes the target of a MERGE by the conjuncts of its condition that name only target columns,
against each file's min/max statistics. `t.key = s.key` alone prunes nothing; adding
`t.key BETWEEN <lowest> AND <highest>` of the batch's keys lets a batch whose keys sit in a narrow
part of the key space (the newest ids, a hot tail, an unkeyed table's newest LSNs) read and touch only
the files that overlap it. It can exclude no row that matches: every key of the batch lies in the
range, and a row matching one of them has that key.

Only the leading key column is bounded (files are clustered by the key's leading column, by
maintenance's Z-order and by a serial key's insertion order), and only for types whose bounds
survive the trip through Python unchanged and whose order agrees with their equality: integers,
decimals, strings, dates. Not timestamps (a naive datetime is converted through the local zone,
where an hour repeats once a year), not floating point (NaN and -0.0).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import DataType


@dataclass(frozen=True)
class KeyRange:
    """The lowest and highest value of `column` among a batch's changes (both inclusive)."""

    column: str
    low: Any
    high: Any

    def condition(self, alias: str) -> Column:
        """`alias`.`column` BETWEEN low AND high, for the MERGE's condition."""
        from pyspark.sql import functions as F

        from spark_jobs.rules.names import column

        return F.col(column(alias, self.column)).between(F.lit(self.low), F.lit(self.high))


def range_column(keys: Sequence[str], types: Mapping[str, DataType]) -> str | None:
    """The key column a batch's range may bound: the leading one, when its type allows (module
    docstring); None otherwise (no key, or a type that does not)."""
    from pyspark.sql.types import DateType, DecimalType, IntegralType, StringType

    if not keys or keys[0] not in types:
        return None
    return keys[0] if isinstance(types[keys[0]], IntegralType | DecimalType | StringType | DateType) else None


def bounds(column: str | None, low: Any, high: Any) -> KeyRange | None:
    """The range from the batch's min and max of `column` (None when there is no column to bound or
    the batch holds no non-null value of it)."""
    if column is None or low is None or high is None:
        return None
    return KeyRange(column, low, high)


def of_batch(changes: DataFrame, keys: Sequence[str]) -> KeyRange | None:
    """The batch's key range (one small aggregate over the changes, which the merge keeps cached)."""
    return counted(changes, keys)[1]


def counted(changes: DataFrame, keys: Sequence[str]) -> tuple[int, KeyRange | None]:
    """The batch's number of changes and its key range, in one aggregate: a Spark job costs a small
    table's merge more than the rows do (docs/lakehouse.md, "Many tables")."""
    from pyspark.sql import functions as F

    from spark_jobs.rules.names import quote

    name = range_column(keys, {f.name: f.dataType for f in changes.schema.fields})
    if name is None:
        return changes.count(), None
    row = changes.agg(F.count(F.lit(1)), F.min(F.col(quote(name))), F.max(F.col(quote(name)))).head()
    if row is None:
        return 0, None
    return int(row[0]), bounds(name, row[1], row[2])
