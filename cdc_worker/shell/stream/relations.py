"""Relation messages: each new relation version's key from the catalog, its types, its name and its
topic.

Postgres sends a Relation message before the first change of a relation in a session and after each
change of its schema. The assembler keeps the schema versions (`ChangeAssembler.schema`); here are
the catalog look-ups they need (the key the catalog gives, the types not seen before) and the topic,
created before any change of the relation is produced.
"""

from __future__ import annotations

import logging
from collections.abc import MutableMapping, Sequence

import psycopg2.extensions

from cdc_worker.core.changes.assembler import ChangeAssembler, replica_identity_key_columns
from cdc_worker.core.errors import ConfigurationError
from cdc_worker.core.lsn import format_lsn
from cdc_worker.core.model import TableSchema, TypeInfo
from cdc_worker.core.pgoutput.decoder import Relation
from cdc_worker.shell.kafka_publisher import KafkaPublisher, TopicSpec
from cdc_worker.shell.postgres import truncate_guard
from cdc_worker.shell.postgres.catalog import load_tables
from cdc_worker.shell.postgres.type_catalog import load_type_infos
from cdc_worker.shell.stream.position import StreamPosition
from kafka_contract.topics import topic_name

log = logging.getLogger(__name__)

_PUBLISHED_AS_ROOT = """
SELECT c.relispartition
       AND EXISTS (SELECT 1 FROM pg_publication p WHERE p.pubname = ANY (%s) AND p.pubviaroot)
  FROM pg_class c WHERE c.oid = %s
"""


class StreamError(ConfigurationError, RuntimeError):
    """The stream cannot go on (bad schema, unkeyed table added without -u ...)."""


class KeyColumns:
    """The assembler's `key_columns_for`: the key the catalog gives (primary key, or replica
    identity index); pgoutput's flags when the catalog has moved on (a key column renamed or
    dropped since this WAL was written). An unkeyed table stops the stream unless allowed."""

    def __init__(
        self, catalog: psycopg2.extensions.connection, position: StreamPosition, *, allow_unkeyed: bool
    ) -> None:
        self.catalog = catalog
        self.position = position
        self.allow_unkeyed = allow_unkeyed

    def __call__(self, table: TableSchema) -> tuple[str, ...]:
        found = load_tables(self.catalog, oids=[table.oid])
        names = {c.name for c in table.columns}
        if found and all(k in names for k in found[0].schema.key_columns):
            key = found[0].schema.key_columns
        else:
            key = replica_identity_key_columns(table)
        if not key and not self.allow_unkeyed:
            raise StreamError(
                f"table {table.qualified_name} has no primary key or replica identity index (at LSN "
                f"{format_lsn(self.position.commit_lsn)}): add one, remove the table from the "
                "publication, or restart with -u/--allow-unkeyed"
            )
        return key


class Relations:
    """What the stream knows of each relation beyond the assembler: its qualified name by OID (for
    counters, logs and errors), the types the serializer resolves (`type_infos`, extended in place),
    and its topic."""

    def __init__(
        self,
        *,
        catalog: psycopg2.extensions.connection,
        assembler: ChangeAssembler,
        type_infos: MutableMapping[int, TypeInfo],
        publisher: KafkaPublisher,
        topic_prefix: str | None,
        publications: Sequence[str] = (),
    ) -> None:
        self.catalog = catalog
        self.publications = list(publications)
        self.assembler = assembler
        self.type_infos = type_infos
        self.publisher = publisher
        self.topic_prefix = topic_prefix
        self.names: dict[int, str] = {}

    def described(self, message: Relation) -> None:
        """A Relation message the assembler has taken: its name, its types, its topic."""
        self.names[message.schema.oid] = message.schema.qualified_name
        self.prepare_types(message)
        if self._published_as_root(message.schema.oid):
            # A leaf created or attached since the start gets its TRUNCATE guard now, with its first
            # change, before that change is acknowledged.
            for warning in truncate_guard.guard_leaf(self.catalog, message.schema.oid):
                log.warning("%s", warning)
            return
        schema = self.assembler.schema(message.schema.oid)
        # Naming, not the serializer: compiling a plan would register schemas, a data-path step
        # that must fail under --on-error with the event, not here.
        self.publisher.ensure_topics([TopicSpec(topic_name(schema, self.topic_prefix), schema.is_keyed)])

    def _published_as_root(self, oid: int) -> bool:
        """Whether `oid` is a partition whose changes arrive as its root's (`--partitions root`):
        Postgres 15+ describes such a leaf right after its root, though every change names the
        root, so the leaf gets no topic."""
        with self.catalog.cursor() as cur:
            cur.execute(_PUBLISHED_AS_ROOT, (self.publications, oid))
            row = cur.fetchone()
        return bool(row and row[0])

    def prepare_types(self, message: Relation) -> None:
        """The types of `message`'s columns not seen before, read from the catalog."""
        missing = {c.type_oid for c in message.schema.columns} - self.type_infos.keys()
        if missing:
            self.type_infos.update(load_type_infos(self.catalog, missing))
