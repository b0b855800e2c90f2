"""Spark through dagster-pyspark, with the session built the one way the project builds it."""

from __future__ import annotations

import os
from typing import Any

from dagster_pyspark import LazyPySparkResource
from pydantic import Field

from shared_connections.spark_session import DEFAULT_MASTER, SparkSettings, build_session
from spark_jobs.option_parser import parse_conf
from spark_jobs.options import SPARK_CONF_ENV


class SparkResource(LazyPySparkResource):
    """A lazily started SparkSession (Kafka and Delta on its classpath) built by
    `shared_connections.spark_session`.

    Nothing starts until an op touches `spark_session`, so loading the code location or running a
    job that needs no Spark costs no JVM. The code location fills the fields from its BW_SPARK_*
    variables (orchestration/settings.py); `spark_config` (inherited) and the variable `conf_env`
    names hold extra Spark settings for a real cluster. In one process `getOrCreate` returns the
    session already running, so the tests' shared session is the one every op uses.
    """

    master: str = Field(default=DEFAULT_MASTER, description="Spark master URL (BW_SPARK_MASTER).")
    app_name: str = Field(default="bottledwater-dagster", description="Spark application name.")
    driver_memory: str = Field(default="1g", description="spark.driver.memory (BW_SPARK_DRIVER_MEMORY).")
    shuffle_partitions: int = Field(
        default=2, description="spark.sql.shuffle.partitions (BW_SPARK_SHUFFLE_PARTITIONS)."
    )
    jars: str | None = Field(
        default=None,
        description="Comma-separated jar paths, '' for none; unset: the stack's (BW_SPARK_JARS, "
        ".stack/spark-jars).",
    )
    packages: str = Field(
        default="",
        description="Comma-separated Maven coordinates for spark.jars.packages (BW_SPARK_PACKAGES).",
    )
    spark_config: dict[str, Any] = Field(default_factory=dict, description="Extra Spark settings.")
    conf_env: str | None = Field(
        default=SPARK_CONF_ENV,
        description="Environment variable with more Spark settings (k=v, comma- or newline-separated), "
        "read when a session starts, so that credentials in them never show in the UI; spark_config "
        "wins over them.",
    )

    def env_conf_text(self) -> str:
        """The raw value of `conf_env` in this process's environment ('' when unset)."""
        return os.environ.get(self.conf_env, "") if self.conf_env else ""

    def env_conf(self) -> dict[str, str]:
        try:
            return parse_conf(self.env_conf_text())
        except ValueError as exc:
            # The code location checked the variable at load; this is a run process whose
            # environment differs from the code server's.
            raise ValueError(f"{self.conf_env}: {exc}") from None

    def settings(self) -> SparkSettings:
        return SparkSettings(
            app_name=self.app_name,
            master=self.master,
            shuffle_partitions=self.shuffle_partitions,
            driver_memory=self.driver_memory,
            jars=None if self.jars is None else [j for j in self.jars.split(",") if j],
            packages=[p for p in self.packages.split(",") if p],
            extra_conf={**self.env_conf(), **{k: str(v) for k, v in self.spark_config.items()}},
        )

    def _init_session(self) -> None:
        if self._spark_session is None:
            self._spark_session = build_session(self.settings())
