"""Exactly-once grouping (`core/kafka_transactions.py`): which committed Postgres transactions one
Kafka transaction holds, when it is committed, and what position the slot may acknowledge."""

from __future__ import annotations

import struct
from concurrent.futures import Future
from dataclasses import dataclass

import pytest
from confluent_kafka import KafkaError, KafkaException

from cdc_worker.core.encoding.native_extension import TxnError
from cdc_worker.core.errors import ConfigurationError, InfrastructureError
from cdc_worker.core.kafka_transactions import (
    COMMIT_INTERVAL_S,
    COMMIT_RECORDS,
    QUIET_COMMIT_S,
    AlreadyInKafka,
    TransactionGrouping,
)
from cdc_worker.shell.kafka_transactions import (
    KafkaTransactions,
    ProducerFenced,
    TransactionFailed,
    TransactionsUnavailable,
)
from cdc_worker.shell.snapshot import table_commits
from kafka_contract.topics import transactional_id


def test_nothing_is_acknowledged_past_the_last_kafka_commit() -> None:
    grouping = TransactionGrouping(100)
    assert not grouping.postgres_committed(200, produced=5, now=0.0)
    # Delivered (the tracker says 200) but not committed in Kafka: the slot stays at 100.
    assert grouping.acknowledgeable(200) == 100
    assert grouping.postgres_committed(300, produced=9, now=0.01) is False
    assert grouping.acknowledgeable(300) == 100
    assert grouping.kafka_committed(now=0.02, produced=9) == 300
    assert grouping.acknowledgeable(300) == 300
    assert grouping.visible_lsn == 300 and not grouping.pending


def test_the_tracker_position_caps_what_a_commit_made_visible() -> None:
    grouping = TransactionGrouping(100)
    grouping.postgres_committed(200, produced=1, now=0.0)
    grouping.kafka_committed(now=0.0, produced=1)
    # The tracker is the other bound: nothing undelivered is acknowledged either.
    assert grouping.acknowledgeable(150) == 150
    # With nothing grouped, an idle position (the server's WAL end) stands.
    assert grouping.acknowledgeable(900) == 900


def test_a_commit_is_due_by_records() -> None:
    grouping = TransactionGrouping(0)
    assert not grouping.postgres_committed(10, produced=COMMIT_RECORDS - 1, now=0.0)
    assert grouping.postgres_committed(20, produced=COMMIT_RECORDS, now=0.0)


def test_a_commit_is_due_by_time_since_the_transaction_first_held_something() -> None:
    grouping = TransactionGrouping(0)
    assert not grouping.postgres_committed(10, produced=1, now=0.0)
    assert not grouping.due(COMMIT_INTERVAL_S / 2, produced=2, idle=False)
    assert grouping.due(COMMIT_INTERVAL_S, produced=2, idle=False)


def test_under_a_full_load_commits_are_spaced_by_how_long_the_last_one_took() -> None:
    # A commit waits for every message in flight, and the stream produces nothing meanwhile.
    grouping = TransactionGrouping(0, spacing=20.0)
    grouping.postgres_committed(10, produced=1, now=0.0)
    grouping.kafka_committed(now=0.03, produced=1, took_s=0.03)
    assert not grouping.postgres_committed(20, produced=2, now=0.03)
    assert not grouping.due(0.03 + 0.5, produced=2, idle=False)
    assert grouping.due(0.03 + 0.6, produced=2, idle=False)
    # The slot with nothing more to send still commits at once: latency stays the idle case's.
    assert grouping.due(0.04, produced=2, idle=True)


def test_an_idle_slot_commits_at_once_what_the_transaction_holds() -> None:
    grouping = TransactionGrouping(0)
    grouping.postgres_committed(10, produced=1, now=0.0)
    assert grouping.due(0.0, produced=1, idle=True)


def test_messages_outside_postgres_transactions_are_committed_too() -> None:
    # A progress event or a relation announcement: counted, but no Postgres commit groups it.
    grouping = TransactionGrouping(0)
    grouping.kafka_committed(now=0.0, produced=0)
    assert not grouping.due(0.0, produced=1, idle=False)
    assert grouping.due(COMMIT_INTERVAL_S, produced=1, idle=False)
    assert grouping.due(0.0, produced=1, idle=True)


def test_an_empty_transaction_is_committed_only_now_and_then() -> None:
    grouping = TransactionGrouping(0, now=0.0)
    assert not grouping.due(0.5, produced=0, idle=True)
    assert grouping.due(QUIET_COMMIT_S, produced=0, idle=True)


def test_the_commit_clock_restarts_with_each_kafka_transaction() -> None:
    grouping = TransactionGrouping(0)
    grouping.postgres_committed(10, produced=1, now=0.0)
    grouping.kafka_committed(now=1.0, produced=1)
    assert not grouping.postgres_committed(20, produced=2, now=1.0)
    assert not grouping.due(1.0 + COMMIT_INTERVAL_S / 2, produced=2, idle=False)
    assert grouping.due(1.0 + 2 * COMMIT_INTERVAL_S, produced=2, idle=False)
    assert grouping.grouped == 1


def test_the_grouped_transactions_of_an_aborted_kafka_transaction_stay_unacknowledged() -> None:
    # An abort (or a crash) is not reported to the grouping: it never saw a commit, so the
    # position stays where the last commit left it and Postgres sends those transactions again.
    grouping = TransactionGrouping(100)
    grouping.postgres_committed(200, produced=3, now=0.0)
    grouping.postgres_committed(300, produced=6, now=0.0)
    assert grouping.acknowledgeable(300) == 100
    assert grouping.grouped == 2


# -- the shell's transactional calls and their one-line errors, on a fake producer -------------


class FakeCalls:
    def __init__(self) -> None:
        self.calls: list[str] = []
        self.fail: dict[str, list[TxnError]] = {}
        self.positions: list[tuple[str, int, int, str]] = []

    def _next(self, name: str) -> TxnError | None:
        self.calls.append(name)
        errors = self.fail.get(name)
        return errors.pop(0) if errors else None

    def init_transactions(self, timeout: float) -> TxnError | None:
        return self._next("init")

    def begin_transaction(self) -> TxnError | None:
        return self._next("begin")

    def commit_transaction(self, timeout: float) -> TxnError | None:
        return self._next("commit")

    def abort_transaction(self, timeout: float) -> TxnError | None:
        return self._next("abort")

    def send_position(
        self, topic: str, partition: int, offset: int, group_id: str, timeout: float
    ) -> TxnError | None:
        self.positions.append((topic, partition, offset, group_id))
        return self._next("position")


def started(calls: FakeCalls, missing: int = 0) -> KafkaTransactions:
    transactions = KafkaTransactions(
        calls, "bottledwater-s", broker="k:9092", flush=lambda _: missing, position_topic="ctl"
    )
    transactions.start()
    return transactions


def test_the_transactional_id_is_the_slots() -> None:
    assert transactional_id("s", None) == "bottledwater-s"
    assert transactional_id("s", "shop") == "bottledwater-shop-s"


def test_commit_begins_the_next_transaction() -> None:
    calls = FakeCalls()
    transactions = started(calls)
    transactions.commit()
    assert calls.calls == ["init", "begin", "commit", "begin"]
    assert transactions.open


def test_a_broker_without_transactions_is_a_configuration_error_naming_the_fix() -> None:
    calls = FakeCalls()
    calls.fail["init"] = [("_TIMED_OUT", "Local: Timed out", False, False, True)]
    with pytest.raises(TransactionsUnavailable) as raised:
        started(calls)
    assert isinstance(raised.value, ConfigurationError)
    assert "transaction.state.log.replication.factor" in str(raised.value)
    assert "--delivery at-least-once" in str(raised.value)
    assert "\n" not in str(raised.value)


def test_a_fenced_producer_stops_with_one_line_naming_two_workers() -> None:
    calls = FakeCalls()
    transactions = started(calls)
    calls.fail["commit"] = [
        ("_FENCED", "Local: This instance has been fenced by a newer instance", True, False, False)
    ]
    with pytest.raises(ProducerFenced) as raised:
        transactions.commit()
    assert isinstance(raised.value, ConfigurationError)
    assert "one worker per slot" in str(raised.value)
    assert "abort" not in calls.calls  # a fenced producer can abort nothing


def test_a_timed_out_transaction_is_aborted_and_the_worker_restarts() -> None:
    calls = FakeCalls()
    transactions = started(calls)
    calls.fail["commit"] = [("INVALID_PRODUCER_EPOCH_X", "Transaction timed out", False, True, False)]
    with pytest.raises(TransactionFailed) as raised:
        transactions.commit()
    assert isinstance(raised.value, InfrastructureError)
    assert "transaction.timeout.ms" in str(raised.value)
    assert calls.calls[-1] == "abort"


def test_a_retriable_commit_is_tried_again() -> None:
    calls = FakeCalls()
    transactions = started(calls)
    calls.fail["commit"] = [("COORDINATOR_LOAD_IN_PROGRESS", "loading", False, False, True)]
    transactions.commit()
    assert calls.calls.count("commit") == 2


def test_undelivered_messages_abort_the_transaction() -> None:
    calls = FakeCalls()
    transactions = started(calls, missing=3)
    with pytest.raises(TransactionFailed, match="3 messages not delivered"):
        transactions.commit()
    assert "commit" not in calls.calls and calls.calls[-1] == "abort"


def test_each_commit_records_its_position_in_the_transaction() -> None:
    calls = FakeCalls()
    transactions = started(calls)
    transactions.commit(1000)
    assert calls.positions == [("ctl", 0, 1000, "bottledwater-s")]
    assert calls.calls == ["init", "begin", "position", "commit", "begin"]
    assert transactions.committed_lsn == 1000
    transactions.commit(None)  # nothing new: no position to record
    assert len(calls.positions) == 1 and transactions.committed_lsn == 1000


def test_a_position_not_recorded_aborts_and_is_not_taken() -> None:
    calls = FakeCalls()
    transactions = started(calls)
    calls.fail["position"] = [("COORDINATOR_NOT_AVAILABLE", "no coordinator", False, True, False)]
    with pytest.raises(TransactionFailed, match="record its position"):
        transactions.commit(1000)
    assert transactions.committed_lsn == 0 and "commit" not in calls.calls


def test_a_stream_stopped_on_a_fenced_producers_deliveries_says_fenced() -> None:
    calls = FakeCalls()
    transactions = started(calls)
    assert transactions.fenced_by("change of t not delivered: Local: Purged in queue") is None
    old_epoch = "change of t not delivered: Broker: Producer attempted an operation with an old epoch"
    assert isinstance(transactions.fenced_by(old_epoch), ProducerFenced)
    # Purged deliveries alone say nothing; the abort's fatal answer does.
    calls.fail["abort"] = [
        ("_FENCED", "This instance has been fenced by a newer instance", True, False, False)
    ]
    transactions = started(calls)
    transactions.abort()
    fenced = transactions.fenced_by("change of t not delivered: Local: Purged in queue")
    assert isinstance(fenced, ProducerFenced) and "run one worker per slot" in str(fenced)


def test_a_new_slot_records_its_start_even_behind_an_older_position() -> None:
    calls = FakeCalls()
    transactions = started(calls)
    transactions.commit(5000)
    transactions.commit(100, restart=True)
    assert calls.positions[-1] == ("ctl", 0, 100, "bottledwater-s")
    assert transactions.committed_lsn == 100


def _begin(final_lsn: int) -> bytes:
    return b"B" + struct.pack(">QQI", final_lsn, 0, 7)


def _message(prefix: bytes) -> bytes:
    return b"M" + struct.pack(">BQ", 1, 5) + prefix + b"\0" + struct.pack(">I", 2) + b"{}"


COMMIT = b"C" + bytes(25)
INSERT, TRUNCATE, RELATION = b"I" + bytes(8), b"T" + bytes(9), b"R" + bytes(8)


def test_what_kafka_holds_is_read_again_without_its_changes() -> None:
    held = AlreadyInKafka(through=500)
    kept = [
        held.admit(p) is None
        for p in (_begin(200), RELATION, INSERT, TRUNCATE, _message(b"bottledwater.ddl"))
    ]
    assert kept == [False, False, True, True, True]
    # The re-snapshot's watermark is read again: a restart goes on from the chunk it names.
    assert held.admit(_message(b"bottledwater")) is not None
    assert held.admit(COMMIT) is not None
    assert (held.transactions, held.dropped, held.done) == (1, 3, False)


def test_the_first_transaction_past_kafkas_position_is_published() -> None:
    held = AlreadyInKafka(through=500)
    assert held.admit(_begin(450)) is not None and held.admit(INSERT) is None
    held.admit(COMMIT)
    # Kafka recorded the end of the commit at 450: a commit record starting at 500 is the next one.
    assert held.admit(_begin(500)) is not None
    assert held.done
    assert held.admit(INSERT) is not None and held.admit(_message(b"bottledwater.ddl")) is not None


def test_a_streamed_transaction_is_held_by_its_commit_lsn() -> None:
    held = AlreadyInKafka(through=500)
    assert held.streamed_held(499) and not held.streamed_held(500)
    assert held.transactions == 1
    # Outside a transaction nothing is dropped: a non-transactional message, a keepalive's kind.
    assert held.admit(_message(b"other")) is not None


def _insert(relation: int) -> bytes:
    return b"I" + struct.pack(">I", relation) + b"N" + struct.pack(">H", 0)


def _truncate(*relations: int) -> bytes:
    return b"T" + struct.pack(">IB", len(relations), 0) + b"".join(struct.pack(">I", r) for r in relations)


def test_a_table_read_after_the_slot_drops_its_changes_before_its_point() -> None:
    # Table 11 was read at the slot's snapshot point, table 12 at 700 by a later start.
    held = AlreadyInKafka(0, {12: 700})
    assert held.admit(_begin(650)) is not None
    assert held.admit(_insert(11)) is not None
    assert held.admit(_insert(12)) is None
    # A TRUNCATE of both is published for table 11 only: table 12's rows show it already.
    assert held.admit(_truncate(11, 12)) == _truncate(11)
    assert held.admit(_truncate(12)) is None
    assert held.admit(COMMIT) is not None and not held.done
    # From a commit at the point on, every change is new.
    assert held.admit(_begin(700)) is not None
    assert held.admit(_insert(12)) is not None and held.done
    assert held.dropped == 3


def test_table_points_leave_streamed_chunks_to_their_stream_commit() -> None:
    held = AlreadyInKafka(0, {12: 700})
    assert held.admit(_begin(600)) is not None and held.admit(COMMIT) is not None
    # Inside a chunk the bytes after the kind are the xid, not a relation: nothing is judged there.
    chunk = [b"S" + struct.pack(">IB", 12, 1), b"I" + struct.pack(">II", 12, 12), b"E"]
    assert [held.admit(p) for p in chunk] == chunk
    assert held.table_held(12, 699) and not held.table_held(12, 700) and not held.table_held(11, 1)
    assert held.truncated([11, 12], 699) == [11]


def test_kafkas_position_and_table_points_apply_together() -> None:
    held = AlreadyInKafka(500, {12: 700})
    held.admit(_begin(450))
    assert held.admit(_insert(11)) is None  # in Kafka already, whatever the table
    held.admit(COMMIT)
    held.admit(_begin(600))
    assert held.admit(_insert(11)) is not None and held.admit(_insert(12)) is None
    assert not held.done


# -- deleting an earlier slot's snapshot points: a fake admin client, for a coordinator that is
# still loading (the stack's broker, warm by the time the tests run, cannot be made to answer so) --


class FakeGroupAdmin:
    """Answers `delete_consumer_groups` with the given error codes in turn, then success."""

    def __init__(self, codes: list[int]) -> None:
        self.codes = codes
        self.asked = 0

    def delete_consumer_groups(self, groups: list[str], request_timeout: float) -> dict[str, Future[None]]:
        self.asked += 1
        answer: Future[None] = Future()
        if self.codes:
            answer.set_exception(KafkaException(KafkaError(self.codes.pop(0))))
        else:
            answer.set_result(None)
        return {groups[0]: answer}


@dataclass
class FakePublisher:
    admin: FakeGroupAdmin
    broker: str = "k:9092"


def test_a_new_slots_snapshot_waits_out_a_group_coordinator_that_is_loading(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(table_commits, "COORDINATOR_RETRY_S", 0.0)
    moving = [KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_LOAD_IN_PROGRESS]
    admin = FakeGroupAdmin(moving)
    table_commits.forget_points(FakePublisher(admin), "bottledwater-s")  # type: ignore[arg-type]
    assert admin.asked == 3
    gone = FakeGroupAdmin([KafkaError.GROUP_ID_NOT_FOUND])
    table_commits.forget_points(FakePublisher(gone), "bottledwater-s")  # type: ignore[arg-type]
    assert gone.asked == 1


def test_a_group_the_worker_may_not_delete_is_one_line_naming_the_grant(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(table_commits, "COORDINATOR_RETRY_S", 0.0)
    refused = FakeGroupAdmin([KafkaError.GROUP_AUTHORIZATION_FAILED])
    with pytest.raises(TransactionsUnavailable) as raised:
        table_commits.forget_points(FakePublisher(refused), "bottledwater-s")  # type: ignore[arg-type]
    line = str(raised.value)
    assert "bottledwater-s-snapshot" in line and "grant the worker's principal DELETE" in line
    assert "\n" not in line
    monkeypatch.setattr(table_commits, "POINTS_TIMEOUT_S", 0.0)
    stuck = FakeGroupAdmin([KafkaError.COORDINATOR_NOT_AVAILABLE] * 3)
    with pytest.raises(TransactionsUnavailable, match="group coordinator is up"):
        table_commits.forget_points(FakePublisher(stuck), "bottledwater-s")  # type: ignore[arg-type]
