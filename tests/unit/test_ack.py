"""AckTracker: the flushed LSN never passes an undelivered transaction, whatever the callback order."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdc_worker.core.ack import AckTracker, AckTrackerError, DeliveryToken, FailurePolicy
from cdc_worker.core.model import TransactionCommitted

TS = datetime(2024, 1, 1, tzinfo=UTC)
START = 0x100


def txn(end_lsn: int, xid: int = 1) -> TransactionCommitted:
    return TransactionCommitted(xid, end_lsn - 0x10, end_lsn, TS, 0)


def test_flushes_end_lsn_only_when_all_messages_are_delivered() -> None:
    tracker = AckTracker(start_lsn=START)
    a, b = tracker.sent(), tracker.sent()
    tracker.committed(txn(0x200))
    assert tracker.safe_flush_lsn() == START
    tracker.delivered(b)
    assert tracker.safe_flush_lsn() == START
    tracker.delivered(a)
    assert tracker.safe_flush_lsn() == 0x200
    assert tracker.pending_messages == 0


def test_later_transaction_delivered_first_waits_for_the_earlier_one() -> None:
    tracker = AckTracker(start_lsn=START)
    first = tracker.sent()
    tracker.committed(txn(0x200))
    second = tracker.sent()
    tracker.committed(txn(0x300))
    tracker.delivered(second)
    assert tracker.safe_flush_lsn() == START
    tracker.delivered(first)
    assert tracker.safe_flush_lsn() == 0x300


def test_delivery_before_commit_waits_for_the_commit() -> None:
    tracker = AckTracker(start_lsn=START)
    tracker.delivered(tracker.sent())
    assert tracker.safe_flush_lsn() == START  # the transaction may have more messages to come
    tracker.committed(txn(0x200))
    assert tracker.safe_flush_lsn() == 0x200


def test_empty_transaction_advances_at_its_turn() -> None:
    tracker = AckTracker(start_lsn=START)
    token = tracker.sent()
    tracker.committed(txn(0x200))
    tracker.committed(txn(0x300))  # no messages (e.g. only tables outside the publication)
    assert tracker.safe_flush_lsn() == START
    tracker.delivered(token)
    assert tracker.safe_flush_lsn() == 0x300


def test_exit_policy_stops_at_the_failed_transaction() -> None:
    tracker = AckTracker(FailurePolicy.EXIT, start_lsn=START)
    ok = tracker.sent()
    tracker.committed(txn(0x200))
    bad = tracker.sent()
    tracker.committed(txn(0x300))
    after = tracker.sent()
    tracker.committed(txn(0x400))
    tracker.failed(bad, "MSG_SIZE_TOO_LARGE")
    tracker.delivered(after)
    tracker.delivered(ok)
    assert tracker.safe_flush_lsn() == 0x200
    assert tracker.failure is not None and tracker.failure.reason == "MSG_SIZE_TOO_LARGE"
    assert tracker.failure.end_lsn == 0x300
    assert tracker.failed_count == 1
    assert tracker.idle_position(0x900) is None  # nothing past a failure, not even keepalives


def test_a_run_sent_at_once_is_acknowledged_after_its_last_delivery() -> None:
    tracker = AckTracker(start_lsn=START)
    token = tracker.sent_run(3)
    assert tracker.sent() is token and tracker.pending_messages == 4
    tracker.committed(txn(0x200))
    for _ in range(3):
        tracker.delivered(token)
        assert tracker.safe_flush_lsn() == START
    tracker.delivered(token)
    assert tracker.safe_flush_lsn() == 0x200 and tracker.pending_messages == 0


def test_messages_of_a_run_never_handed_over_are_withdrawn() -> None:
    tracker = AckTracker(start_lsn=START)
    token = tracker.sent_run(5)
    tracker.delivered(token)
    tracker.delivered(token)
    tracker.committed(txn(0x200))
    assert tracker.safe_flush_lsn() == START
    tracker.withdrawn(token, 3)
    assert tracker.safe_flush_lsn() == 0x200 and tracker.pending_messages == 0
    with pytest.raises(AckTrackerError):
        tracker.withdrawn(token, 1)


def test_a_token_known_before_its_messages_are_counted_in_bulk() -> None:
    # The native producer is told the transaction's token before the run, counts its deliveries
    # itself and reports them in bulk.
    tracker = AckTracker(start_lsn=START)
    token = tracker.open_token()
    assert tracker.pending_messages == 0 and tracker.open_token() is token
    assert tracker.sent_run(4) is token
    tracker.committed(txn(0x200))
    tracker.delivered(token, 3)
    assert tracker.safe_flush_lsn() == START and tracker.delivered_count == 3
    tracker.delivered(token, 1)
    assert tracker.safe_flush_lsn() == 0x200 and tracker.pending_messages == 0
    with pytest.raises(AckTrackerError):
        tracker.delivered(token, 1)


def test_an_open_token_with_nothing_sent_advances_at_its_commit() -> None:
    tracker = AckTracker(start_lsn=START)
    tracker.open_token()
    tracker.committed(txn(0x200))
    assert tracker.safe_flush_lsn() == 0x200


def test_log_policy_counts_a_failure_as_done() -> None:
    tracker = AckTracker(FailurePolicy.LOG, start_lsn=START)
    bad = tracker.sent()
    tracker.committed(txn(0x200))
    tracker.failed(bad, "boom")
    assert tracker.safe_flush_lsn() == 0x200
    assert tracker.failure is None and tracker.failed_count == 1


def test_idle_position_only_when_nothing_is_in_flight() -> None:
    tracker = AckTracker(start_lsn=START)
    assert tracker.idle_position(0x500) == 0x500
    assert tracker.safe_flush_lsn() == 0x500
    token = tracker.sent()
    assert tracker.idle_position(0x600) is None
    tracker.committed(txn(0x700))
    assert tracker.idle_position(0x800) is None
    tracker.delivered(token)
    assert tracker.safe_flush_lsn() == 0x700
    assert tracker.idle_position(0x650) == 0x700  # never backwards


def test_protocol_misuse_is_an_error() -> None:
    tracker = AckTracker(start_lsn=START)
    token = tracker.sent()
    tracker.delivered(token)
    with pytest.raises(AckTrackerError, match="twice"):
        tracker.delivered(token)
    with pytest.raises(AckTrackerError, match="never sent"):
        tracker.delivered(DeliveryToken())
    tracker.committed(txn(0x200))
    with pytest.raises(AckTrackerError, match="commit order"):
        tracker.committed(txn(0x200))


def test_memory_is_bounded_by_transactions_in_flight() -> None:
    tracker = AckTracker(start_lsn=START)
    for i in range(1, 1001):
        tokens = [tracker.sent() for _ in range(50)]
        assert len({id(t) for t in tokens}) == 1  # one record per transaction, not per message
        tracker.committed(txn(START + i * 0x100))
        for token in tokens:
            tracker.delivered(token)
    assert len(tracker._in_flight) == 0
    assert tracker.safe_flush_lsn() == START + 1000 * 0x100


# -- properties ----------------------------------------------------------------------------------


@dataclass
class Scenario:
    sizes: list[int]  # messages per transaction
    order: list[int]  # permutation of all message indexes: delivery callback order
    failures: set[int]  # message indexes whose delivery fails
    commit_points: list[int]  # how many callbacks have happened when each transaction commits


@st.composite
def scenarios(draw: st.DrawFn, with_failures: bool) -> Scenario:
    sizes = draw(st.lists(st.integers(0, 5), min_size=1, max_size=12))
    total = sum(sizes)
    order = draw(st.permutations(range(total)))
    failures = (
        draw(st.sets(st.integers(0, max(total - 1, 0)), max_size=3)) if with_failures and total else set()
    )
    commit_points = sorted(draw(st.lists(st.integers(0, total), min_size=len(sizes), max_size=len(sizes))))
    return Scenario(sizes, list(order), failures, commit_points)


def run(scenario: Scenario, policy: FailurePolicy) -> tuple[list[int], AckTracker, list[int], list[bool]]:
    """Send every transaction's messages and commit it, interleaving delivery callbacks in the
    drawn order (a callback is only possible once its message was sent). After every step, record
    the safe LSN. Returns the observed LSNs, the tracker, each transaction's end LSN and whether
    each transaction had all its messages delivered (successfully or, under LOG, counted done)."""
    tracker = AckTracker(policy, start_lsn=START)
    ends = [START + (i + 1) * 0x100 for i in range(len(scenario.sizes))]
    owner: list[int] = []
    tokens: list[DeliveryToken] = []
    done = [0] * len(scenario.sizes)
    observed: list[int] = []
    callbacks = 0
    pending = list(scenario.order)

    def deliver_some(until: int) -> None:
        nonlocal callbacks
        while callbacks < until and pending:
            sent_now = [m for m in pending if m < len(tokens)]
            if not sent_now:
                return
            message = sent_now[0]
            pending.remove(message)
            if message in scenario.failures:
                tracker.failed(tokens[message], "boom")
            else:
                tracker.delivered(tokens[message])
            done[owner[message]] += 1
            callbacks += 1
            observed.append(tracker.safe_flush_lsn())
            assert_safe(observed[-1])

    def assert_safe(lsn: int) -> None:
        # The safe LSN never covers a transaction that is not committed and fully settled.
        for index, end in enumerate(ends):
            if end <= lsn:
                assert index < committed_count and done[index] == scenario.sizes[index]
                if policy is FailurePolicy.EXIT:
                    first = [owner[m] for m in scenario.failures if m < len(owner)]
                    assert all(index < f for f in first)

    committed_count = 0
    for index, size in enumerate(scenario.sizes):
        for _ in range(size):
            owner.append(index)
            tokens.append(tracker.sent())
        deliver_some(scenario.commit_points[index])
        tracker.committed(txn(ends[index], xid=index))
        committed_count = index + 1
        observed.append(tracker.safe_flush_lsn())
        assert_safe(observed[-1])
    deliver_some(len(scenario.order))
    assert not pending
    return observed, tracker, ends, [d == s for d, s in zip(done, scenario.sizes, strict=True)]


@settings(max_examples=300, deadline=None)
@given(scenarios(with_failures=False))
def test_property_any_callback_order_is_safe_monotonic_and_complete(scenario: Scenario) -> None:
    observed, tracker, ends, _ = run(scenario, FailurePolicy.EXIT)
    assert observed == sorted(observed)  # monotonic
    assert tracker.safe_flush_lsn() == ends[-1]  # reaches the last transaction once all is delivered
    assert tracker.pending_messages == 0 and tracker.failure is None
    assert tracker.idle_position(ends[-1] + 0x10) == ends[-1] + 0x10


@settings(max_examples=300, deadline=None)
@given(scenarios(with_failures=True))
def test_property_exit_never_passes_a_failed_transaction(scenario: Scenario) -> None:
    observed, tracker, ends, _ = run(scenario, FailurePolicy.EXIT)
    assert observed == sorted(observed)
    owner = [i for i, size in enumerate(scenario.sizes) for _ in range(size)]
    if scenario.failures:
        first_failed = min(owner[m] for m in scenario.failures)
        expected = ends[first_failed - 1] if first_failed else START
        assert tracker.safe_flush_lsn() == expected
        assert tracker.failure is not None and tracker.failed_count == len(scenario.failures)
    else:
        assert tracker.safe_flush_lsn() == ends[-1]


@settings(max_examples=300, deadline=None)
@given(scenarios(with_failures=True))
def test_property_log_counts_failures_as_done(scenario: Scenario) -> None:
    observed, tracker, ends, _ = run(scenario, FailurePolicy.LOG)
    assert observed == sorted(observed)
    assert tracker.safe_flush_lsn() == ends[-1]
    assert tracker.failure is None and tracker.failed_count == len(scenario.failures)
