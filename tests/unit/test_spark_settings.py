"""The session's defaults that change what a plan costs to build."""

from __future__ import annotations

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from shared_connections.spark_session import SparkSettings

DEBUGGING = "spark.python.sql.dataFrameDebugging.enabled"


def test_plans_are_built_without_recording_each_calls_python_call_site(spark: SparkSession) -> None:
    from pyspark.errors.utils import is_debugging_enabled

    # Any Column function: with debugging on, each records its call site through the JVM.
    assert spark.range(1).select((F.col("id") + F.lit(1)).alias("n")).head()["n"] == 1
    assert spark.conf.get(DEBUGGING) == "false"
    assert not is_debugging_enabled()


def test_a_user_can_turn_call_sites_back_on() -> None:
    assert SparkSettings().conf()[DEBUGGING] == "false"
    assert SparkSettings(extra_conf={DEBUGGING: "true"}).conf()[DEBUGGING] == "true"
