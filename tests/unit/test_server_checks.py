"""The startup checks of the server and role (`postgres.check_server`), fed the facts a server
would report."""

from __future__ import annotations

import dataclasses

from cdc_worker.shell.postgres.catalog import ServerFacts, check_server
from cdc_worker.shell.postgres.failover import standby_choice
from cdc_worker.shell.postgres.standby import check_standby

HEALTHY = ServerFacts(
    role="bw",
    database="app",
    wal_level="logical",
    encoding="UTF8",
    replication_role=True,
    max_slots=4,
    used_slots=1,
    max_wal_senders=4,
    used_wal_senders=1,
    can_create_publication=True,
    wal_sender_timeout_ms=60000,
)


def test_a_healthy_server_has_no_problems() -> None:
    assert check_server(HEALTHY, creating_slot=True) == []


def test_each_problem_is_one_line_that_names_the_fix() -> None:
    broken = dataclasses.replace(
        HEALTHY, wal_level="replica", encoding="LATIN1", replication_role=False, used_wal_senders=4
    )
    problems = check_server(broken, creating_slot=False)
    assert len(problems) == 4
    assert any("ALTER SYSTEM SET wal_level = logical" in p for p in problems)
    assert any("ALTER ROLE bw REPLICATION" in p for p in problems)
    assert any("max_wal_senders" in p for p in problems)
    assert all("\n" not in p for p in problems)


def test_full_slots_block_creating_a_slot_but_not_resuming_one() -> None:
    full = dataclasses.replace(HEALTHY, used_slots=4)
    assert any("max_replication_slots" in p for p in check_server(full, creating_slot=True))
    assert check_server(full, creating_slot=False) == []


def test_the_slot_of_an_interrupted_snapshot_makes_room_for_its_replacement() -> None:
    # The worker drops that slot before creating the new one, so a full server is no obstacle.
    full = dataclasses.replace(HEALTHY, used_slots=4)
    assert check_server(full, creating_slot=True, replacing_slot=True) == []


def test_a_standby_before_16_is_refused_in_one_line_that_names_the_primary() -> None:
    problems = check_standby(dataclasses.replace(HEALTHY, in_recovery=True, server_version_num=150004))
    assert len(problems) == 1 and "Postgres 15 cannot decode on a standby" in problems[0]
    assert "target_session_attrs=read-write" in problems[0] and "\n" not in problems[0]


def test_a_standby_of_16_is_captured_from_when_it_sends_feedback() -> None:
    standby = dataclasses.replace(
        HEALTHY, in_recovery=True, server_version_num=160002, hot_standby_feedback=True
    )
    assert check_standby(standby) == [] and check_server(standby, creating_slot=True) == []
    (problem,) = check_standby(dataclasses.replace(standby, hot_standby_feedback=False))
    assert "set hot_standby_feedback = on on the standby" in problem and "\n" not in problem
    assert check_standby(HEALTHY) == [], "a primary"


def test_failover_slots_are_off_on_a_standby_and_on_is_refused() -> None:
    assert (
        standby_choice("auto").line
        == "failover slot: off (a standby: Postgres creates failover slots on a primary only)"
    )
    refused = standby_choice("on")
    assert (
        not refused.enabled
        and refused.problem is not None
        and "point -d/--postgres at the primary" in refused.problem
    )
