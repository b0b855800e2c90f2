"""The integration tier's lanes (tests/lanes.py): what a session sets up once stays in one lane."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests import lanes

INTEGRATION = Path(__file__).parents[1] / "integration"


def _files_using(pattern: str) -> set[str]:
    return {p.name for p in INTEGRATION.glob("test_*.py") if re.search(pattern, p.read_text())}


def test_every_file_on_the_secured_cluster_is_in_the_lake_lane() -> None:
    # Each lane's session would start the cluster, and stop it at its end under the other's tests.
    secured = _files_using(r"secured_kafka|SecuredKafka")
    assert secured, "no test file uses the secured cluster: the pattern is stale"
    assert secured <= set(lanes.LAKE_FILES), secured - set(lanes.LAKE_FILES)


def test_every_file_on_the_postgres_versions_clusters_is_in_the_stream_lane() -> None:
    # The failover drill promotes one of them, the TLS tests reconfigure another.
    versions = _files_using(r"stack\.postgres_versions")
    assert len(versions) >= 3, versions
    assert not versions & set(lanes.LAKE_FILES), versions & set(lanes.LAKE_FILES)


def test_each_file_runs_in_one_lane_and_exclusive_tests_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(Path(__file__).parents[2])
    together, alone = lanes.lanes()
    lake, stream = together
    assert [lane.name for lane in together] == ["lake", "stream"]
    ignored = {arg.removeprefix("--ignore=") for arg in stream.selection if arg.startswith("--ignore=")}
    assert ignored == {a for a in lake.selection if a.endswith(".py")}
    for lane in together:
        assert lane.selection[-2:] == ("-m", "not exclusive")
    assert alone.selection[-2:] == ("-m", "exclusive")


def test_a_lake_file_that_does_not_exist_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(Path(__file__).parents[2])
    monkeypatch.setattr(lanes, "LAKE_FILES", (*lanes.LAKE_FILES, "test_gone.py"))
    with pytest.raises(SystemExit, match="test_gone.py"):
        lanes.lanes()
