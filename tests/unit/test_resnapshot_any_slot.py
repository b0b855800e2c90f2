"""A re-snapshot request for every slot (a partition attached with rows, asked for by whichever
worker guarded it first): each worker takes the partitions whose root it publishes as one table,
under its own slot, and ignores the request when there are none."""

from __future__ import annotations

from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any, cast

from cdc_worker.core.incremental import ANY_SLOT, SIGNAL_PREFIX, IncrementalSnapshot, request_content
from cdc_worker.core.pgoutput.messages import Begin, LogicalMessage
from cdc_worker.shell.stream.position import StreamPosition
from cdc_worker.shell.stream.resnapshot import ResnapshotDriver

SLOT = "mine"
LSN = 0x1000


def driver(published_as_root: set[tuple[str, str]]) -> ResnapshotDriver:
    chunks = SimpleNamespace(published_as_root=lambda schema, name: (schema, name) in published_as_root)
    position = StreamPosition()
    position.began(Begin(LSN, datetime.now(UTC), 0, 700))
    unused = cast(Any, None)
    return ResnapshotDriver(
        state=IncrementalSnapshot(SLOT),
        chunks=cast(Any, chunks),
        stream=unused,
        publisher=unused,
        serializer=unused,
        topic_prefix=None,
        remember_table=lambda oid, name: None,
        position=position,
    )


def signal(on: ResnapshotDriver, slot: str, *tables: tuple[str, str]) -> list[tuple[tuple[str, ...], str]]:
    """The driver's queue after one request from `slot` for `tables`: (request ids, table) each."""
    content = request_content(slot, "req", list(tables))
    on.signal(LogicalMessage(True, LSN, SIGNAL_PREFIX, content, 700))
    progress = on.state.progress
    return [(t.request_ids, t.qualified_name) for t in (progress.queue if progress else ())]


def test_a_request_for_every_slot_takes_the_partitions_published_under_their_root_here() -> None:
    here = driver({("public", "events_latam")})
    queued = signal(here, ANY_SLOT, ("public", "events_latam"), ("public", "other_root_leaf"))
    assert queued == [(("req",), "public.events_latam")]
    assert here.state.hold_lsn == LSN, "held at the request, as one of its own: a restart reads it again"


def test_a_request_for_every_slot_with_none_of_ours_is_ignored() -> None:
    elsewhere = driver(set())  # another root's worker, or --partitions leaf
    assert signal(elsewhere, ANY_SLOT, ("public", "events_latam")) == []
    assert elsewhere.state.hold_lsn is None


def test_requests_for_one_slot_are_as_before() -> None:
    here = driver(set())
    assert signal(here, "another", ("public", "t")) == []
    assert signal(here, SLOT, ("public", "t")) == [(("req",), "public.t")]
