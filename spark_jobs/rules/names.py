"""Identifiers in Spark SQL: every column, alias and path goes through `quote`, never raw.

Postgres column names may hold spaces, dots, quotes and backticks (`"person.name/surname"`); the Delta
tables keep them as they are (column mapping mode `name`), so a name pasted into SQL unquoted would
either fail to parse or, worse, parse as something else.
"""

from __future__ import annotations

from collections.abc import Iterable

BACKTICK = "`"


def quote(name: str) -> str:
    """A Spark SQL identifier: backticks around it, backticks inside doubled."""
    return BACKTICK + name.replace(BACKTICK, BACKTICK * 2) + BACKTICK


def column(alias: str, name: str) -> str:
    """`alias`.`name`, both quoted, for MERGE conditions and SET clauses."""
    return f"{quote(alias)}.{quote(name)}"


def delta_path(path: str) -> str:
    """The SQL reference to the Delta table at `path`: delta.`path`."""
    return f"delta.{quote(path)}"


def column_list(names: Iterable[str]) -> str:
    return ", ".join(quote(n) for n in names)


def string(value: str) -> str:
    """A Spark SQL string literal: quotes around it, backslashes and quotes inside escaped (Spark's
    parser reads backslash escapes in literals)."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def select(
    items: Iterable[str], relation: str, *, where: str | None = None, group_by: Iterable[str] = ()
) -> str:
    """`SELECT items FROM relation [WHERE where] [GROUP BY group_by]`: a statement of Spark SQL text
    whose every part was built with `quote` and `string` (never a value pasted raw); `relation` is a
    quoted name or a parenthesized statement."""
    text = f"SELECT {', '.join(items)} FROM {relation}"  # noqa: S608 (parts quoted, above)
    if where is not None:
        text += f" WHERE {where}"
    grouping = list(group_by)
    return f"{text} GROUP BY {', '.join(grouping)}" if grouping else text
