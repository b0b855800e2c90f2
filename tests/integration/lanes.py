"""The integration tier's two lanes under pytest-xdist (`make integration`, `-n 2`).

The worker's side of the tier mostly waits, one Python process at a time (on Kafka's timeouts, a
promotion, a private cluster's start): alone it keeps the two cores about 60 % busy, the lake's
Spark tests about 80 % (tests/README.md has the figures). The lake's tests (a worker, a merge,
Delta) are one lane; everything else (the worker, Kafka, Postgres, the Spark snapshot and cluster,
Dagster) is the other. A lane is one work unit of xdist's scope scheduling: one process runs it
whole, in file order, so the session-wide resources a lane's tests share (the secured Kafka
cluster, the private Postgres clusters on fixed ports, a SparkSession) are never started twice at
once.
"""

from __future__ import annotations

from xdist.scheduler import LoadScopeScheduling

LAKE_LANE = ("test_lakehouse_", "test_faults_merge_kill")


def lane_of(nodeid: str) -> str:
    """`lake` or `rest`, by the test's file name."""
    module = nodeid.split("::", 1)[0].rsplit("/", 1)[-1]
    return "lake" if module.startswith(LAKE_LANE) else "rest"


class LaneScheduling(LoadScopeScheduling):  # type: ignore[misc]  # xdist ships no type hints
    """xdist's scope scheduling with a lane as the scope."""

    def _split_scope(self, nodeid: str) -> str:
        return lane_of(nodeid)
