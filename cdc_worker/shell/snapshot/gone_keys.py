"""A snapshot over topics that already hold rows (after an interrupted snapshot, or a dropped
slot) retracts what is gone: it reads the keys the keyed tables' topics hold before it starts,
strikes off every key it publishes again, and tombstones the rest at its own LSN. Without that the
compacted topics (and the mirrors merged from them) would keep rows deleted while nothing captured
them, forever.

Shared by both engines: the worker's snapshot strikes keys off in its own process; on Spark each
task records which of the known keys its range published (`SeenKeys`) and the driver subtracts.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet

from confluent_kafka import KafkaError, Message

from cdc_worker.core.encoding.serializers import EncodedMessage
from cdc_worker.core.model import Op
from cdc_worker.shell.kafka_publisher import KafkaPublisher
from cdc_worker.shell.kafka_reader import live_keys
from cdc_worker.shell.metrics import WorkerMetrics
from cdc_worker.shell.postgres.catalog import CatalogTable
from cdc_worker.shell.snapshot.chunks import SNAPSHOT_SEQ, SNAPSHOT_XID, SnapshotSpec
from kafka_contract.headers import HEADER_COMMIT_TS, HEADER_LSN, HEADER_OP, HEADER_SEQ, HEADER_XID, iso_utc
from kafka_contract.topics import topic_name

log = logging.getLogger(__name__)

DeliveryCallback = Callable[[KafkaError | None, Message], None]


class SeenKeys:
    """One Spark task's tally: the known keys its range published again. Unlike a shared set it
    never changes `known` (the broadcast every task of the executor reads), and it travels back to
    the driver without it (only what the range saw)."""

    def __init__(self, known: AbstractSet[bytes]) -> None:
        self.known = known
        self.seen: set[bytes] = set()
        self.skipped_a_row = False

    def __getstate__(self) -> dict[str, object]:
        return {"known": frozenset(), "seen": self.seen, "skipped_a_row": self.skipped_a_row}

    def discard(self, key: bytes, /) -> None:
        if key in self.known:
            self.seen.add(key)

    def clear(self) -> None:
        self.skipped_a_row = True


def existing_keys(
    publisher: KafkaPublisher, tables: Sequence[CatalogTable], topic_prefix: str | None
) -> dict[int, set[bytes]]:
    """Per keyed table (by oid) whose topic holds rows: the keys a compacted reading of it holds."""
    found: dict[int, set[bytes]] = {}
    for table in tables:
        if not table.schema.is_keyed:
            continue  # an append-only topic: nothing can be retracted from it
        name = topic_name(table.schema, topic_prefix)
        keys = live_keys(publisher, name)
        if keys:
            found[table.schema.oid] = keys
            log.info(
                "topic %s already holds %d keys: those the snapshot does not find again get tombstones",
                name,
                len(keys),
                extra={"topic": name},
            )
    return found


def gone_keys(
    known: Mapping[int, set[bytes]], tallies: Sequence[tuple[int, SeenKeys]]
) -> dict[int, set[bytes]]:
    """The known keys no range published again, per table; none for a table one of whose ranges
    skipped a row (its key could be among the "gone" ones: better keep a deleted row than delete a
    live one)."""
    seen: dict[int, set[bytes]] = {}
    skipped: set[int] = set()
    for oid, tally in tallies:
        seen.setdefault(oid, set()).update(tally.seen)
        if tally.skipped_a_row:
            skipped.add(oid)
    return {
        oid: keys - seen.get(oid, set())
        for oid, keys in known.items()
        if oid not in skipped and keys - seen.get(oid, set())
    }


def publish_tombstones(
    publisher: KafkaPublisher,
    *,
    spec: SnapshotSpec,
    tables: Sequence[CatalogTable],
    gone: Mapping[int, set[bytes]],
    topic_prefix: str | None,
    on_delivery: Callable[[str], DeliveryCallback],
    metrics: WorkerMetrics | None = None,
) -> int:
    """Tombstones, at the snapshot's LSN, for the keys the topics hold but the snapshot did not find
    (rows deleted while no snapshot or stream ran). Handed to the producer; the caller flushes."""
    headers = [
        (HEADER_OP, Op.DELETE.value.encode()),
        (HEADER_LSN, str(spec.lsn).encode()),
        (HEADER_SEQ, str(SNAPSHOT_SEQ).encode()),
        (HEADER_XID, str(SNAPSHOT_XID).encode()),
        (HEADER_COMMIT_TS, iso_utc(spec.snapshot_time).encode()),
    ]
    published = 0
    for table in tables:
        keys = gone.get(table.schema.oid)
        if not keys:
            continue
        name = topic_name(table.schema, topic_prefix)
        log.info("%d keys of %s are gone since its topic was written: publishing tombstones", len(keys), name)
        callback = on_delivery(table.qualified_name)
        for key in keys:
            publisher.produce(EncodedMessage(name, key, None, list(headers)), callback)
        published += len(keys)
        if metrics is not None:
            metrics.events.labels(table.qualified_name, Op.DELETE.value).inc(len(keys))
    return published
