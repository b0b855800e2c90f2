"""Reconnecting after a lost connection (shell/postgres/reconnect.py) and the standby's slot-creation
line (shell/postgres/standby.py): the pure decisions, fed what a server would report."""

from __future__ import annotations

import itertools
import logging
import time

import pytest

from cdc_worker.core.lsn import parse_lsn
from cdc_worker.shell.postgres import standby
from cdc_worker.shell.postgres.reconnect import (
    ServerIdentity,
    backoff_delays,
    slot_problem,
    switch_point,
    unheld_problem,
)
from cdc_worker.shell.postgres.slot import SlotInfo

SLOT = "s1"
USABLE = SlotInfo(SLOT, "app", "pgoutput", None, 100, 90, 0, "reserved")
HISTORY = "1\t0/3000100\tno recovery target specified\n"
OLD = ServerIdentity("7301", 1)
PROMOTED = ServerIdentity("7301", 2)


def test_the_backoff_doubles_up_to_its_cap() -> None:
    assert list(itertools.islice(backoff_delays(0.5, 5.0), 6)) == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0]


def test_a_usable_slot_streams_on_and_each_unusable_one_is_one_line_to_the_runbook() -> None:
    assert slot_problem(SLOT, USABLE, False, "db:5432") is None
    for info, temporary, words in (
        (None, False, "does not exist there"),
        (USABLE, True, "not sync-ready there (synced but temporary"),
        (SlotInfo(SLOT, "app", "pgoutput", None, 100, None, None, "lost"), False, "lost required WAL"),
    ):
        line = slot_problem(SLOT, info, temporary, "db:5432")
        assert line is not None and words in line and "\n" not in line
        assert f"bottledwater rebuild --confirm {SLOT}" in line and "Rebuilding after a lost slot" in line


def test_the_switch_point_is_read_from_the_timeline_history() -> None:
    assert switch_point(HISTORY, 1) == parse_lsn("0/3000100")
    assert switch_point(HISTORY, 2) is None


def test_a_transaction_published_past_the_switch_point_needs_a_person() -> None:
    before_switch, at_switch = parse_lsn("0/3000000"), parse_lsn("0/3000100")
    assert unheld_problem(OLD, PROMOTED, HISTORY, before_switch) is None
    assert unheld_problem(OLD, OLD, None, at_switch) is None, "the same server, restarted"
    line = unheld_problem(OLD, PROMOTED, HISTORY, at_switch)
    assert line is not None and "the topics hold changes the new primary never had" in line
    assert "synchronized_standby_slots" in line and "\n" not in line
    other = unheld_problem(OLD, ServerIdentity("9999", 1), None, 0)
    assert other is not None and "another database cluster" in other


def test_a_slot_creation_that_waits_says_so_once_naming_pg_log_standby_snapshot(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(standby, "WAIT_LINE_AFTER_S", 0.01)
    with caplog.at_level(logging.INFO, logger=standby.__name__), standby.announce_wait(SLOT):
        deadline = time.monotonic() + 10
        while not caplog.records and time.monotonic() < deadline:
            time.sleep(0.01)
    (record,) = caplog.records
    assert "waits for a running-xacts record" in record.getMessage()
    assert "SELECT pg_log_standby_snapshot()" in record.getMessage()
    caplog.clear()
    monkeypatch.setattr(standby, "WAIT_LINE_AFTER_S", 5.0)
    with caplog.at_level(logging.INFO, logger=standby.__name__), standby.announce_wait(SLOT):
        pass  # done before WAIT_LINE_AFTER_S: nothing said
    assert caplog.records == []
    monkeypatch.setattr(standby, "WAIT_LINE_AFTER_S", 0.01)
    primary = standby.announce_wait(SLOT, on_standby=False)
    with caplog.at_level(logging.INFO, logger=standby.__name__), primary:
        deadline = time.monotonic() + 10
        while not caplog.records and time.monotonic() < deadline:
            time.sleep(0.01)
    (record,) = caplog.records
    assert "waits for the transactions running on the server" in record.getMessage()
    assert "standby" not in record.getMessage() and "pg_stat_activity" in record.getMessage()
