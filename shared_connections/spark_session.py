"""One way to build a SparkSession with Kafka and Delta, locally or against a real cluster.

Locally the jars come from the stack (`bw-stack install` resolves them from Maven Central into
`.stack/spark-jars`, and `bw-stack env` exports their list as BW_SPARK_JARS). On a cluster that
already has them, pass `jars=[]` (`BW_SPARK_JARS=none`) and whatever `extra_conf` the cluster
needs, or set `packages` (`spark.jars.packages`) to have Spark resolve them.

Under `spark-submit` the JVM already runs with the master, jars and conf that spark-submit was
given; `build_session` then only adds what the jobs need (Delta's extensions) and never overrides
the master or the classpath unless asked to explicitly.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from shared_connections import jvm_names

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DELTA_EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
DELTA_CATALOG = "org.apache.spark.sql.delta.catalog.DeltaCatalog"
# shared_connections/spark_session.py: the project root is two levels up.
STACK_JARS_DIR = Path(__file__).resolve().parents[1] / ".stack" / "spark-jars"
DEFAULT_MASTER = "local[2]"
# spark-submit starts the JVM first and hands the Python driver its gateway through these.
SPARK_SUBMIT_GATEWAY_ENV = "PYSPARK_GATEWAY_PORT"


SPARK_JARS_ENV = "BW_SPARK_JARS"
# SPARK_JARS_ENV's value for a cluster that has Kafka and Delta already (or gets them by packages).
NO_JARS = "none"


def stack_jars() -> list[str]:
    """BW_SPARK_JARS (comma-separated; `none`: no jars) if set, else the jars `bw-stack install` put
    in .stack/."""
    listed = os.environ.get(SPARK_JARS_ENV, "").strip()
    if listed.lower() == NO_JARS:
        return []
    if listed:
        return [j.strip() for j in listed.split(",") if j.strip()]
    return sorted(str(p) for p in STACK_JARS_DIR.glob("*.jar"))


def under_spark_submit() -> bool:
    """True when this Python process was started by spark-submit (the JVM is already configured)."""
    return SPARK_SUBMIT_GATEWAY_ENV in os.environ


@dataclass(frozen=True)
class SparkSettings:
    """Defaults sized for a 2-core machine: local[2], few shuffle partitions, a capped heap.

    master: Spark master URL; None leaves it to spark-submit or spark-defaults.conf.
    jars: jar paths for `spark.jars`; None means the stack's jars (not under spark-submit).
    packages: Maven coordinates for `spark.jars.packages` (a cluster that resolves its own jars).
    python_executable: interpreter of the Python workers; None means this interpreter for a local
        master (so workers see the same venv: pyarrow, fastavro) and the cluster's default otherwise.
    extra_conf: any other Spark settings; they win over everything above.
    """

    app_name: str = "bottledwater"
    master: str | None = DEFAULT_MASTER
    shuffle_partitions: int = 2
    driver_memory: str = "1g"
    ui_enabled: bool = False
    jars: Sequence[str] | None = None  # None: the stack's jars
    packages: Sequence[str] = ()
    python_executable: str | None = None
    extra_conf: Mapping[str, str] = field(default_factory=dict)

    def conf(self) -> dict[str, str]:
        jars = (stack_jars() if not under_spark_submit() else []) if self.jars is None else list(self.jars)
        conf = {
            "spark.sql.extensions": DELTA_EXTENSION,
            "spark.sql.catalog.spark_catalog": DELTA_CATALOG,
            "spark.sql.shuffle.partitions": str(self.shuffle_partitions),
            "spark.default.parallelism": str(self.shuffle_partitions),
            "spark.driver.memory": self.driver_memory,
            "spark.ui.enabled": str(self.ui_enabled).lower(),
            "spark.ui.showConsoleProgress": "false",
            "spark.sql.session.timeZone": "UTC",
            # Delta's MERGE would otherwise cache its source at the default storage level; a
            # micro-batch fits in memory and this avoids disk spills on a small machine.
            "spark.databricks.delta.merge.materializeSource": "auto",
            # Delta rebuilds table state with 50 partitions by default: 50 tasks per small table
            # read on 2 cores costs seconds. It follows the shuffle partitions instead.
            "spark.databricks.delta.snapshotPartitions": str(self.shuffle_partitions),
            # VACUUM lists a table's files in this many tasks (Spark's default: 10,000): over a
            # minute of empty tasks per table on 2 cores, for a mirror that is one directory.
            "spark.sql.sources.parallelPartitionDiscovery.parallelism": str(self.shuffle_partitions),
            "spark.sql.adaptive.enabled": "true",
            # A Kafka record's repeated header keeps its last value when the merge reads the headers
            # as a map (spark_jobs.decoding.spark_decode), instead of failing the batch.
            "spark.sql.mapKeyDedupPolicy": "LAST_WIN",
            # PySpark 4 records the Python call site of every Column function for error messages:
            # three py4j round trips and a failed import of IPython per call, a third of the time
            # a table's decoding plan took to build (docs/lakehouse.md, "Many tables").
            "spark.python.sql.dataFrameDebugging.enabled": "false",
        }
        if jars:
            conf["spark.jars"] = ",".join(jars)
        if self.packages:
            conf["spark.jars.packages"] = ",".join(self.packages)
        python = self.python_executable
        if python is None and self.master is not None and self.master.startswith("local"):
            python = sys.executable
        if python:
            conf["spark.pyspark.python"] = python
        conf.update(self.extra_conf)
        return conf


def build_session(settings: SparkSettings | None = None) -> SparkSession:
    """Start (or join, `getOrCreate`) the session. Under spark-submit the master is spark-submit's."""
    from pyspark.sql import SparkSession

    jvm_names.remember()
    settings = settings or SparkSettings()
    conf = settings.conf()
    python = conf.get("spark.pyspark.python")
    if python and "PYSPARK_PYTHON" not in os.environ:
        # PySpark picks the workers' interpreter from this variable only, not from the conf.
        os.environ["PYSPARK_PYTHON"] = python
    builder = SparkSession.builder.appName(settings.app_name)
    if settings.master is not None and not under_spark_submit():
        builder = builder.master(settings.master)
    for key, value in conf.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()
