"""What the pages say and where their links go: the state first, what the supervisor is doing, the
worker's own reason, the failed step's own error, and links that are absolute and route to real
places (the UI's job route; the runbook's headings in docs/orchestration.md)."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path

from orchestration.policy.alerts import AlertAction, Severity
from orchestration.policy.links import Runbook, UiLinks, heading_anchor
from orchestration.policy.pages import run_failure_page, slot_page, worker_page
from orchestration.policy.slot_health import LagThresholds, SlotMemory, SlotObservation, assess
from orchestration.policy.supervision import Action, Decision, WorkerBreach

DOCS = Path(__file__).resolve().parents[2] / "docs" / "orchestration.md"
LINKS = UiLinks("http://127.0.0.1:3123", "https://forge.example/bw/blob/main/docs/orchestration.md")
THRESHOLDS = LagThresholds(max_retained_wal_bytes=1 << 30, max_lag_seconds=60, inactive_grace_seconds=600)
MIB = 1024**2
NOW = 1000.0
WHEN = datetime(2025, 1, 1, tzinfo=UTC)


def test_job_links_live_under_the_code_location_and_runbook_links_carry_an_anchor() -> None:
    assert LINKS.job("cdc_worker") == (
        "http://127.0.0.1:3123/locations/__repository__@orchestration.definitions/jobs/cdc_worker"
    )
    assert LINKS.run("abc") == "http://127.0.0.1:3123/runs/abc"
    assert LINKS.asset("replication_slot") == "http://127.0.0.1:3123/assets/replication_slot"
    assert LINKS.runbook(Runbook.REBUILD).endswith("docs/orchestration.md#rebuilding-after-a-lost-slot")


def test_every_runbook_anchor_is_a_heading_of_the_orchestration_page() -> None:
    headings = {heading_anchor(h) for h in re.findall(r"^#+ (.+)$", DOCS.read_text(), re.MULTILINE)}
    for section in Runbook:
        assert heading_anchor(section.value) in headings, section


def test_the_lag_page_leads_with_the_missing_worker_and_says_what_the_supervisor_does() -> None:
    memory = SlotMemory(inactive_since=NOW - 65, seen=True, worker_seen=True)
    observation = SlotObservation("bw", "db", False, "reserved", 100, 100, 100 + 3 * MIB, 3 * MIB, NOW)
    health = assess(observation, memory, THRESHOLDS, NOW)
    waiting = Decision(Action.WAIT, "run r9 crashed (1 in a row); relaunch in 12 s", 1, NOW + 12, "r9")
    page = slot_page(
        AlertAction.TRIGGER, slot="bw", location="h:5432/db", observation=observation, health=health,
        thresholds=THRESHOLDS, supervisor=waiting, links=LINKS, now=NOW, timestamp=WHEN,
    )  # fmt: skip
    assert page.summary.startswith("replication slot bw on h:5432/db: no worker connected for 1 min 5 s")
    assert (
        page.details["supervisor"]
        == "backing off before the next relaunch (run r9 crashed (1 in a row); relaunch in 12 s)"
    )
    assert page.details["behind"] == "3.0 MiB"
    hrefs = {link.text: link.href for link in page.links}
    assert hrefs["The worker's last run"] == "http://127.0.0.1:3123/runs/r9"
    assert hrefs["Runbook"].endswith("#runbook-a-lagging-or-lost-slot")
    assert all(href.startswith(("http://", "https://")) for href in hrefs.values())


def test_a_lost_slot_page_says_how_far_behind_and_links_the_rebuild() -> None:
    observation = SlotObservation("bw", "db", False, "lost", 10 * MIB, None, 53 * MIB, None, NOW)
    health = assess(observation, SlotMemory(seen=True), THRESHOLDS, NOW)
    page = slot_page(
        AlertAction.TRIGGER, slot="bw", location="h:5432/db", observation=observation, health=health,
        thresholds=THRESHOLDS, supervisor=None, links=LINKS, now=NOW, timestamp=WHEN,
    )  # fmt: skip
    assert page.severity is Severity.CRITICAL
    assert "43.0 MiB behind the current WAL position" in page.summary
    assert page.details["retained_wal"] == "unknown" and page.details["behind_bytes"] == 43 * MIB
    assert "bottledwater rebuild" in str(page.details["what_to_do"])
    assert str(page.details["runbook"]).endswith("#rebuilding-after-a-lost-slot")


def test_the_needs_a_person_page_carries_the_workers_reason_and_last_lines() -> None:
    reason = "run r2 exited 2 (needs a person): slot bw has lost required WAL; fix that, then launch"
    decision = Decision(Action.NEEDS_PERSON, reason, run_id="r2")
    page = worker_page(
        AlertAction.TRIGGER, slot="bw", location="h:5432/db", decision=decision,
        breaches=[WorkerBreach.NEEDS_PERSON], last_lines="line 1\nline 2", links=LINKS, timestamp=WHEN,
    )  # fmt: skip
    assert "needs a person" in page.summary and "lost required WAL" in page.summary
    assert page.details["last_lines"] == "line 1\nline 2"
    assert str(page.details["runbook"]).endswith("#the-worker-stopped-and-needs-a-person")
    assert {link.text for link in page.links} >= {"The worker's last run", "Runbook", "cdc_worker runs"}


def test_the_crash_loop_resolve_is_informational() -> None:
    decision = Decision(Action.HEALTHY, "worker run r5 is in progress", run_id="r5")
    page = worker_page(
        AlertAction.RESOLVE, slot="bw", location="h:5432/db", decision=decision,
        breaches=[WorkerBreach.CRASH_LOOP], last_lines="", links=LINKS, timestamp=WHEN,
    )  # fmt: skip
    assert page.severity is Severity.INFO and page.summary.endswith("is running again")


def test_the_run_failure_page_says_the_steps_own_error() -> None:
    step_error = "refusing to drop slot 'bw' while worker run r1 is in progress: stop the supervisor"
    page = run_failure_page(
        job_name="drop_slot", run_id="r7", step_errors=[step_error],
        run_message='Execution of run for "drop_slot" failed. Steps failed: [\'drop_replication_slot\'].',
        links=LINKS, timestamp=WHEN,
    )  # fmt: skip
    assert page.summary == f"Dagster run of drop_slot failed: {step_error}"
    assert page.links[0].href == "http://127.0.0.1:3123/runs/r7"
