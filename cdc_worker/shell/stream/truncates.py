"""TRUNCATE events on the control topic, one per truncated table, inside their transaction."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from cdc_worker.core.encoding.serializers import EncodedMessage
from cdc_worker.core.incremental import IncrementalSnapshot
from cdc_worker.core.model import TruncateEvent
from cdc_worker.shell.stream.publishing import TrackedPublisher


class TruncateSerializer(Protocol):
    def truncate(self, event: TruncateEvent) -> Sequence[EncodedMessage]: ...


class TruncatePublisher:
    """Publishes each `TruncateEvent`; a re-snapshot chunk of a truncated table loses its rows."""

    def __init__(
        self, *, serializer: TruncateSerializer, out: TrackedPublisher, resnapshot: IncrementalSnapshot
    ) -> None:
        self.serializer = serializer
        self.out = out
        self.resnapshot = resnapshot

    def publish(self, event: TruncateEvent) -> None:
        for truncated in event.tables:
            self.resnapshot.truncated(truncated.oid, event.xid)
        try:
            messages = self.serializer.truncate(event)
        except Exception as exc:  # data errors and registry failures, under the policy
            self.out.data_error(",".join(t.qualified_name for t in event.tables), exc)
            return
        for message, table in zip(messages, event.tables, strict=True):
            self.out.produce(message, table.qualified_name, "t")
