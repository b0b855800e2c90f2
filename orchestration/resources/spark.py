"""Spark through dagster-pyspark, with the session built the one way the project builds it."""

from __future__ import annotations

from typing import Any

from dagster_pyspark import LazyPySparkResource
from pydantic import Field

from spark_jobs.connections.session import SparkSettings, build_session


class SparkResource(LazyPySparkResource):
    """A lazily started SparkSession (Kafka and Delta on its classpath) via `spark_jobs.connections.session`.

    Nothing starts until an op touches `spark_session`, so loading the code location or running a
    job that needs no Spark costs no JVM. `spark_config` (inherited) holds extra Spark settings for a
    real cluster. In one process `getOrCreate` returns the session already running, so the tests'
    shared session is the one every op uses.
    """

    master: str = Field(default="local[2]", description="Spark master URL.")
    app_name: str = Field(default="bottledwater-dagster", description="Spark application name.")
    driver_memory: str = Field(default="1g", description="spark.driver.memory.")
    shuffle_partitions: int = Field(default=2, description="spark.sql.shuffle.partitions.")
    jars: str | None = Field(
        default=None,
        description="Comma-separated jar paths; unset: the stack's (BW_SPARK_JARS, .stack/spark-jars).",
    )
    spark_config: dict[str, Any] = Field(default_factory=dict, description="Extra Spark settings.")

    def settings(self) -> SparkSettings:
        return SparkSettings(
            app_name=self.app_name,
            master=self.master,
            shuffle_partitions=self.shuffle_partitions,
            driver_memory=self.driver_memory,
            jars=None if self.jars is None else [j for j in self.jars.split(",") if j],
            extra_conf={k: str(v) for k, v in self.spark_config.items()},
        )

    def _init_session(self) -> None:
        if self._spark_session is None:
            self._spark_session = build_session(self.settings())
