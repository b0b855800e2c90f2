"""Rows of a Postgres table in the lake's shape, for verification and reconciliation.

Each column is selected through an expression that yields what the merge stores for it: text for the
types the lake keeps as text (json as Postgres prints it, time as `HH:MM:SS.ffffff`), numeric for
money, the interval's (months, days, micros), ±infinity as the ends of Spark's range. Identifiers go
through psycopg2.sql; a key range is passed as parameters.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from decimal import Decimal
from typing import Any

from psycopg2 import sql

from spark_jobs.connections.postgres_catalog import PgColumn

FETCH_SIZE = 5000
_DATE_TYPES = {
    "date": ("9999-12-31", "0001-01-01"),
    "timestamp": ("9999-12-31 23:59:59.999999", "0001-01-01 00:00:00"),
    "timestamptz": ("9999-12-31 23:59:59.999999+00", "0001-01-01 00:00:00+00"),
}
_NATIVE = frozenset(
    {
        "bool",
        "int2",
        "int4",
        "int8",
        "oid",
        "float4",
        "float8",
        "bytea",
        "numeric",
        "date",
        "timestamp",
        "timestamptz",
    }
)


def column_expression(column: PgColumn) -> sql.Composable:
    ident = sql.Identifier(column.name)
    base = column.base_type
    if column.is_array:
        native_array = (
            base in _NATIVE
            and base not in _DATE_TYPES
            and not (base == "numeric" and column.numeric_typmod is None)
        )
        return ident if native_array else sql.SQL("{}::text[]").format(ident)
    if base in _DATE_TYPES:
        high, low = _DATE_TYPES[base]
        return sql.SQL(
            "CASE WHEN {c} = 'infinity' THEN {hi}::{t} WHEN {c} = '-infinity' THEN {lo}::{t} ELSE {c} END"
        ).format(c=ident, hi=sql.Literal(high), lo=sql.Literal(low), t=sql.SQL(base))
    if base == "numeric" and column.numeric_typmod is None:
        return sql.SQL("{}::text").format(ident)
    if base == "money":
        return sql.SQL("{}::numeric").format(ident)
    if base == "time":
        return sql.SQL("to_char({}, 'HH24:MI:SS.US')").format(ident)
    if base == "interval":
        return sql.SQL(
            "ARRAY[(extract(year from {c}) * 12 + extract(month from {c}))::bigint,"
            " extract(day from {c})::bigint,"
            " (extract(hour from {c}) * 3600000000 + extract(minute from {c}) * 60000000"
            " + extract(microseconds from {c}))::bigint]"
        ).format(c=ident)
    if base == "hstore":
        return sql.SQL("CAST({} AS json)").format(ident)
    if base in _NATIVE:
        return ident
    return sql.SQL("{}::text").format(ident)


def _python_value(column: PgColumn, value: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, memoryview):
        return bytes(value)
    if column.base_type == "interval" and not column.is_array:
        months, days, micros = value
        return {"months": int(months), "days": int(days), "micros": int(micros)}
    if column.is_array and column.base_type == "bytea":
        return [None if v is None else bytes(v) for v in value]
    return value


def fetch_rows(
    dsn: str,
    schema: str,
    table: str,
    columns: Sequence[PgColumn],
    key_range: tuple[str, Any, Any] | None = None,
) -> Iterator[list[Any]]:
    """Every row (in `columns` order), streamed through a server-side cursor; `key_range` is
    (column, low, high), inclusive, None ends open."""
    from spark_jobs.connections import postgres_connect

    with postgres_connect.connect(dsn) as conn:
        relation: sql.Composable = sql.SQL("{}.{}").format(sql.Identifier(schema), sql.Identifier(table))
        row_filter = published_row_filter(conn, schema, table)
        if row_filter is not None:  # Postgres's own text of the filter: the rows the mirror holds
            relation = sql.SQL("(SELECT * FROM {} WHERE ({})) AS {}").format(
                relation, sql.SQL(row_filter), sql.Identifier(table)
            )
        query = sql.SQL("SELECT {} FROM {}").format(
            sql.SQL(", ").join(column_expression(c) for c in columns), relation
        )
        params: list[Any] = []
        if key_range is not None:
            query, params = _with_range(query, key_range)
        yield from _stream(conn, query, params, columns)


def _stream(
    conn: Any, query: sql.Composed, params: list[Any], columns: Sequence[PgColumn]
) -> Iterator[list[Any]]:
    with conn.cursor(name="bw_verify") as cur:
        cur.itersize = FETCH_SIZE
        cur.execute(query, params)
        for row in cur:
            yield [_python_value(c, v) for c, v in zip(columns, row, strict=True)]


# Row filters (Postgres 15+) of the publications holding a table, as Postgres prints them.
_ROW_FILTERS_SQL = """
SELECT DISTINCT pg_get_expr(pr.prqual, pr.prrelid)
  FROM pg_publication_rel pr
  JOIN pg_class c ON c.oid = pr.prrelid
  JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = %s AND c.relname = %s
"""
ROW_FILTERS_VERSION = 150000


def published_row_filter(conn: Any, schema: str, table: str) -> str | None:
    """The row filter the worker's publication applies to the table (None: every row), so that a
    mirror of a filtered table is compared with the rows it should hold. Publications that filter
    the table differently leave no single answer: refused in one line."""
    with conn.cursor() as cur:
        cur.execute("SELECT current_setting('server_version_num')::int")
        if cur.fetchone()[0] < ROW_FILTERS_VERSION:
            return None
        cur.execute(_ROW_FILTERS_SQL, (schema, table))
        filters = [row[0] for row in cur.fetchall()]
    if len(filters) > 1:
        shown = ", ".join(f or "none" for f in filters)
        raise ValueError(
            f"{schema}.{table} is in publications with different row filters ({shown}): compare it on a "
            "database where one publication holds it"
        )
    return filters[0] if filters else None


def _with_range(query: sql.Composed, key_range: tuple[str, Any, Any]) -> tuple[sql.Composed, list[Any]]:
    name, low, high = key_range
    conditions: list[sql.Composable] = []
    params: list[Any] = []
    if low is not None:
        conditions.append(sql.SQL("{} >= %s").format(sql.Identifier(name)))
        params.append(low)
    if high is not None:
        conditions.append(sql.SQL("{} <= %s").format(sql.Identifier(name)))
        params.append(high)
    if not conditions:
        return query, params
    return query + sql.SQL(" WHERE ") + sql.SQL(" AND ").join(conditions), params


# Key columns whose lake values a key's report text (JSON) gives back exactly, and Postgres compares
# with a parameter as is: a row can be looked up by them. Any other key is found by reading the table.
_KEY_LOOKUP_TYPES = {
    "int2": int,
    "int4": int,
    "int8": int,
    "text": str,
    "varchar": str,
    "bpchar": str,
    "uuid": str,
    "citext": str,
}
KEYS_PER_QUERY = 1000


def key_lookup_types(columns: Sequence[PgColumn]) -> list[type] | None:
    """The Python type of each key column's value in a lookup by key, or None when some key column
    cannot be looked up by a parameter (then read the table whole)."""
    types = []
    for column in columns:
        kind: type | None = _KEY_LOOKUP_TYPES.get(column.base_type)
        if column.base_type == "numeric":
            kind = str if column.numeric_typmod is None else Decimal
        if kind is None or column.is_array:
            return None
        types.append(kind)
    return types


def fetch_rows_by_keys(
    dsn: str,
    schema: str,
    table: str,
    columns: Sequence[PgColumn],
    *,
    key_columns: Sequence[PgColumn],
    keys: Sequence[Sequence[Any]],
) -> Iterator[list[Any]]:
    """The rows (in `columns` order) whose key is one of `keys` (values as the lake holds them, in
    `key_columns` order: `key_lookup_types`), in queries of KEYS_PER_QUERY keys, each key compared
    through the same expression the rows are read with."""
    from spark_jobs.connections import postgres_connect

    with postgres_connect.connect(dsn) as conn:
        relation: sql.Composable = sql.SQL("{}.{}").format(sql.Identifier(schema), sql.Identifier(table))
        row_filter = published_row_filter(conn, schema, table)
        if row_filter is not None:
            relation = sql.SQL("(SELECT * FROM {} WHERE ({})) AS {}").format(
                relation, sql.SQL(row_filter), sql.Identifier(table)
            )
        select = sql.SQL("SELECT {} FROM {} WHERE ({}) IN ").format(
            sql.SQL(", ").join(column_expression(c) for c in columns),
            relation,
            sql.SQL(", ").join(column_expression(c) for c in key_columns),
        )
        one = sql.SQL("({})").format(sql.SQL(", ").join(sql.Placeholder() * len(key_columns)))
        for start in range(0, len(keys), KEYS_PER_QUERY):
            chunk = keys[start : start + KEYS_PER_QUERY]
            query = select + sql.SQL("(VALUES {})").format(sql.SQL(", ").join([one] * len(chunk)))
            yield from _stream(conn, query, [v for key in chunk for v in key], columns)
