"""The continuous merge's commit report: what it emits and when (the event log's throttle), and how
Dagster's op reads it into materializations (no Spark, no Dagster instance)."""

from __future__ import annotations

from pathlib import Path

import dagster as dg

from orchestration.changelog_asset import CHANGELOG_ASSET
from orchestration.continuous_merge import materializations, reported_keys
from spark_jobs.merging.commit_report import COMMITTED_WINDOW_S, IDLE_WINDOW_S, PREFIX, CommitReport, parse
from spark_jobs.merging.merge_batch import BatchResult
from spark_jobs.merging.merge_query import BatchCommitted
from spark_jobs.rules.changelog_commit import ChangelogCommit
from spark_jobs.rules.watermark import Mark

T0 = 1_700_000_000.0
ORDERS, ITEMS = "bw.public.orders", "bw.public.items"
ORDERS_KEY = dg.AssetKey(["delta", "public", "orders"])


def result(batch: int, changes: int) -> BatchResult:
    return BatchResult(batch, messages=changes, changes=changes, truncated_before=None, added_columns=[])


def head(batch: int, watermark: int) -> ChangelogCommit:
    return ChangelogCommit("q", batch, {}, watermark, int((T0 - 2) * 1e6))


def mark(watermark: int) -> Mark:
    return Mark(watermark, watermark, int((T0 - 1) * 1e6))


def report(tmp_path: Path) -> tuple[CommitReport, list[str]]:
    lines: list[str] = []
    return CommitReport(str(tmp_path), "bw", emit=lines.append), lines


def test_a_batch_reports_the_changelog_its_merged_mirror_and_an_idle_mirror_once(tmp_path: Path) -> None:
    # A local changelog with two commits: its version is read from the log's listing.
    log = tmp_path / "_bw_state" / "changelog" / "_delta_log"
    log.mkdir(parents=True)
    for version in (0, 1):
        (log / f"{version:020d}.json").write_text("{}")
    commits, lines = report(tmp_path)
    batch = BatchCommitted(7, {}, {ORDERS: result(7, 5)})
    commits.batch(batch, head(7, 300), {ORDERS: mark(300), ITEMS: mark(200)}, T0)
    assert commits.flush(T0) == 3
    [line] = lines
    entries = parse(f"2025-01-01 INFO spark_jobs.merging.commit_report: {line}")
    assert entries is not None
    by_asset = {tuple(e["asset"]): e for e in entries}
    assert by_asset[("changelog",)] == {
        "asset": ["changelog"], "batch": 7, "watermark": 300, "proven_at_us": int((T0 - 2) * 1e6),
        "lag_s": 2.0, "changes": 0, "commits": 1, "version": 1,
    }  # fmt: skip
    assert by_asset[("public", "orders")]["changes"] == 5
    assert by_asset[("public", "orders")]["commits"] == 1
    # Its position moved with nothing of its own: reported, with no commit.
    assert by_asset[("public", "items")]["changes"] == 0
    assert by_asset[("public", "items")]["commits"] == 0
    assert "version" not in by_asset[("public", "items")]  # no log there


def test_commits_within_a_window_are_one_report_with_the_newest_state_and_the_changes_summed(
    tmp_path: Path,
) -> None:
    commits, lines = report(tmp_path)
    commits.batch(BatchCommitted(1, {}, {ORDERS: result(1, 2)}), None, {ORDERS: mark(10)}, T0)
    commits.flush(T0)
    # Three more commits (a batch, then two behind the changelog) inside the window: held back.
    commits.batch(BatchCommitted(2, {}, {ORDERS: result(2, 3)}), None, {ORDERS: mark(20)}, T0 + 10)
    commits.mirror(ORDERS, result(3, 4), mark(30), T0 + 12)
    commits.mirror(ORDERS, result(4, 1), mark(40), T0 + 14)
    assert commits.flush(T0 + 15) == 0
    assert commits.flush(T0 + COMMITTED_WINDOW_S) == 1
    [entry] = parse(lines[-1]) or []
    assert (entry["batch"], entry["watermark"], entry["changes"], entry["commits"]) == (4, 40, 8, 3)
    assert commits.flush(T0 + 2 * COMMITTED_WINDOW_S) == 0  # nothing new: nothing reported


def test_an_idle_mirror_is_reported_less_often_and_a_stop_reports_what_was_held(tmp_path: Path) -> None:
    commits, lines = report(tmp_path)
    commits.batch(BatchCommitted(1, {}, {}), None, {ITEMS: mark(10)}, T0)
    commits.flush(T0)
    commits.batch(BatchCommitted(2, {}, {}), None, {ITEMS: mark(20)}, T0 + 10)
    # The same position again is no move at all.
    commits.batch(BatchCommitted(3, {}, {}), None, {ITEMS: mark(20)}, T0 + 20)
    assert commits.flush(T0 + COMMITTED_WINDOW_S) == 0
    assert commits.flush(T0 + IDLE_WINDOW_S) == 1
    commits.batch(BatchCommitted(4, {}, {}), None, {ITEMS: mark(30)}, T0 + IDLE_WINDOW_S + 1)
    assert commits.flush(T0 + IDLE_WINDOW_S + 2, force=True) == 1
    assert [e["watermark"] for line in lines for e in parse(line) or []] == [10, 20, 30]


def test_a_batch_that_wrote_no_changelog_commit_does_not_report_the_changelog(tmp_path: Path) -> None:
    commits, lines = report(tmp_path)
    commits.batch(BatchCommitted(5, {}, {}), head(4, 300), {}, T0)
    assert commits.flush(T0) == 0 and not lines


def test_other_lines_are_no_report() -> None:
    assert parse("INFO spark_jobs.merge: continuous merge of ['t'] every 10.0 s") is None
    assert parse(f"{PREFIX}not json") is None


def test_the_op_reports_materializations_of_the_assets_it_defines_with_their_metadata() -> None:
    known = reported_keys([ORDERS], "bw", changelog=True)
    assert known == {ORDERS_KEY, CHANGELOG_ASSET}
    entries = [
        {"asset": ["changelog"], "batch": 7, "watermark": 0x16B3748, "proven_at_us": 1, "lag_s": 2.0,
         "changes": 0, "commits": 1, "version": 12},
        {"asset": ["public", "orders"], "batch": 7, "watermark": 0x16B3748, "lag_s": 1.0, "changes": 5,
         "commits": 1},
        # A table that joined by the topic pattern: no asset of this location.
        {"asset": ["public", "later"], "batch": 7, "changes": 1, "commits": 1},
    ]  # fmt: skip
    changelog, orders = materializations(entries, known)
    assert changelog.asset_key == CHANGELOG_ASSET
    assert changelog.metadata["version"] == dg.MetadataValue.int(12)
    assert changelog.metadata["position"] == dg.MetadataValue.text("0/16B3748")
    assert changelog.metadata["lag_s"] == dg.MetadataValue.float(2.0)
    assert "changes_merged" not in changelog.metadata
    assert orders.asset_key == ORDERS_KEY
    assert orders.metadata["changes_merged"] == dg.MetadataValue.int(5)
    assert orders.metadata["merged_by"] == dg.MetadataValue.text("continuous_merge")
