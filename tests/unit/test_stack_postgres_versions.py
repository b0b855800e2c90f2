"""The stack's other Postgres majors: which majors it knows, and each server's name, port and
directories (pure: nothing is started)."""

from __future__ import annotations

from pathlib import Path

import pytest

from stack.config import StackConfig
from stack.errors import StackError
from stack.postgres_versions import MAJORS, Cluster, known_major


def config(tmp_path: Path) -> StackConfig:
    return StackConfig(tmp_path, 55432, 9092, 9093, 8081, 9000, 3000)


def test_the_majors_beside_the_stacks_15_and_their_pinned_wheels() -> None:
    assert sorted(MAJORS) == [14, 16, 17, 18]
    assert all(len(m.wheel_sha256) == 64 and m.release.startswith(f"{m.major}.") for m in MAJORS.values())


@pytest.mark.parametrize("text", ["15", "13", "x"])
def test_an_unknown_major_is_refused_naming_the_choices(text: str) -> None:
    with pytest.raises(StackError, match="choose one of 14, 16, 17, 18"):
        known_major(text)


def test_ports_stay_below_the_ephemeral_range_and_apart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("BW_STACK_PG17_PORT", raising=False)
    cfg = config(tmp_path)
    servers = [
        Cluster(cfg, m, standby=s, drill=d) for m in MAJORS for s in (False, True) for d in (False, True)
    ]
    ports = [c.port for c in servers]
    assert len(set(ports)) == len(ports) and max(ports) < 32768
    assert (Cluster(cfg, 17).port, Cluster(cfg, 17, standby=True).port) == (26417, 26517)
    assert Cluster(cfg, 17, standby=True, drill=True).name == "postgres17-drill-standby"
    assert Cluster(cfg, 17, standby=True, drill=True).primary().name == "postgres17-drill"
