"""The start-up lines of what the server's version lets the worker do: stored generated columns
(18+) and a failover slot (17+), one line each, the failover warning and problem apart."""

from __future__ import annotations

from cdc_worker.shell.postgres.failover import FailoverFacts, choose_failover
from cdc_worker.shell.postgres.features import GENERATED_COLUMNS_LINE, ServerFeatures


def test_a_resumed_slot_on_an_older_server_says_nothing() -> None:
    features = ServerFeatures(generated_columns=False, failover=None)
    assert (features.lines(), features.warnings, features.problems, features.failover_slot) == (
        [],
        [],
        [],
        False,
    )


def test_generated_columns_and_a_failover_slot_each_have_their_line() -> None:
    choice = choose_failover("auto", FailoverFacts(180001, "", 1))
    features = ServerFeatures(generated_columns=True, failover=choice)
    assert features.lines() == [GENERATED_COLUMNS_LINE, "failover slot: on (1 standby(s) can sync slots)"]
    assert features.failover_slot and len(features.warnings) == 1 and features.problems == []


def test_a_failover_slot_asked_of_16_is_a_problem_not_a_line() -> None:
    features = ServerFeatures(False, choose_failover("on", FailoverFacts(160001, "", 0)))
    assert features.lines() == [] and not features.failover_slot
    assert len(features.problems) == 1 and "Postgres 17" in features.problems[0]
