"""The demo points alert links at its own UI port, merges continuously behind the lake's changelog
unless told otherwise, and tells the merge cadence it really runs."""

from __future__ import annotations

import pytest

from orchestration.settings import MergeMode, load_settings
from stack.config import StackConfig
from stack.demo import banner, merge_cadence, pipeline_env


@pytest.fixture
def cfg(monkeypatch: pytest.MonkeyPatch, tmp_path: object) -> StackConfig:
    monkeypatch.setenv("BW_STACK_HOME", str(tmp_path))
    monkeypatch.setenv("BW_STACK_DAGSTER_PORT", "3456")
    for variable in (
        "BW_DAGSTER_URL",
        "BW_MERGE_CRON",
        "BW_MERGE_MODE",
        "BW_CHANGELOG",
        "BW_MIRROR_BUDGET_SECONDS",
    ):
        monkeypatch.delenv(variable, raising=False)
    return StackConfig.from_env()


def test_links_in_alerts_open_the_demos_ui_on_its_port(cfg: StackConfig) -> None:
    env = pipeline_env(cfg)
    assert env["BW_DAGSTER_URL"] == "http://127.0.0.1:3456"
    assert load_settings(env).dagster_url == "http://127.0.0.1:3456"


def test_the_demo_merges_continuously_behind_the_changelog(cfg: StackConfig) -> None:
    settings = load_settings(pipeline_env(cfg))
    assert settings.merge_mode is MergeMode.CONTINUOUS
    assert settings.changelog and settings.mirror_budget_s == 5.0
    text = banner(cfg, "postgresql://x/bwdemo", pipeline_env(cfg))
    assert "Dagster UI   http://127.0.0.1:3456" in text
    assert "merged continuously (BW_MERGE_MODE=continuous: a micro-batch every 10 s, the lake's" in text
    assert "spark_jobs.consistent_read" in text
    # Both exit 0 on the live demo (tests/integration/test_lakehouse_verify.py): verify settles the
    # keys in flight instead of reporting them.
    assert "-m spark_jobs.verify --warehouse" in text and "settle" in text


def test_the_banner_tells_the_merge_cadence_in_effect(
    cfg: StackConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BW_MERGE_MODE", "scheduled")
    monkeypatch.setenv("BW_CHANGELOG", "off")
    env = pipeline_env(cfg)
    assert "BW_MIRROR_BUDGET_SECONDS" not in env  # refused without the changelog
    assert "merged every 2 minutes (BW_MERGE_CRON" in banner(cfg, "postgresql://x/bwdemo", env)
    monkeypatch.setenv("BW_MERGE_CRON", "0 * * * *")
    assert "merged on the cron schedule '0 * * * *'" in banner(
        cfg, "postgresql://x/bwdemo", pipeline_env(cfg)
    )


def test_merge_cadence_reads_the_cron() -> None:
    assert merge_cadence("*/5 * * * *").startswith("merged every 5 minutes")
    assert merge_cadence("*  *  * * *").startswith("merged every minute")
    assert merge_cadence("*/1 * * * *").startswith("merged every minute")
