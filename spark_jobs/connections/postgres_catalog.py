"""What Postgres's catalog says of a table, in the lake's terms: columns, Spark types, primary key.

Used to type JSON topics (which carry no types), to detect schema drift and to reconcile. Read-only
catalog queries, identifiers always passed as parameters.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from spark_jobs.decoding.spark_types import pg_type
from spark_jobs.errors import ConfigurationError

if TYPE_CHECKING:
    from pyspark.sql.types import DataType

VARHDRSZ = 4
NUMERIC_SCALE_MASK = 0x7FF
NUMERIC_SCALE_SIGN = 1024
TYPE_DOMAIN = "d"
CATEGORY_ARRAY = "A"
MAX_TYPE_NESTING = 32

_COLUMNS = """
SELECT a.attname, a.atttypid, a.atttypmod, a.attnotnull, format_type(a.atttypid, a.atttypmod)
FROM pg_attribute a
JOIN pg_class c ON c.oid = a.attrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %s AND c.relname = %s AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum
"""
_PRIMARY_KEY = """
SELECT a.attname
FROM pg_index i
JOIN pg_class c ON c.oid = i.indrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, position) ON true
JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = k.attnum
WHERE n.nspname = %s AND c.relname = %s AND (i.indisprimary OR (c.relreplident = 'i' AND i.indisreplident))
ORDER BY i.indisreplident DESC, k.position
"""
_TYPE = "SELECT typname, typtype, typelem, typbasetype, typtypmod, typcategory FROM pg_type WHERE oid = %s"


class TableNotFoundError(ConfigurationError, LookupError):
    """The Postgres table a Delta table mirrors is not there (dropped, renamed, wrong database)."""


@dataclass(frozen=True)
class PgColumn:
    name: str
    declared_type: str  # format_type(), e.g. "numeric(10,2)", "timestamp with time zone"
    base_type: str  # pg_type.typname after domains; the element's for arrays
    numeric_typmod: tuple[int, int] | None
    is_array: bool
    not_null: bool

    @property
    def spark_type(self) -> DataType:
        return pg_type(self.base_type, self.numeric_typmod, array=self.is_array)


def numeric_precision_scale(typmod: int) -> tuple[int, int] | None:
    """numeric's (precision, scale) from its typmod; None for an unconstrained numeric."""
    if typmod < VARHDRSZ:
        return None
    packed = typmod - VARHDRSZ
    scale = ((packed & NUMERIC_SCALE_MASK) ^ NUMERIC_SCALE_SIGN) - NUMERIC_SCALE_SIGN
    return (packed >> 16) & 0xFFFF, scale


def split_qualified(qualified: str) -> tuple[str, str]:
    """`schema.table` (the merge's `bottledwater.source` property) -> (schema, table)."""
    schema, dot, table = qualified.partition(".")
    return (schema, table) if dot else ("public", qualified)


def table_columns(dsn: str, schema: str, table: str) -> list[PgColumn]:
    from spark_jobs.connections import postgres_connect

    with postgres_connect.connect(dsn) as conn, conn.cursor() as cur:
        cur.execute(_COLUMNS, (schema, table))
        rows = cur.fetchall()
        if not rows:
            raise TableNotFoundError(f"table {schema}.{table} not found in {conn.info.dbname}")
        types: dict[int, Any] = {}
        return [_column(cur, types, row) for row in rows]


def primary_key(dsn: str, schema: str, table: str) -> tuple[str, ...]:
    from spark_jobs.connections import postgres_connect

    with postgres_connect.connect(dsn) as conn, conn.cursor() as cur:
        cur.execute(_PRIMARY_KEY, (schema, table))
        return tuple(dict.fromkeys(r[0] for r in cur.fetchall()))


def spark_columns(dsn: str, schema: str, table: str) -> dict[str, DataType]:
    return {c.name: c.spark_type for c in table_columns(dsn, schema, table)}


def _column(cur: Any, types: dict[int, Any], row: tuple[str, int, int, bool, str]) -> PgColumn:
    name, oid, typmod, not_null, declared = row
    is_array = False
    for _ in range(MAX_TYPE_NESTING):
        typname, typtype, typelem, typbasetype, typtypmod, category = _type_row(cur, types, oid)
        if typtype == TYPE_DOMAIN:
            oid, typmod = typbasetype, typtypmod
        elif category == CATEGORY_ARRAY and typelem and not is_array:
            oid, is_array = typelem, True
        else:
            numeric = numeric_precision_scale(typmod) if typname == "numeric" else None
            return PgColumn(name, declared, typname, numeric, is_array, not_null)
    raise ValueError(f"column {name}: type {oid} nests domains deeper than {MAX_TYPE_NESTING}")


def _type_row(cur: Any, types: dict[int, Any], oid: int) -> Any:
    if oid not in types:
        cur.execute(_TYPE, (oid,))
        types[oid] = cur.fetchone()
    return types[oid]
