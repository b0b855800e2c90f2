"""DDL captured by the `--capture-ddl` event trigger, as the stream sees it.

Logical decoding carries no DDL: a consumer learns of an `ADD COLUMN` only when a row with the new
shape arrives, and of a `DROP TABLE` never. The event trigger the worker installs
(`shell.postgres.ddl_trigger`) closes that gap: on `ddl_command_end` and `sql_drop` it writes a
*transactional* logical message with the prefix `DDL_PREFIX` whose content is the JSON object
`parse_ddl` reads. Being transactional, the message is decoded inside its transaction, at its
position among the transaction's row changes, and only if the transaction commits: a DDL rolled
back publishes nothing.

`DdlEvent` is that message numbered in its transaction like every other event (`seq`), so the
control topic's `ddl` events sort among the row changes by `(lsn, seq)`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime

from cdc_worker.core.errors import DataError

DDL_PREFIX = "bottledwater.ddl"
# What the trigger writes in its message, so that a newer worker can read an older trigger's.
DDL_FORMAT_VERSION = 1
# `object_type` values the trigger reports (pg_event_trigger_ddl_commands / dropped_objects).
TABLE = "table"
TABLE_COLUMN = "table column"


class DdlMessageError(DataError, ValueError):
    """A `bottledwater.ddl` message whose content is not what the trigger writes."""


@dataclass(frozen=True, slots=True)
class DdlColumn:
    """A column of the table after the command: its name, `format_type()` (e.g. `numeric(10,2)`),
    and what the lakehouse maps it by: the base type's `typname` (domains resolved, the element's for
    arrays), its typmod, and whether it is an array."""

    name: str
    type: str
    base_type: str
    typmod: int
    array: bool
    not_null: bool


@dataclass(frozen=True, slots=True)
class DdlCommand:
    """One command as the trigger reported it. `columns` is empty for a dropped table."""

    event: str  # ddl_command_end or sql_drop
    command_tag: str  # CREATE TABLE, ALTER TABLE, DROP TABLE ...
    object_type: str  # table, table column
    object_identity: str  # e.g. public.orders, public.orders.note (quoted where Postgres quotes)
    schema: str
    table: str
    table_oid: int
    statement: str
    columns: tuple[DdlColumn, ...]

    @property
    def qualified_name(self) -> str:
        return f"{self.schema}.{self.table}"

    @property
    def dropped_table(self) -> bool:
        return self.event == "sql_drop" and self.object_type == TABLE


@dataclass(frozen=True, slots=True)
class DdlEvent:
    """A `bottledwater.ddl` message at its place in its transaction; `content` is read by
    `parse_ddl` where a bad one can be handled under `--on-error` (the shell)."""

    content: bytes
    commit_lsn: int
    seq: int
    xid: int
    commit_ts: datetime


def _text(record: dict[str, object], name: str) -> str:
    value = record.get(name)
    if not isinstance(value, str):
        raise DdlMessageError(f"a {DDL_PREFIX} message lacks the text field {name!r}: {record!r}")
    return value


def _column(raw: object) -> DdlColumn:
    if not isinstance(raw, dict):
        raise DdlMessageError(f"a {DDL_PREFIX} message's column is not an object: {raw!r}")
    typmod = raw.get("typmod", -1)
    return DdlColumn(
        name=_text(raw, "name"),
        type=_text(raw, "type"),
        base_type=_text(raw, "base_type"),
        typmod=typmod if isinstance(typmod, int) else -1,
        array=bool(raw.get("array", False)),
        not_null=bool(raw.get("not_null", False)),
    )


def parse_ddl(content: bytes) -> DdlCommand:
    """The trigger's message content (UTF-8 JSON) -> a `DdlCommand`."""
    try:
        record = json.loads(content)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DdlMessageError(f"a {DDL_PREFIX} message is not JSON ({exc}): reinstall the trigger") from None
    if not isinstance(record, dict):
        raise DdlMessageError(f"a {DDL_PREFIX} message is not a JSON object: {record!r}")
    version = record.get("version")
    if not isinstance(version, int) or version > DDL_FORMAT_VERSION:
        raise DdlMessageError(
            f"a {DDL_PREFIX} message of format {version!r}, newer than this worker's "
            f"{DDL_FORMAT_VERSION}: upgrade the worker"
        )
    columns = record.get("columns") or []
    if not isinstance(columns, list):
        raise DdlMessageError(f"a {DDL_PREFIX} message's columns are not a list: {columns!r}")
    oid = record.get("table_oid")
    return DdlCommand(
        event=_text(record, "event"),
        command_tag=_text(record, "command_tag"),
        object_type=_text(record, "object_type"),
        object_identity=_text(record, "object_identity"),
        schema=_text(record, "schema"),
        table=_text(record, "table"),
        table_oid=oid if isinstance(oid, int) else 0,
        statement=record.get("statement") if isinstance(record.get("statement"), str) else "",  # type: ignore[arg-type]
        columns=tuple(_column(c) for c in columns),
    )


def renamed_from(command: DdlCommand, known_name: tuple[str, str] | None) -> tuple[str, str] | None:
    """The table's previous (schema, table) when `command` renamed it (or moved it to another
    schema): the name the stream knew for its OID differs from the one after the command."""
    if known_name is None or command.dropped_table or command.command_tag != "ALTER TABLE":
        return None
    return known_name if known_name != (command.schema, command.table) else None
