"""Fixtures of the unit tier. `spark` is a local session (in-process JVM, no service) shared by the
whole run, for tests that feed DataFrames straight to the merge's steps."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Marked, so the unit run with the worker's codec turned off can leave them out: the merge's
    # Spark steps never load the codec, and they are the tier's slowest tests.
    for item in items:
        if "spark" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.spark)


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    from shared_connections.spark_session import SparkSettings, build_session

    session = build_session(SparkSettings(app_name="bottledwater-unit-tests", master="local[1]"))
    yield session
    session.stop()
