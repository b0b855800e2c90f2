"""Relation messages: each new relation version's key from the catalog, its types, its name and its
topic.

Postgres sends a Relation message before the first change of a relation in a session and after each
change of its schema. The assembler keeps the schema versions (`ChangeAssembler.schema`); here are
the catalog look-ups they need (the key the catalog gives, the types not seen before) and the topic,
created before any change of the relation is produced.
"""

from __future__ import annotations

import logging
import time
from collections.abc import MutableMapping, Sequence

import psycopg2
import psycopg2.extensions

from cdc_worker.core.changes.assembler import ChangeAssembler, replica_identity_key_columns
from cdc_worker.core.errors import ConfigurationError
from cdc_worker.core.lsn import format_lsn
from cdc_worker.core.model import TableSchema, TypeInfo
from cdc_worker.core.pgoutput.decoder import Relation
from cdc_worker.shell.kafka_publisher import KafkaPublisher, TopicSpec
from cdc_worker.shell.postgres import truncate_guard
from cdc_worker.shell.postgres.catalog import connection_lost, load_tables
from cdc_worker.shell.postgres.type_catalog import load_type_infos
from cdc_worker.shell.stream.position import StreamPosition
from kafka_contract.topics import topic_name

log = logging.getLogger(__name__)

_PUBLISHED_AS_ROOT = """
SELECT c.relispartition
       AND EXISTS (SELECT 1 FROM pg_publication p WHERE p.pubname = ANY (%s) AND p.pubviaroot)
  FROM pg_class c WHERE c.oid = %s
"""


# How often the captured roots' partitions are looked at for one attached (or created) since: an
# ATTACH sends nothing through pgoutput; one catalog query (milliseconds) every few seconds.
PARTITION_CHECK_INTERVAL_S = 5.0
# A root whose guard failed (no privilege, a lock held past the timeout) is tried again this much
# later, not at every look: a failed CREATE TRIGGER is an error in the server's log.
UNGUARDABLE_RETRY_S = 60.0


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
        watch_partitions: bool = False,
        announce: bool = True,
    ) -> None:
        self.catalog = catalog
        self.publications = list(publications)
        self.assembler = assembler
        self.type_infos = type_infos
        self.publisher = publisher
        self.topic_prefix = topic_prefix
        self.names: dict[int, str] = {}
        # `watch_partitions`: partitioned tables are captured as one, on a primary (see
        # `check_partitions`); `announce`: the server sends back the re-snapshot requests (14+).
        self.watch_partitions = watch_partitions
        self.announce = announce
        self._checked = time.monotonic()
        self._failed: dict[int, float] = {}  # root OID -> when its guard last failed
        self._warned: set[int] = set()  # roots named in a warning already: once is enough

    def described(self, message: Relation) -> None:
        """A Relation message the assembler has taken: its name, its types, its topic."""
        self.names[message.schema.oid] = message.schema.qualified_name
        self.prepare_types(message)
        if self._published_as_root(message.schema.oid):
            # A leaf created or attached since the start gets its TRUNCATE guard now, with its first
            # change, before that change is acknowledged.
            for warning in truncate_guard.guard_leaf(
                self.catalog, message.schema.oid, announce=self.announce
            ):
                log.warning("%s", warning)
            return
        schema = self.assembler.schema(message.schema.oid)
        # Naming, not the serializer: compiling a plan would register schemas, a data-path step
        # that must fail under --on-error with the event, not here.
        self.publisher.ensure_topics([TopicSpec(topic_name(schema, self.topic_prefix), schema.is_keyed)])

    def check_partitions(self) -> None:
        """Every `PARTITION_CHECK_INTERVAL_S`: guard the captured roots' leaves that are not, and so
        ask for the rows of one attached with rows (`truncate_guard.guard_new_leaves`). A root that
        could not be guarded is named once, and tried again every `UNGUARDABLE_RETRY_S`."""
        now = time.monotonic()
        if not self.watch_partitions or now - self._checked < PARTITION_CHECK_INTERVAL_S:
            return
        self._checked = now
        resting = frozenset(oid for oid, failed in self._failed.items() if now - failed < UNGUARDABLE_RETRY_S)
        try:
            found = truncate_guard.guard_new_leaves(
                self.catalog, self.publications, skip=resting, announce=self.announce
            )
        except psycopg2.Error as exc:
            if connection_lost(exc):
                raise  # the stream reconnects (--reconnect-timeout), as for any lost connection
            # A look that failed is no reason to stop the stream: the next one comes soon.
            log.warning(
                "cannot look for partitions attached to the captured tables (%s); trying again in %.0fs",
                exc.diag.message_primary or str(exc).strip(),
                PARTITION_CHECK_INTERVAL_S,
            )
            return
        for root, warnings in found.items():
            if not warnings:
                self._failed.pop(root, None)
                continue
            self._failed[root] = now
            if root not in self._warned:
                self._warned.add(root)
                for warning in warnings:
                    log.warning("%s", warning)

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
