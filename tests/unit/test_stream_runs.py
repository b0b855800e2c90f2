"""The stream's produce side of a native run (`TrackedPublisher.produce_run`): data errors inside a
run are reported at their place and, under --on-error=exit, stop it where the per-change path
stops, with nothing after the failure handed to Kafka and nothing of the run left in flight.

The producer is a real one whose broker does not exist: messages are queued, never delivered.
"""

from __future__ import annotations

import logging

import pytest

from cdc_worker.core.ack import AckTracker, FailurePolicy
from cdc_worker.core.changes.native_changes import NativeItem
from cdc_worker.core.encoding.serializers import EncodedMessage
from cdc_worker.shell.kafka_publisher import KafkaPublisher
from cdc_worker.shell.stream.publishing import TrackedPublisher

NOWHERE = "127.0.0.1:1"  # nothing listens there
TOPIC = "bw.public.t"


def publisher_for(policy: FailurePolicy) -> tuple[TrackedPublisher, AckTracker]:
    kafka = KafkaPublisher(NOWHERE, {"message.timeout.ms": "60000", "log_level": "0"})
    kafka.open()
    tracker = AckTracker(policy)
    out = TrackedPublisher(
        publisher=kafka,
        tracker=tracker,
        policy=policy,
        metrics=None,
        while_waiting=lambda: None,
        current_lsn=lambda: 0x16B3748,
    )
    return out, tracker


def run_items(errors_at: set[int], size: int = 6) -> list[NativeItem]:
    return [
        (ValueError(f"bad value in change {i}"), "encoding")
        if i in errors_at
        else (EncodedMessage(TOPIC, str(i).encode(), b"{}", []), "c" if i % 2 else "u")
        for i in range(size)
    ]


def test_a_run_without_errors_is_handed_over_whole_and_counted() -> None:
    out, tracker = publisher_for(FailurePolicy.EXIT)
    assert out.produce_run(run_items(set()), "public.t", 6) is True
    assert out.published == 6 and tracker.pending_messages == 6
    assert out._event_counts == {("public.t", "u"): 3, ("public.t", "c"): 3}


def test_under_exit_a_data_error_stops_the_run_at_its_place(caplog: pytest.LogCaptureFixture) -> None:
    out, tracker = publisher_for(FailurePolicy.EXIT)
    with caplog.at_level(logging.ERROR):
        assert out.produce_run(run_items({2, 4}), "public.t", 4) is False
    assert out.published == 2  # changes 0 and 1, nothing after the error
    assert tracker.pending_messages == 2  # the two never handed over were withdrawn
    assert tracker.failure is not None
    assert tracker.failure.reason == (
        "change of public.t at commit LSN 0/16B3748 cannot be encoded: bad value in change 2"
    )
    assert [r.getMessage() for r in caplog.records] == [tracker.failure.reason]


def test_under_log_every_data_error_of_a_run_is_reported_and_the_rest_published(
    caplog: pytest.LogCaptureFixture,
) -> None:
    out, tracker = publisher_for(FailurePolicy.LOG)
    with caplog.at_level(logging.WARNING):
        assert out.produce_run(run_items({2, 4}), "public.t", 4) is True
    assert out.published == 4 and out.skipped == 2
    assert tracker.pending_messages == 4 and tracker.failure is None
    assert [r.getMessage() for r in caplog.records] == [
        "skipped (--on-error=log): change of public.t at commit LSN 0/16B3748 cannot be encoded: "
        f"bad value in change {i}"
        for i in (2, 4)
    ]
