"""The types of captured columns, read from the catalog: each type, its element and base types."""

from __future__ import annotations

from collections.abc import Iterable

import psycopg2.extensions

from cdc_worker.core.model import TableSchema, TypeInfo

_TYPES_SQL = """
WITH RECURSIVE used(oid) AS (
    SELECT unnest(%s::oid[])
  UNION
    SELECT refs.oid
      FROM used
      JOIN pg_type t ON t.oid = used.oid
     CROSS JOIN LATERAL (VALUES
         (CASE WHEN t.typtype = 'b' AND t.typcategory = 'A' THEN t.typelem ELSE 0::oid END),
         (t.typbasetype)) AS refs(oid)
     WHERE refs.oid <> 0
)
SELECT t.oid, n.nspname::text, t.typname::text, t.typtype::text,
       CASE WHEN t.typtype = 'b' AND t.typcategory = 'A' THEN t.typelem ELSE 0::oid END,
       t.typbasetype, t.typtypmod
  FROM used
  JOIN pg_type t ON t.oid = used.oid
  JOIN pg_namespace n ON n.oid = t.typnamespace
"""


def load_type_infos(conn: psycopg2.extensions.connection, type_oids: Iterable[int]) -> dict[int, TypeInfo]:
    """`TypeInfo`s of `type_oids` and of every element and base type they refer to, recursively."""
    wanted = sorted(set(type_oids))
    if not wanted:
        return {}
    with conn.cursor() as cur:
        cur.execute(_TYPES_SQL, (wanted,))
        return {
            oid: TypeInfo(oid, namespace, name, kind, element, base, base_typmod)
            for oid, namespace, name, kind, element, base, base_typmod in cur.fetchall()
        }


def table_type_oids(tables: Iterable[TableSchema]) -> set[int]:
    return {column.type_oid for table in tables for column in table.columns}
