"""What one micro-batch holds, learnt in one pass over its Kafka records before decoding it.

Per topic partition: the highest offset (the batch's identity for idempotent writes), the Avro
schema ids of keys and values (the writer schemas to fetch), the JSON field names (JSON topics), the
unchanged-TOAST column names, the tombstone count and the control-topic records.

The merge reads each batch from Kafka once (`read_once`): the summary's pass keeps the records, and
the decoding reads them from there instead of from Kafka again.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kafka_contract.headers import HEADER_LSN, HEADER_OP, HEADER_UNCHANGED, OP_READ
from spark_jobs.connections.kafka_source import RECORD_COLUMNS
from spark_jobs.merging.streamed_commits import early_xid

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


@dataclass
class BatchSummary:
    offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    # The lowest offset read from every partition: with `offsets`, the range a parked slice replays.
    starts: dict[tuple[str, int], int] = field(default_factory=dict)
    table_messages: int = 0
    tombstones: int = 0
    key_schema_ids: set[int] = field(default_factory=set)
    value_schema_ids: set[int] = field(default_factory=set)
    json_key_fields: list[str] = field(default_factory=list)
    json_value_fields: list[str] = field(default_factory=list)
    unchanged_columns: list[str] = field(default_factory=list)
    control_records: list[tuple[bytes | None, bytes | None]] = field(default_factory=list)
    # The newest source position among the table records (`watermark_io.batch_applied` of their
    # decoding, read from the headers here so that the watermark costs no job per table).
    applied: int | None = None
    # The xids of changes produced before their commit (`streamed_commits`): their position is
    # their commit's, `applied` once it is known (`resolved`).
    early_xids: set[int] = field(default_factory=set)

    def resolved(self, commits: Mapping[int, tuple[int, str]]) -> None:
        """`applied` counting the changes produced before their commit, at their commits' LSNs."""
        lsns = [commits[x][0] for x in self.early_xids if x in commits]
        if lsns:
            self.applied = max(self.applied or 0, *lsns)

    def identity(self) -> str:
        """`offsets_identity` of the highest offset read from every partition."""
        return offsets_identity(self.offsets)

    def ranges(self) -> dict[tuple[str, int], tuple[int, int]]:
        """The (first, last) offset read from every partition: what a parked slice replays."""
        return {p: (self.starts[p], end) for p, end in self.offsets.items()}


def offsets_identity(offsets: Mapping[tuple[str, int], int]) -> str:
    """A digest of the highest offset read from every partition: two batches that end at the same
    offsets everywhere cover the same data (whatever their start), see docs/lakehouse.md."""
    ends = sorted(f"{t}:{p}:{o}" for (t, p), o in offsets.items())
    return hashlib.sha256(json.dumps(ends).encode()).hexdigest()[:20]


@contextmanager
def read_once(batch: DataFrame) -> Iterator[DataFrame]:
    """The batch's records, kept (memory, spilling to disk) by the first action that reads them, so
    that the summary and the decoding share one Kafka read; released on exit.

    A local checkpoint rather than `persist()`: Spark's in-memory columnar cache measured slower than
    reading Kafka a second time. Its price is that it has no lineage: an executor
    lost while the batch runs fails the batch (the query stops, and its next run or its supervisor
    restarts it from the streaming checkpoint; every Delta commit of a batch is idempotent).

    The records are kept in at most as many partitions as the application has cores (coalesced:
    no shuffle; a batch of fewer Kafka partitions keeps its own). The Kafka source makes one per
    topic partition, and every table's slice is a filter over all of them: with 200 topics each of
    the hundreds of small jobs of a batch ran 200 tasks."""
    records = batch.select(*RECORD_COLUMNS)
    records = records.coalesce(max(1, batch.sparkSession.sparkContext.defaultParallelism))
    held = records.localCheckpoint(eager=False)
    try:
        yield held
    finally:
        # No public call releases a local checkpoint's blocks (DataFrame.unpersist does not know
        # them); without this they would stay until the JVM's garbage collector finds them.
        held._jdf.logicalPlan().rdd().unpersist(False)


def summarize(batch: DataFrame, control_topic: str, output_format: str) -> BatchSummary:
    """One aggregate over the batch: its records grouped by everything the summary keeps (a handful
    of groups per partition), folded in Python by `fold`. Grouping, rather than collecting sets,
    keeps the aggregate in Spark's generated code; the headers are read as a map, not filtered with a
    lambda (interpreted per record), which together measured about 2x faster."""
    return fold(_groups(batch, control_topic, output_format), control_topic, output_format)


def summarize_topics(
    batch: DataFrame, control_topic: str, output_format: str
) -> tuple[dict[str, BatchSummary], BatchSummary]:
    """`summarize` of each table topic's slice of a batch of many topics, in one aggregate for all:
    each summary holds its topic's groups and every control-topic group, as if its slice had been
    summarized alone; and the summary of the control topic's groups alone (that of a table named by
    a control event but without a record in the batch)."""
    groups = _groups(batch, control_topic, output_format)
    control = [g for g in groups if g["topic"] == control_topic]
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for group in groups:
        if group["topic"] != control_topic:
            by_topic.setdefault(group["topic"], []).append(group)
    tables = {topic: fold([*own, *control], control_topic, output_format) for topic, own in by_topic.items()}
    return tables, fold(control, control_topic, output_format)


def _groups(batch: DataFrame, control_topic: str, output_format: str) -> list[dict[str, Any]]:
    """`summarize`'s aggregate, collected: one dict per group."""
    from pyspark.sql import functions as F

    is_control = F.col("topic") == F.lit(control_topic)
    table = ~is_control
    groups = [
        F.col("topic"),
        F.col("partition"),
        (table & F.col("value").isNull()).alias("tombstone"),
        F.when(
            table, F.try_element_at(F.map_from_entries("headers"), F.lit(HEADER_UNCHANGED)).cast("string")
        ).alias("unchanged"),
        F.when(table, early_xid()).alias("early_xid"),
        F.when(is_control, F.col("key")).alias("control_key"),
        F.when(is_control, F.col("value")).alias("control_value"),
    ]
    if output_format == "avro":
        groups += [
            F.when(table, F.substring("key", 2, 4)).alias("key_id"),
            F.when(table, F.substring("value", 2, 4)).alias("value_id"),
        ]
    else:
        groups += [
            F.when(table, F.json_object_keys(F.col("key").cast("string"))).alias("key_fields"),
            F.when(table, F.json_object_keys(F.col("value").cast("string"))).alias("value_fields"),
        ]
    headers = F.map_from_entries("headers")
    lsn = F.try_element_at(headers, F.lit(HEADER_LSN)).cast("string").cast("long")
    snapshot_row = F.col("value").isNotNull() & (
        F.try_element_at(headers, F.lit(HEADER_OP)).cast("string") == F.lit(OP_READ)
    )
    # As `watermark_io.batch_applied` counts it: a snapshot row shows the table before its LSN.
    position = F.when(table, F.when(snapshot_row, lsn - F.lit(1)).otherwise(lsn))
    rows = batch.groupBy(*groups).agg(
        F.max(position).alias("max_position"),
        F.max("offset").alias("max_offset"),
        F.min("offset").alias("min_offset"),
        F.count(F.lit(1)).alias("records"),
    )
    return [row.asDict() for row in rows.collect()]


def fold(groups: Iterable[Mapping[str, Any]], control_topic: str, output_format: str) -> BatchSummary:
    """The summary from `summarize`'s groups: each a distinct (topic, partition, tombstone,
    unchanged, control key and value, schema ids or JSON field names) with its highest offset and its
    number of records."""
    summary = BatchSummary()
    unchanged: dict[str, None] = {}
    key_fields: dict[tuple[str, ...], None] = {}
    value_fields: dict[tuple[str, ...], None] = {}
    for group in groups:
        position = (group["topic"], group["partition"])
        summary.offsets[position] = max(summary.offsets.get(position, -1), group["max_offset"])
        low = group.get("min_offset", group["max_offset"])
        summary.starts[position] = min(summary.starts.get(position, low), low)
        if group["topic"] == control_topic:
            summary.control_records += [(group["control_key"], group["control_value"])] * group["records"]
            continue
        summary.table_messages += group["records"]
        if group.get("early_xid") is not None:
            summary.early_xids.add(int(group["early_xid"]))
        if group.get("max_position") is not None:
            summary.applied = max(summary.applied or group["max_position"], group["max_position"])
        if group["tombstone"]:
            summary.tombstones += group["records"]
        if group["unchanged"]:
            unchanged.update(dict.fromkeys(group["unchanged"].split(",")))
        if output_format == "avro":
            if group["key_id"] is not None:
                summary.key_schema_ids.add(_schema_id(group["key_id"]))
            if group["value_id"] is not None:
                summary.value_schema_ids.add(_schema_id(group["value_id"]))
        else:
            if group["key_fields"] is not None:
                key_fields[tuple(group["key_fields"])] = None
            if group["value_fields"] is not None:
                value_fields[tuple(group["value_fields"])] = None
    summary.unchanged_columns = list(unchanged)
    summary.json_key_fields = _ordered_union([], list(key_fields))
    summary.json_value_fields = _ordered_union([], list(value_fields))
    return summary


def _schema_id(frame_id: bytes | bytearray) -> int:
    return int.from_bytes(bytes(frame_id), "big")


def _ordered_union(known: list[str], field_lists: list[Any]) -> list[str]:
    seen = dict.fromkeys(known)
    for fields in sorted(field_lists, key=len):
        seen.update(dict.fromkeys(fields))
    return list(seen)
