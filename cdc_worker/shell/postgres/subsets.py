"""Column lists and row filters (Postgres 15+): the columns and rows of a table a user chooses to
publish (`--columns`, `--exclude-columns`, `--row-filter`), which become the publication's column
list and WHERE clause, so that the stream, the snapshot and the schemas carry exactly those.

Why the checks: Postgres refuses every UPDATE and DELETE of a table whose publication's column
list leaves out a replica identity column, or whose row filter uses a column outside it, at the
moment the application writes (not when the publication is made). So the worker refuses such a
selection at start, naming the column. Key columns cannot be left out either: they are the Kafka key.

Why the text checks: a row filter is user SQL placed into the publication's DDL as SQL (it cannot be
a parameter). It must be one expression: no statement separator, no comment, balanced parentheses
and quotes, no dollar quoting, so that it cannot end the `WHERE (...)` it is put in; Postgres then
checks the expression itself (columns of the table, immutable built-in functions only) when a probe
publication is made in a rolled-back transaction (`probe`), which also gives the expression as
Postgres prints it, to compare with what the publication of a resumed slot holds.

A resumed slot keeps its selection: its topics hold the rows and columns published so far, so a
different one is refused in one line (drop the slot and start again for a new snapshot).
"""

from __future__ import annotations

import fnmatch
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import psycopg2
import psycopg2.extensions
from psycopg2 import sql

from cdc_worker.core.model import ReplicaIdentity
from cdc_worker.shell.postgres.catalog import CatalogTable

MINIMUM_VERSION_NUM = 150000
NEEDS_VERSION = (
    "--columns, --exclude-columns and --row-filter need Postgres 15 or later (publication column lists "
    "and row filters): remove them, or capture from a Postgres 15+ server"
)
PerTable = Sequence[tuple[str, str]]  # (table glob, value), in the order given
_WORD = re.compile(r'"(?:[^"]|"")*"|\'(?:[^\']|\'\')*\'|[A-Za-z_][A-Za-z0-9_$]*')
_FORBIDDEN = (";", "--", "/*", "$")


@dataclass(frozen=True)
class Selection:
    """What a user chose to publish, per table glob (each table takes the last entry matching it)."""

    columns: PerTable = ()
    exclude_columns: PerTable = ()
    row_filters: PerTable = ()

    @property
    def given(self) -> bool:
        return bool(self.columns or self.exclude_columns or self.row_filters)


def _matches(table: CatalogTable, glob: str) -> bool:
    name = table.schema.name
    return fnmatch.fnmatchcase(table.qualified_name if "." in glob else name, glob)


def last_match(table: CatalogTable, entries: PerTable) -> str | None:
    found = [value for glob, value in entries if _matches(table, glob)]
    return found[-1] if found else None


def _outside_quotes(text: str) -> str:
    """`text` with every quoted string and identifier blanked (their content is data)."""
    return _WORD.sub(lambda m: " " if m.group(0)[0] in "'\"" else m.group(0), text)


def filter_text_problem(text: str, where: str) -> str | None:
    """Why `text` cannot be a row filter's expression, or None (see the module's docstring)."""
    if not text.strip():
        return f"{where}: the row filter is empty: give an expression, e.g. region = 'eu'"
    if text.count("'") % 2 or text.count('"') % 2:
        return f"{where}: unbalanced quotes in the row filter {text!r}: close every ' and \""
    bare = _outside_quotes(text)
    for token in _FORBIDDEN:
        if token in bare:
            return (
                f"{where}: the row filter {text!r} holds {token!r}: give one SQL expression (no ;, no "
                "comments, no dollar quoting)"
            )
    depth = 0
    for char in bare:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth < 0:
            break
    if depth:
        return f"{where}: unbalanced parentheses in the row filter {text!r}"
    return None


def columns_used(text: str, names: Sequence[str]) -> list[str]:
    """The table's columns a filter names (bare words folded to lower case, quoted ones as written)."""
    used = []
    for match in _WORD.finditer(text):
        word = match.group(0)
        if word[0] == "'":
            continue
        name = word[1:-1].replace('""', '"') if word[0] == '"' else word.lower()
        if name in names and name not in used:
            used.append(name)
    return used


def _listed(value: str) -> list[str]:
    return [name.strip() for name in value.split(",") if name.strip()]


def select(table: CatalogTable, selection: Selection) -> tuple[CatalogTable, list[str]]:
    """`table` restricted to what `selection` publishes of it (its columns, its row filter), and the
    problems, one line each naming the column and the fix."""
    name = table.qualified_name
    names = [c.name for c in table.schema.columns]
    wanted, problems = list(names), []
    for option, value, keep in (
        ("--columns", last_match(table, selection.columns), True),
        ("--exclude-columns", last_match(table, selection.exclude_columns), False),
    ):
        if value is None:
            continue
        listed = _listed(value)
        unknown = [c for c in listed if c not in names]
        if unknown:
            problems.append(
                f"{option}: table {name} has no column {unknown[0]} (its columns: {', '.join(names)})"
            )
        wanted = [c for c in wanted if (c in listed) == keep]
    identity = [c.name for c in table.schema.columns if c.in_replica_identity]
    for column in dict.fromkeys([*table.schema.key_columns, *identity]):
        if column not in wanted:
            problems.append(
                f"column {column} of {name} is in its key or replica identity and cannot be left out of "
                "the publication: keep it in --columns / remove it from --exclude-columns"
            )
    row_filter = last_match(table, selection.row_filters)
    if row_filter is not None:
        problem = filter_text_problem(row_filter, f"--row-filter for {name}")
        full = table.schema.replica_identity is ReplicaIdentity.FULL or not table.has_replica_identity
        outside = [] if full or problem else [c for c in columns_used(row_filter, names) if c not in identity]
        if problem:
            problems.append(problem)
        elif outside:
            problems.append(
                f"--row-filter for {name} uses column {outside[0]}, which is not in its replica identity: "
                f"Postgres would refuse its UPDATEs and DELETEs; filter on key columns, or ALTER TABLE "
                f"{name} REPLICA IDENTITY FULL"
            )
    # Key columns stay in the schema even when refused above (a schema must hold its key).
    columns = tuple(c for c in table.schema.columns if c.name in wanted or c.name in table.schema.key_columns)
    schema = replace(table.schema, columns=columns)
    column_list = tuple(wanted) if wanted != names else None
    generated = tuple(c for c in table.generated_columns if c in wanted)
    selected = replace(
        table, schema=schema, column_list=column_list, row_filter=row_filter, generated_columns=generated
    )
    return selected, problems


def table_spec(table: CatalogTable) -> sql.Composable:
    """A table in a publication's table list: its name, column list and WHERE clause. The row
    filter's text was checked by `filter_text_problem` (one expression, kept inside its parentheses)
    and is then user SQL, passed as SQL on purpose; Postgres checks the expression."""
    spec: sql.Composable = sql.Identifier(table.schema.namespace, table.schema.name)
    if table.column_list is not None:
        spec += sql.SQL(" ({})").format(sql.SQL(", ").join(map(sql.Identifier, table.column_list)))
    if table.row_filter is not None:
        spec += sql.SQL(" WHERE ({})").format(sql.SQL(table.row_filter))
    return spec


# -- the publication's side ---------------------------------------------------------------------

_SUBSETS_SQL = """
SELECT pr.prrelid::bigint,
       CASE WHEN pr.prattrs IS NULL THEN NULL ELSE ARRAY(
         SELECT a.attname::text FROM pg_attribute a
          WHERE a.attrelid = pr.prrelid AND a.attnum = ANY (pr.prattrs::int2[]) ORDER BY a.attnum) END,
       pg_get_expr(pr.prqual, pr.prrelid)
  FROM pg_publication_rel pr JOIN pg_publication p ON p.oid = pr.prpubid
 WHERE p.pubname = ANY (%s)
"""


@dataclass(frozen=True)
class Published:
    """A table's column list (None: every column) and row filter as a publication holds them."""

    columns: tuple[str, ...] | None
    row_filter: str | None  # as Postgres prints it


def as_published(table: CatalogTable, held: Published) -> CatalogTable:
    """`table` as a publication publishes it: its listed columns, its row filter (as Postgres
    prints it, so SQL that Postgres itself wrote)."""
    names = held.columns
    columns = (
        table.schema.columns if names is None else tuple(c for c in table.schema.columns if c.name in names)
    )
    return replace(
        table, schema=replace(table.schema, columns=columns), column_list=names, row_filter=held.row_filter
    )


def published(conn: psycopg2.extensions.connection, publications: Sequence[str]) -> dict[int, Published]:
    """Per table OID in `publications`, its column list and row filter (Postgres 15+; else none)."""
    with conn.cursor() as cur:
        cur.execute("SELECT current_setting('server_version_num')::int")
        row = cur.fetchone()
        if row is None or int(row[0]) < MINIMUM_VERSION_NUM:
            return {}
        cur.execute(_SUBSETS_SQL, (list(publications),))
        return {
            int(oid): Published(tuple(cols) if cols else None, qual) for oid, cols, qual in cur.fetchall()
        }


def probe(
    conn: psycopg2.extensions.connection, tables: Sequence[CatalogTable]
) -> tuple[dict[int, str], list[str]]:
    """Each row filter as Postgres prints it, made in a probe publication in a rolled-back
    transaction, and one problem line per filter Postgres refuses (its own reason)."""
    printed: dict[int, str] = {}
    problems = []
    for table in (t for t in tables if t.row_filter is not None):
        name = sql.Identifier(f"bottledwater_probe_{uuid.uuid4().hex[:12]}")
        with conn.cursor() as cur:
            cur.execute("BEGIN")
            try:
                cur.execute(sql.SQL("CREATE PUBLICATION {} FOR TABLE {}").format(name, table_spec(table)))
                cur.execute(
                    "SELECT pg_get_expr(pr.prqual, pr.prrelid) FROM pg_publication_rel pr "
                    "JOIN pg_publication p ON p.oid = pr.prpubid WHERE p.pubname = %s",
                    (name.string,),
                )
                row = cur.fetchone()
                printed[table.schema.oid] = str(row[0]) if row else ""
            except psycopg2.Error as exc:
                said = exc.diag.message_primary or str(exc).strip().splitlines()[0]
                said += f" ({exc.diag.message_detail})" if exc.diag.message_detail else ""
                problems.append(
                    f"--row-filter for {table.qualified_name} is refused by Postgres: {said}; change the "
                    "expression"
                )
            finally:
                cur.execute("ROLLBACK")
    return printed, problems


def changed(
    tables: Sequence[CatalogTable],
    printed: Mapping[int, str] | None,
    held: Mapping[int, Published],
    slot: str,
) -> list[str]:
    """One line per table of a resumed slot whose selection differs from what its publication holds;
    `printed` None: the filters as Postgres prints them are unknown (a standby), columns only."""
    problems = []
    for table in tables:
        before = held.get(table.schema.oid)
        if before is None:
            continue  # a table joining the publication: nothing published of it yet
        if printed is None:
            before = replace(before, row_filter=None)
        now = Published(table.column_list, None if printed is None else printed.get(table.schema.oid))
        if now != before:
            what = "column list" if now.columns != before.columns else "row filter"
            problems.append(
                f"the {what} of {table.qualified_name} differs from what slot {slot}'s publication has "
                f"published ({before.columns or 'all columns'}, WHERE {before.row_filter or 'none'}): "
                f"restore the former --columns/--exclude-columns/--row-filter, or drop the slot "
                f"(bottledwater slot drop -s {slot}) and start again for a new snapshot"
            )
    return problems


def apply(
    conn: psycopg2.extensions.connection,
    tables: Sequence[CatalogTable],
    selection: Selection,
    *,
    server_version_num: int,
    on_standby: bool,
    held_by: Sequence[str],
    slot: str,
) -> tuple[list[CatalogTable], list[str]]:
    """The tables as the selection publishes them, and the problems: options on Postgres 14, columns
    that cannot be left out, filters Postgres refuses, and (`held_by`: a resumed slot's existing
    publications) a selection that differs from what was published so far."""
    if selection.given and server_version_num < MINIMUM_VERSION_NUM:
        return list(tables), [NEEDS_VERSION]
    selected, problems = [], []
    for table in tables:
        restricted, found = select(table, selection) if selection.given else (table, [])
        selected.append(restricted)
        problems += found
    printed: dict[int, str] = {}
    if not problems and not on_standby:  # a standby cannot make even a rolled-back publication
        printed, refused = probe(conn, selected)
        problems += refused
    if not problems and held_by:
        problems += changed(selected, None if on_standby else printed, published(conn, held_by), slot)
    return selected, problems
