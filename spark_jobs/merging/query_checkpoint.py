"""The one merge query's checkpoint, and where a deployment of per-table checkpoints starts from.

Before the one query, every table had its own query and checkpoint, `<checkpoints>/<schema>/<table>`.
The one query's checkpoint is `<checkpoints>/_bw_merge`. When it does not exist yet and per-table
checkpoints do, the query starts (`startingOffsets`) where they left off instead of from the first
offset: each table topic's partitions at the end of its checkpoint's last committed batch (earliest
for a table without one), and the control topic at the lowest offset any table's query had reached
(earliest if a table has no checkpoint), so that no table misses a TRUNCATE or DDL event. Control
events a table had already applied are applied again, which changes nothing (docs/lakehouse.md).
Once the one query has committed a batch, its own checkpoint governs; the per-table ones are no
longer read and can be deleted.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from spark_jobs.connections.kafka_source import EARLIEST
from spark_jobs.rules import layout

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)
QUERY_CHECKPOINT_DIR = "_bw_merge"


def query_checkpoint(checkpoint_root: str) -> str:
    return f"{checkpoint_root.rstrip('/')}/{QUERY_CHECKPOINT_DIR}"


class _Files:
    """Hadoop's filesystem client (local, s3a:// ...): the checkpoints live wherever Spark writes."""

    def __init__(self, spark: SparkSession) -> None:
        jvm = spark.sparkContext._jvm
        assert jvm is not None, "a classic (JVM) Spark session"
        self.jvm = jvm
        self.conf = spark.sparkContext._jsc.hadoopConfiguration()

    def _fs(self, path: str) -> tuple[Any, Any]:
        hadoop_path = self.jvm.org.apache.hadoop.fs.Path(path)
        return hadoop_path.getFileSystem(self.conf), hadoop_path

    def exists(self, path: str) -> bool:
        fs, hadoop_path = self._fs(path)
        return bool(fs.exists(hadoop_path))

    def numbered(self, path: str) -> set[int]:
        """The numeric file names in a directory (a checkpoint's offsets/ and commits/ logs)."""
        fs, hadoop_path = self._fs(path)
        if not fs.exists(hadoop_path):
            return set()
        names = [status.getPath().getName() for status in fs.listStatus(hadoop_path)]
        return {int(n) for n in names if n.isdigit()}

    def read(self, path: str) -> str:
        fs, hadoop_path = self._fs(path)
        stream = fs.open(hadoop_path)
        try:
            return str(self.jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8"))
        finally:
            stream.close()


def committed_offsets(spark: SparkSession, checkpoint: str) -> dict[str, dict[int, int]] | None:
    """The Kafka offsets a streaming checkpoint's last committed batch ended at (the next batch's
    start), or None when it committed none."""
    files = _Files(spark)
    committed = files.numbered(f"{checkpoint}/offsets") & files.numbered(f"{checkpoint}/commits")
    if not committed:
        return None
    return batch_ends(spark, checkpoint, max(committed))


def batch_ends(spark: SparkSession, checkpoint: str, batch_id: int) -> dict[str, dict[int, int]]:
    """The Kafka offsets a streaming checkpoint's batch `batch_id` ends at (exclusive), as planned
    before it ran."""
    # offsets/<n>: a version line, the batch's metadata, then one line per source (one here).
    lines = _Files(spark).read(f"{checkpoint}/offsets/{batch_id}").strip().splitlines()
    ends: dict[str, dict[str, int]] = json.loads(lines[-1])
    return {topic: {int(p): int(o) for p, o in parts.items()} for topic, parts in ends.items()}


def starting_offsets(
    spark: SparkSession,
    checkpoint_root: str,
    partitions: Mapping[str, Sequence[int]],
    control: str,
    topic_prefix: str | None,
) -> str:
    """The one query's `startingOffsets`: "earliest", unless its checkpoint does not exist yet and
    per-table checkpoints do (then a JSON of every subscribed partition, see the module doc).
    `partitions`: the subscribed topics (tables and control) with their partition ids."""
    if _Files(spark).exists(f"{query_checkpoint(checkpoint_root)}/offsets"):
        return "earliest"
    tables = [t for t in partitions if t != control]
    legacy = {}
    for topic in tables:
        location = layout.location_for_topic(topic, topic_prefix)
        ends = committed_offsets(spark, location.checkpoint(checkpoint_root))
        if ends is not None:
            legacy[topic] = ends
    if not legacy:
        return "earliest"
    offsets: dict[str, dict[str, int]] = {}
    for topic in tables:
        reached = legacy.get(topic, {}).get(topic, {})
        offsets[topic] = {str(p): reached.get(p, EARLIEST) for p in partitions[topic]}
    if control in partitions:
        every_table_known = len(legacy) == len(tables)
        offsets[control] = {
            str(p): min((e.get(control, {}).get(p, EARLIEST) for e in legacy.values()), default=EARLIEST)
            if every_table_known
            else EARLIEST
            for p in partitions[control]
        }
    log.info("starting the merge query from %s per-table checkpoints: %s", len(legacy), offsets)
    return json.dumps(offsets)
