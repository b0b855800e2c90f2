"""Finding the mirrors under a warehouse root, on any Hadoop file system (local, s3a, abfs, gs)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from spark_jobs.rules import layout

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DELTA_LOG = "_delta_log"


def list_tables(spark: SparkSession, warehouse: str) -> list[layout.TableLocation]:
    """Every `<warehouse>/<schema>/<table>` holding a Delta log, history tables and state left out."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None, "a classic SparkSession with a JVM (not Spark Connect)"
    hadoop_path = jvm.org.apache.hadoop.fs.Path
    root = hadoop_path(warehouse)
    fs = root.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    if not fs.exists(root):
        return []
    found = []
    for schema_dir in fs.listStatus(root):
        schema = schema_dir.getPath().getName()
        if not schema_dir.isDirectory() or schema == layout.STATE_DIR or schema.startswith((".", "_")):
            continue
        for table_dir in fs.listStatus(schema_dir.getPath()):
            table = table_dir.getPath().getName()
            if table.endswith(layout.HISTORY_SUFFIX) or not table_dir.isDirectory():
                continue
            if fs.exists(hadoop_path(table_dir.getPath(), DELTA_LOG)):
                found.append(layout.TableLocation("", schema, table))
    return sorted(found, key=lambda t: (t.schema, t.table))
