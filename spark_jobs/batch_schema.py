"""What one micro-batch holds, learnt in one pass over its Kafka records before decoding it.

Per topic partition: the highest offset (the batch's identity for idempotent writes), the Avro
schema ids of keys and values (the writer schemas to fetch), the JSON field names (JSON topics), the
unchanged-TOAST column names, the tombstone count and the control-topic records.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kafka_contract.headers import HEADER_UNCHANGED

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


@dataclass
class BatchSummary:
    offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    table_messages: int = 0
    tombstones: int = 0
    key_schema_ids: set[int] = field(default_factory=set)
    value_schema_ids: set[int] = field(default_factory=set)
    json_key_fields: list[str] = field(default_factory=list)
    json_value_fields: list[str] = field(default_factory=list)
    unchanged_columns: list[str] = field(default_factory=list)
    control_records: list[tuple[bytes | None, bytes | None]] = field(default_factory=list)

    def identity(self) -> str:
        """A digest of the highest offset read from every partition: two batches that end at the same
        offsets everywhere cover the same data (whatever their start), see docs/lakehouse.md."""
        ends = sorted(f"{t}:{p}:{o}" for (t, p), o in self.offsets.items())
        return hashlib.sha256(json.dumps(ends).encode()).hexdigest()[:20]


def summarize(batch: DataFrame, control_topic: str, output_format: str) -> BatchSummary:
    from pyspark.sql import functions as F

    is_control = F.col("topic") == F.lit(control_topic)
    table = ~is_control
    aggregates = [
        F.max("offset").alias("max_offset"),
        F.sum(F.when(table, 1).otherwise(0)).alias("messages"),
        F.sum(F.when(table & F.col("value").isNull(), 1).otherwise(0)).alias("tombstones"),
        F.collect_list(F.when(is_control, F.struct("key", "value"))).alias("control"),
        F.collect_set(
            F.when(
                table,
                F.transform(
                    F.filter("headers", lambda h: h["key"] == F.lit(HEADER_UNCHANGED)),
                    lambda h: h["value"].cast("string"),
                ),
            )
        ).alias("unchanged"),
    ]
    if output_format == "avro":
        aggregates += [
            F.collect_set(F.when(table, F.substring("key", 2, 4))).alias("key_ids"),
            F.collect_set(F.when(table, F.substring("value", 2, 4))).alias("value_ids"),
        ]
    else:
        aggregates += [
            F.collect_set(F.when(table, F.json_object_keys(F.col("key").cast("string")))).alias("key_fields"),
            F.collect_set(F.when(table, F.json_object_keys(F.col("value").cast("string")))).alias(
                "value_fields"
            ),
        ]
    rows = batch.groupBy("topic", "partition").agg(*aggregates).collect()
    summary = BatchSummary()
    unchanged: dict[str, None] = {}
    for row in rows:
        summary.offsets[(row["topic"], row["partition"])] = row["max_offset"]
        summary.table_messages += row["messages"]
        summary.tombstones += row["tombstones"]
        summary.control_records += [(r["key"], r["value"]) for r in row["control"]]
        for names in row["unchanged"]:
            for text in names:
                unchanged.update(dict.fromkeys(text.split(",")))
        if output_format == "avro":
            summary.key_schema_ids |= {_schema_id(b) for b in row["key_ids"]}
            summary.value_schema_ids |= {_schema_id(b) for b in row["value_ids"]}
        else:
            summary.json_key_fields = _ordered_union(summary.json_key_fields, row["key_fields"])
            summary.json_value_fields = _ordered_union(summary.json_value_fields, row["value_fields"])
    summary.unchanged_columns = list(unchanged)
    return summary


def _schema_id(frame_id: bytes | bytearray) -> int:
    return int.from_bytes(bytes(frame_id), "big")


def _ordered_union(known: list[str], field_lists: list[Any]) -> list[str]:
    seen = dict.fromkeys(known)
    for fields in sorted(field_lists, key=len):
        seen.update(dict.fromkeys(fields))
    return list(seen)
