"""A committed streamed transaction's spool published in bulk by the native producer.

At a Stream Commit the spool's records are read back in bulk (`SpooledTransaction.drain`: the memory
head as one list, the file in blocks of whole records) and handed, a chunk and a position at a
time, to `bulk`: the native producer takes every change and skip record it can, in order, giving
each the commit's `bw.lsn`, `bw.seq` and `bw.commit_ts` in Rust, and stops before the first record
it does not take. That record takes the reference path (`stream_encoding.replay`) right there, in
its place: a kept message (Relation, Truncate, logical message) goes to the caller, as do a refused
change and a change of the re-snapshot's chunk table (its key is observed); a change of a relation
`bulk` has no topic for yet gets one (`target_of`) and the bulk call resumes with it. So `bw.seq`
numbers every record exactly as `replay` does, and the messages of a key keep their order.

Targets are forgotten after every kept message: a Relation may change a relation's topic, a
re-snapshot signal the chunk table.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Protocol

from cdc_worker.core.changes.assembler import OpenTransaction
from cdc_worker.core.changes.spool import SpoolChunk, record_at
from cdc_worker.core.changes.spool_records import CHANGE
from cdc_worker.core.changes.stream_encoding import RefusedChange, ReplayedChange, StreamEncoder, replay
from cdc_worker.core.pgoutput.decoder import PgOutputMessage

# Where a relation's messages go: its topic, and the producer batch its delivery reports count under.
Target = tuple[str, int]

Item = ReplayedChange | RefusedChange | PgOutputMessage


class BulkProducer(Protocol):
    """Produces the records of `chunk` from `position` on that it takes (changes and skips of the
    relations in `targets`), numbered from `first_seq`: returns the position after them and how
    many records it took, or None when a failure under `--on-error=exit` stops the transaction."""

    def __call__(
        self, chunk: SpoolChunk, position: int, targets: dict[int, Target], first_seq: int
    ) -> tuple[int, int] | None: ...


def commit_in_bulk(
    chunks: Iterable[SpoolChunk],
    txn: OpenTransaction,
    encoder: StreamEncoder,
    *,
    bulk: BulkProducer,
    target_of: Callable[[int], Target | None],
    topic_of: Callable[[int], str],
) -> Iterator[Item]:
    """The items of a committed streamed transaction that `bulk` does not produce, in order, as
    `replay` yields them (the caller handles each before asking for the next). `target_of(oid)` is
    a relation's target, or None for one whose changes must go one at a time through the caller.
    Ends early, after nothing more is produced, when `bulk` says a failure stopped it."""
    targets: dict[int, Target] = {}
    one_by_one: set[int] = set()
    for chunk in chunks:
        end = len(chunk)
        position = 0
        while position < end:
            done = bulk(chunk, position, targets, txn.next_seq)
            if done is None:
                return
            position, taken = done
            txn.next_seq += taken
            if position >= end:
                break
            record, after = record_at(chunk, position)
            oid = _change_relation(record)
            if oid is not None and oid not in targets and oid not in one_by_one:
                target = target_of(oid)
                if target is not None:
                    targets[oid] = target
                    continue
                one_by_one.add(oid)
            kept = False
            for item in replay((record,), txn, encoder, topic_of):
                kept = not isinstance(item, ReplayedChange | RefusedChange)
                yield item
            if kept:
                targets.clear()
                one_by_one.clear()
            position = after


def _change_relation(record: bytes) -> int | None:
    """The relation of a change record (`spool_records.CHANGE`), else None."""
    if len(record) < 6 or record[0] != CHANGE:
        return None
    return int.from_bytes(record[2:6])
