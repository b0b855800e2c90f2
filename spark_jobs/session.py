"""One way to build a SparkSession with Kafka and Delta, locally or against a real cluster.

Locally the jars come from the stack (`bw-stack install` resolves them from Maven Central into
`.stack/spark-jars`, and `bw-stack env` exports their list as BW_SPARK_JARS). On a cluster that
already has them, pass `jars=[]` and whatever `extra_conf` the cluster needs, or set
`spark.jars.packages` there.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DELTA_EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
DELTA_CATALOG = "org.apache.spark.sql.delta.catalog.DeltaCatalog"
STACK_JARS_DIR = Path(__file__).resolve().parent.parent / ".stack" / "spark-jars"


def stack_jars() -> list[str]:
    """BW_SPARK_JARS (comma-separated) if set, else the jars `bw-stack install` put in .stack/."""
    listed = os.environ.get("BW_SPARK_JARS", "")
    if listed:
        return [j for j in listed.split(",") if j]
    return sorted(str(p) for p in STACK_JARS_DIR.glob("*.jar"))


@dataclass(frozen=True)
class SparkSettings:
    """Defaults sized for a 2-core machine: local[2], few shuffle partitions, a capped heap."""

    app_name: str = "bottledwater"
    master: str = "local[2]"
    shuffle_partitions: int = 2
    driver_memory: str = "1g"
    ui_enabled: bool = False
    jars: Sequence[str] | None = None  # None: the stack's jars
    extra_conf: Mapping[str, str] = field(default_factory=dict)

    def conf(self) -> dict[str, str]:
        jars = stack_jars() if self.jars is None else list(self.jars)
        conf = {
            "spark.sql.extensions": DELTA_EXTENSION,
            "spark.sql.catalog.spark_catalog": DELTA_CATALOG,
            "spark.sql.shuffle.partitions": str(self.shuffle_partitions),
            "spark.default.parallelism": str(self.shuffle_partitions),
            "spark.driver.memory": self.driver_memory,
            "spark.ui.enabled": str(self.ui_enabled).lower(),
            "spark.sql.session.timeZone": "UTC",
            # Delta's MERGE would otherwise cache its source at the default storage level; a
            # micro-batch fits in memory and this avoids disk spills on a small machine.
            "spark.databricks.delta.merge.materializeSource": "auto",
            "spark.sql.adaptive.enabled": "true",
        }
        if jars:
            conf["spark.jars"] = ",".join(jars)
        conf.update(self.extra_conf)
        return conf


def build_session(settings: SparkSettings | None = None) -> SparkSession:
    from pyspark.sql import SparkSession

    settings = settings or SparkSettings()
    builder = SparkSession.builder.appName(settings.app_name).master(settings.master)
    for key, value in settings.conf().items():
        builder = builder.config(key, value)
    return builder.getOrCreate()
