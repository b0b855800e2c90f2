"""DDL events on the control topic (`--capture-ddl`), as the stream session publishes them.

The assembler hands over each `bottledwater.ddl` message of a committed transaction as a
`DdlEvent` at its `(lsn, seq)`; here it is read (`core.ddl.parse_ddl`), matched against the
worker's table selection, and published inside its transaction through the session, so that it is
acknowledged with the transaction and never before. The names the stream has seen per table OID
(seeded from the catalog at start) tell a rename: it is published under the previous name, whose
topic and Delta table it concerns, with the new one in `ddl_renamed_to`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from cdc_worker.core.ddl import DdlCommand, DdlEvent, DdlMessageError, parse_ddl, renamed_from
from cdc_worker.core.encoding.serializers import EncodedMessage
from cdc_worker.core.lsn import format_lsn
from cdc_worker.core.model import TableSchema
from cdc_worker.shell.postgres.catalog import table_matches
from kafka_contract.control import DDL

log = logging.getLogger(__name__)


class DdlSerializer(Protocol):
    def ddl(
        self, event: DdlEvent, command: DdlCommand, *, renamed_from: tuple[str, str] | None = None
    ) -> EncodedMessage: ...


# The session's publishing inside the open transaction, and its data-error handling (--on-error).
Produce = Callable[[EncodedMessage, str, str], None]
DataErrorHandler = Callable[[str, Exception], None]


@dataclass
class DdlSelection:
    """Which tables' DDL is published: the worker's `--tables` / `--exclude-tables` globs, and
    the (schema, table) the stream last knew for each table OID."""

    include: Sequence[str] = ()
    exclude: Sequence[str] = ()
    names: dict[int, tuple[str, str]] = field(default_factory=dict)

    @classmethod
    def of(
        cls, include: Sequence[str], exclude: Sequence[str], tables: Iterable[TableSchema]
    ) -> DdlSelection:
        return cls(include, exclude, {t.oid: (t.namespace, t.name) for t in tables})

    def selects(self, schema: str, table: str) -> bool:
        included = not self.include or table_matches(schema, table, self.include)
        return included and not table_matches(schema, table, self.exclude)


class DdlPublisher:
    """Publishes each `DdlEvent` of the selected tables as a control-topic `ddl` event."""

    def __init__(
        self,
        selection: DdlSelection,
        serializer: DdlSerializer,
        produce: Produce,
        data_error: DataErrorHandler,
    ) -> None:
        self.selection = selection
        self.serializer = serializer
        self.produce = produce
        self.data_error = data_error

    def publish(self, event: DdlEvent) -> None:
        try:
            command = parse_ddl(event.content)
        except DdlMessageError as exc:
            self.data_error("bottledwater.ddl", exc)
            return
        names = self.selection.names
        previous = renamed_from(command, names.get(command.table_oid))
        if command.dropped_table:
            names.pop(command.table_oid, None)
        elif command.table_oid:
            names[command.table_oid] = (command.schema, command.table)
        concerned = previous or (command.schema, command.table)
        if not (self.selection.selects(*concerned) or self.selection.selects(command.schema, command.table)):
            return
        qualified = ".".join(concerned)
        try:
            message = self.serializer.ddl(event, command, renamed_from=previous)
        except Exception as exc:  # a registry failure or a value the control schema refuses
            self.data_error(qualified, exc)
            return
        log.info(
            "DDL at %s: %s %s%s",
            format_lsn(event.commit_lsn),
            command.command_tag,
            command.object_identity,
            f" (was {qualified})" if previous else "",
            extra={"table": qualified},
        )
        self.produce(message, qualified, DDL)
