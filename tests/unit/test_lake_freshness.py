"""The lake's common watermark from Delta logs, without Spark (orchestration.lake_freshness), and the
slot page that names it beside the slot's lag. The Delta side of the same reading is checked against
`mirror_versions.lake_watermark` on real tables in tests/integration/test_orchestration_pipeline.py."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

from orchestration import lake_freshness
from orchestration.policy.alerts import AlertAction
from orchestration.policy.lake_watermark import LakeWatermark
from orchestration.policy.links import UiLinks
from orchestration.policy.pages import slot_page
from orchestration.policy.slot_health import LagThresholds, SlotMemory, SlotObservation, assess
from spark_jobs.rules import layout
from spark_jobs.rules.changelog_commit import ChangelogCommit
from spark_jobs.rules.watermark import IdleMark, Mark, idle_metadata

MIB = 1024**2
NOW = 10_000.0


def _commit(log: Path, version: int, mark: Mark | None, operation: str = "MERGE") -> None:
    info: dict[str, object] = {"timestamp": 1, "operation": operation}
    if mark is not None:
        info["userMetadata"] = mark.metadata()
    lines = [{"commitInfo": info}, {"add": {"path": f"part-{version}.parquet"}}]
    (log / f"{version:020d}.json").write_text("\n".join(json.dumps(line) for line in lines) + "\n")


def _table(root: Path, name: str, marks: list[Mark | None]) -> str:
    log = root / name / "_delta_log"
    log.mkdir(parents=True)
    for version, mark in enumerate(marks):
        _commit(log, version, mark)
    (log / "00000000000000000000.crc").write_text("{}")  # not a commit: ignored
    return str(root / name)


def test_the_common_watermark_is_the_newest_position_every_table_serves(tmp_path: Path) -> None:
    a = _table(tmp_path, "a", [Mark(100, 99, 1_000_000), None, Mark(300, 250, 3_000_000)])
    # b is exact at 200 (applied 150 <= 200 <= 200) and at 300 only if applied <= 300: it is.
    b = _table(tmp_path, "b", [Mark(200, 150, 2_000_000), Mark(400, 290, 4_000_000)])
    lake = lake_freshness.observe({"public.a": a, "public.b": b, "public.later": str(tmp_path / "nope")})
    assert lake == LakeWatermark(300, 3.0)
    assert lake.lag_s(NOW) == NOW - 3.0


def test_an_idle_table_is_carried_by_the_warehouses_idle_marks(tmp_path: Path) -> None:
    warehouse = tmp_path / "wh"
    busy = _table(warehouse / "public", "busy", [Mark(100, 99, 1_000_000), Mark(480, 470, 4_000_000)])
    quiet = _table(warehouse / "public", "quiet", [Mark(100, 10, 1_000_000)])
    # Without the idle marks the quiet table holds the lake back at 100.
    assert lake_freshness.observe({"busy": busy, "quiet": quiet}) == LakeWatermark(100, 1.0)
    log = Path(layout.idle_marks_path(str(warehouse))) / "_delta_log"
    log.mkdir(parents=True)
    for version, w in enumerate((300, 500)):
        info = {
            "timestamp": 1,
            "userMetadata": idle_metadata([IdleMark("public/quiet", 0, None, Mark(w, 10, 5_000_000))]),
        }
        (log / f"{version:020d}.json").write_text(json.dumps({"commitInfo": info}) + "\n")
    assert lake_freshness.observe({"busy": busy, "quiet": quiet}) == LakeWatermark(480, 4.0)


def test_a_later_proof_of_the_same_positions_in_a_proof_file_makes_the_lake_fresh(tmp_path: Path) -> None:
    """An idle source: the merge wrote the worker's later proof of positions every table already
    held to its proof file (no commit); the lake's position stays, its proof time moves on. A half
    written (hidden) file and a checksum file are not read."""
    warehouse = tmp_path / "wh"
    a = _table(warehouse / "public", "a", [Mark(100, 99, 1_000_000), Mark(300, 250, 3_000_000)])
    b = _table(warehouse / "public", "b", [Mark(300, 10, 3_000_000)])
    assert lake_freshness.observe({"a": a, "b": b}) == LakeWatermark(300, 3.0)
    proofs = Path(layout.proofs_path(str(warehouse)))
    proofs.mkdir(parents=True)
    later = [
        IdleMark("public/a", 1, None, Mark(300, 250, 9_000_000)),
        IdleMark("public/b", 0, None, Mark(300, 10, 9_000_000)),
    ]
    (proofs / layout.proof_file_name("q1", 7)).write_text(idle_metadata(later))
    (proofs / f".{layout.proof_file_name('q1', 8)}.tmp").write_text('{"bottledwater": {"idle": [')
    (proofs / f".{layout.proof_file_name('q1', 7)}.crc").write_bytes(b"\x00")
    assert lake_freshness.observe({"a": a, "b": b}) == LakeWatermark(300, 9.0)


def test_a_table_whose_changes_run_past_every_proven_position_leaves_no_common_watermark(
    tmp_path: Path,
) -> None:
    a = _table(tmp_path, "a", [Mark(100, 99, 1_000_000)])
    b = _table(tmp_path, "b", [Mark(90, 150, 2_000_000)])  # applied past 100, proven only to 90
    assert lake_freshness.observe({"a": a, "b": b}) is None
    assert lake_freshness.observe({"a": a, "remote": "s3a://lake/b"}) == LakeWatermark(100, 1.0)


def test_the_slot_page_names_the_lakes_lag_beside_the_slots() -> None:
    thresholds = LagThresholds(max_retained_wal_bytes=MIB, max_lag_seconds=60, inactive_grace_seconds=600)
    observation = SlotObservation("bw", "db", True, "reserved", 100, 100, 100 + 3 * MIB, 3 * MIB, NOW)
    health = assess(observation, SlotMemory(seen=True, worker_seen=True), thresholds, NOW)

    def page(lake: LakeWatermark | None, changelog: LakeWatermark | None = None) -> dict[str, object]:
        alert = slot_page(
            AlertAction.TRIGGER, slot="bw", location="h:5432/db", observation=observation, health=health,
            thresholds=thresholds, supervisor=None, links=UiLinks("http://x"), now=NOW,
            timestamp=datetime(2025, 1, 1, tzinfo=UTC), lake=lake, changelog=changelog,
        )  # fmt: skip
        return {"summary": alert.summary, **alert.details}

    named = page(LakeWatermark(100 + MIB, NOW - 75))
    assert "the lake is complete up to 1 min 15 s ago" in str(named["summary"])
    assert named["lake_watermark"] == "0/100064"
    assert named["lake_behind_bytes"] == 2 * MIB and named["lake_behind"] == "2.0 MiB"
    assert named["lake_lag_seconds"] == 75.0
    unknown = page(None)
    assert "lake" not in str(unknown["summary"])
    assert str(unknown["lake_watermark"]).startswith("unknown")

    # A warehouse that keeps the changelog: its position first (what reads through it serve), then
    # the mirrors'.
    both = page(LakeWatermark(100 + MIB, NOW - 75), LakeWatermark(100 + 3 * MIB, NOW - 4))
    assert (
        "the lake's changelog is complete up to 4 s ago; its mirrors are complete up to 1 min 15 s ago"
        in str(both["summary"])
    )
    assert both["changelog_watermark"] == "0/300064" and both["changelog_behind_bytes"] == 0
    assert both["changelog_lag_seconds"] == 4.0 and both["lake_lag_seconds"] == 75.0


def test_the_changelogs_position_is_its_newest_commits_proven_watermark(tmp_path: Path) -> None:
    path = tmp_path / "wh" / "_bw_state" / "changelog"
    assert lake_freshness.observe_changelog(str(path)) is None  # no changelog yet
    log = path / "_delta_log"
    log.mkdir(parents=True)
    commits = [
        ChangelogCommit("q", 0, {("t", 0): 5}),  # nothing proven yet
        ChangelogCommit("q", 1, {("t", 0): 9}, 700, 7_000_000),
        None,  # an OPTIMIZE: no changelog metadata
    ]
    for version, commit in enumerate(commits):
        info: dict[str, object] = {"timestamp": 1, "operation": "WRITE" if commit else "OPTIMIZE"}
        if commit is not None:
            info["userMetadata"] = commit.metadata()
        (log / f"{version:020d}.json").write_text(json.dumps({"commitInfo": info}) + "\n")
        if version == 0:
            assert lake_freshness.observe_changelog(str(path)) is None
    assert lake_freshness.observe_changelog(str(path)) == LakeWatermark(700, 7.0)
    assert lake_freshness.observe_changelog("s3a://lake/_bw_state/changelog") is None
