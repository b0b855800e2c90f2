"""Row changes (Insert, Update, Delete): native runs, the per-change fast paths, and the publishing
of every `ChangeEvent`.

Most messages of a busy stream are row changes. With the native codec, consecutive ones of a
relation form a run: `StreamSession.handle` only appends their payloads to `run` while they come
(the hot path, one list append), and the run is encoded with one call when it ends (`flush_run`):
at any other message, at `RUN_CHANGES`, or when the slot has nothing to read. Until then nothing of
them is decoded, numbered or produced; since every other message ends the run first, a run never
spans a Commit, a Relation message or a re-snapshot signal. While a re-snapshot chunk is out every
change must be seen as an event (see `core.incremental`), so no run starts then.

A run or a change the fast paths decline goes to the general path (`decoded`: decoder, assembler,
`publish_change`), one payload at a time, so that it raises the precise error at its place.
"""

from __future__ import annotations

from collections.abc import Callable

from cdc_worker.core.ack import AckTracker, FailurePolicy
from cdc_worker.core.changes.fast_insert import FastInsertPath
from cdc_worker.core.changes.native_changes import NativeChangePath
from cdc_worker.core.encoding.avro_serializer import AvroEventSerializer
from cdc_worker.core.encoding.json_serializer import JsonEventSerializer
from cdc_worker.core.incremental import IncrementalSnapshot
from cdc_worker.core.model import ChangeEvent
from cdc_worker.shell.stream.publishing import TrackedPublisher

# The most row changes one native run holds before it is encoded and produced: bounds its memory
# and how long its first change waits in the worker.
RUN_CHANGES = 1000

Serializer = AvroEventSerializer | JsonEventSerializer


class RowChanges:
    """Owns the pending run (`run`, and `run_relation`: its relation's OID as the 4 bytes that
    follow a row change's type byte) and the paths a row change may take to Kafka. `names` is the
    relation names by OID (`Relations.names`); `decoded` the session's general path."""

    def __init__(
        self,
        *,
        native: NativeChangePath | None,
        fast_insert: FastInsertPath,
        serializer: Serializer,
        out: TrackedPublisher,
        tracker: AckTracker,
        policy: FailurePolicy,
        resnapshot: IncrementalSnapshot,
        names: dict[int, str],
        decoded: Callable[[bytes], None],
    ) -> None:
        self.native = native
        self.fast_insert = fast_insert
        self.serializer = serializer
        self.out = out
        self.tracker = tracker
        self.policy = policy
        self.resnapshot = resnapshot
        self.names = names
        self.decoded = decoded
        self.run: list[bytes] = []
        self.run_relation = b""

    def take(self, payload: bytes) -> None:
        """A row change outside a run (`StreamSession.handle` appends those of the run's relation
        itself): it starts a run when the native codec has a plan for its relation, else it goes
        alone."""
        native = self.native
        if native is not None and self.resnapshot.chunk_table is None and native.starts_run(payload):
            # A new list (`flush_run` made it): a change right after another relation's run starts
            # its own run, never joins the one already handed over.
            self.run.append(payload)
            self.run_relation = payload[1:5]
            return
        self.one(payload)

    def flush_run(self) -> bool:
        """Encode and produce the pending run of native row changes, in order. False when a failure
        under --on-error=exit stopped it (the stream then stops, as after that change alone)."""
        run, self.run = self.run, []
        native = self.native
        if not run or native is None:
            return True
        out, names = self.out, self.names
        if out.native is not None:
            produced = native.produce_run(
                run,
                out.native,
                lambda table: out.native_batch(names[table.oid]),
                stop_on_problem=self.policy is FailurePolicy.EXIT,
            )
            if produced is None:
                return self.each(run)
            done, changed, topic = produced
            return out.settle_run(done, names[changed.oid], topic) and self.each(run[done.rest :])
        encoded = native.encode_run(run)
        if encoded is None:
            return self.each(run)
        items, changed, messages = encoded
        return out.produce_run(items, names[changed.oid], messages)

    def each(self, payloads: list[bytes]) -> bool:
        """Payloads of a run the codec refused, one at a time, so that the general path raises the
        precise error at its place; False when a failure under --on-error=exit stopped them."""
        for payload in payloads:
            self.one(payload)
            if self.tracker.failure is not None:
                return False
        return True

    def one(self, payload: bytes) -> None:
        """One row change, outside a run: the per-change native path, the fused Insert, or the
        general path."""
        if self.resnapshot.chunk_table is None:
            if self.native is not None:
                native = self.native(payload)
                if native is not None:
                    items, changed = native
                    name = self.names[changed.oid]
                    for encoded, op in items:
                        if isinstance(encoded, Exception):
                            self.out.data_error(name, encoded)
                        else:
                            self.out.produce(encoded, name, op)
                    return
            fused = self.fast_insert(payload)
            if fused is not None:
                encoded_insert, table = fused
                self.out.produce(encoded_insert, self.names[table.oid], "c")
                return
        self.decoded(payload)

    def publish_change(self, event: ChangeEvent) -> None:
        """A `ChangeEvent` of the general path (or a re-snapshot's row), encoded and produced."""
        table = self.names[event.table.oid]
        if self.resnapshot.chunk_table == event.table.oid:
            # Before encoding: a change skipped under --on-error=log still makes the chunk's row stale.
            self.resnapshot.observe(event.table.oid, event.key, event.xid)  # type: ignore[arg-type]
        try:
            message = self.serializer(event)
        except Exception as exc:  # data errors and registry failures, under the policy
            self.out.data_error(table, exc)
            return
        if message is not None:
            self.out.produce(message, table, event.op.value)
