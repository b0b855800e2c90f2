"""`bottledwater slot status`: human units, lag, safe WAL size, the last acknowledgement, a lost slot,
and a slot of another database said as such."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from cdc_worker.shell.postgres.failover import StandbySlot
from cdc_worker.shell.postgres.slot_status import PublicationSummary, SlotStatus, render

NOW = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)
MIB = 1024**2


def status(**changes: object) -> SlotStatus:
    base = SlotStatus(
        name="bw", database="bwdemo", connected_database="bwdemo", plugin="pgoutput", active_pid=4242,
        wal_status="reserved", safe_wal_bytes=None, current_wal_lsn=0x5000000,
        confirmed_flush_lsn=0x5000000 - 50_000, restart_lsn=0x5000000 - 50_000, retained_bytes=50_000,
        flush_lag_s=0.25, last_reply_at=NOW - timedelta(seconds=3), snapshot="done",
        publications=(PublicationSummary("bw", "insert, update, delete, truncate", ("public.a", "s.b")),),
    )  # fmt: skip
    return SlotStatus(**{**base.__dict__, **changes})  # type: ignore[arg-type]


def test_a_streaming_slot_shows_lag_retained_wal_in_human_units_and_the_last_acknowledgement() -> None:
    text = "\n".join(render(status(), NOW))
    assert "active (server process 4242)" in text
    assert "current WAL LSN 0/5000000" in text
    assert "behind the current WAL position 48.8 KiB; WAL retained 48.8 KiB" in text  # 50 KB is not 0.0 MB
    assert "safe WAL size unlimited (max_slot_wal_keep_size = -1)" in text
    assert "flush lag 0.2 s; last acknowledgement 2025-01-01T11:59:57+00:00 (3 s ago)" in text
    assert "publication bw (insert, update, delete, truncate): 2 table(s): public.a, s.b" in text


def test_a_lost_slot_says_how_far_behind_and_how_to_rebuild() -> None:
    lost = status(
        active_pid=None, wal_status="lost", restart_lsn=None, retained_bytes=None,
        confirmed_flush_lsn=0x5000000 - 43 * MIB, safe_wal_bytes=None, flush_lag_s=None, last_reply_at=None,
    )  # fmt: skip
    text = "\n".join(render(lost, NOW))
    assert "inactive (no worker connected)" in text
    assert "behind the current WAL position 43.0 MiB; WAL retained unknown (the slot lost its WAL)" in text
    assert "bottledwater rebuild --confirm bw" in text
    assert "0 B" not in text


def test_a_slot_of_another_database_is_said_to_be_so() -> None:
    elsewhere = status(connected_database="postgres", snapshot=None, publications=())
    text = "\n".join(render(elsewhere, NOW))
    assert "connected to database postgres, but the slot belongs to database bwdemo" in text
    assert "snapshot not recorded" not in text


def test_the_safe_wal_size_is_shown_when_max_slot_wal_keep_size_is_set() -> None:
    assert "safe WAL size 1.0 GiB" in "\n".join(render(status(safe_wal_bytes=1024**3), NOW))


def test_before_17_nothing_is_said_of_failover() -> None:
    assert not any("failover" in line for line in render(status(failover=None), NOW))


def test_a_slot_that_is_not_a_failover_slot_says_a_promotion_loses_it() -> None:
    assert "failover slot: no (a promoted standby will not have it" in "\n".join(
        render(status(failover=False), NOW)
    )


def test_a_failover_slot_says_whether_it_is_sync_ready_on_the_standby() -> None:
    def said(on_standby: StandbySlot | None) -> str:
        return "\n".join(render(status(failover=True, on_standby=on_standby), NOW))

    assert "sync-ready on a standby: unknown (pass --standby DSN" in said(None)
    assert "sync-ready on the standby (a promotion keeps it)" in said(StandbySlot(True, True, False))
    assert "NOT sync-ready on the standby (synced but temporary): a promotion now would drop it" in said(
        StandbySlot(True, True, True)
    )
    assert "MISSING on the standby: check sync_replication_slots" in said(StandbySlot(False, False, False))
