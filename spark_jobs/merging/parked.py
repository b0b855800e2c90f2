"""Tables whose slice of a merge batch failed, parked with their Kafka offset ranges until a replay
merges them (docs/lakehouse.md, "A table that fails").

The one merge query commits its streaming checkpoint past a failed table's records so that the other
tables keep merging; what the failed table did not merge is recorded here first, in a small Delta
table (`<warehouse>/_bw_state/_merge/parked`: topic, batch id, the ranges as JSON, the error). A table
stays parked, every later slice of it parked too (so its own changes keep their order), until a
replay of the union of its ranges succeeds; only then are its rows removed. A failure to record a
slice fails the whole batch, so nothing is ever skipped silently.

The same log holds the slices a merge working behind the changelog (`--mirror-budget`) leaves to
the mirrors' thread: **deferred**, not failed (their `error` is `DEFERRED`); their records wait in
the changelog, and the thread merges the table from there (`mirrors_behind`).
"""

from __future__ import annotations

import json
import operator
import threading
from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from functools import reduce
from typing import TYPE_CHECKING

from spark_jobs.connections.kafka_source import OffsetRanges
from spark_jobs.lake import delta_tables
from spark_jobs.rules import layout

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

PARKED_DIR = "_merge/parked"
DEFERRED = "deferred: merged behind the changelog (--mirror-budget)"


@dataclass(frozen=True)
class ParkedSlice:
    topic: str
    batch_id: int
    ranges: dict[tuple[str, int], tuple[int, int]]
    error: str
    parked_at: datetime | None = None


def parked_path(warehouse: str) -> str:
    return f"{warehouse.rstrip('/')}/{layout.STATE_DIR}/{PARKED_DIR}"


def union(slices: list[ParkedSlice]) -> dict[tuple[str, int], tuple[int, int]]:
    """One range per partition covering every slice's (a table's records between two of its parked
    slices are in parked slices too: once parked, all its slices are)."""
    merged: dict[tuple[str, int], tuple[int, int]] = {}
    for parked in slices:
        for position, (first, last) in parked.ranges.items():
            low, high = merged.get(position, (first, last))
            merged[position] = (min(low, first), max(high, last))
    return merged


def encode_ranges(ranges: OffsetRanges) -> str:
    return json.dumps(sorted([t, p, first, last] for (t, p), (first, last) in ranges.items()))


def decode_ranges(text: str) -> dict[tuple[str, int], tuple[int, int]]:
    return {(t, int(p)): (int(first), int(last)) for t, p, first, last in json.loads(text)}


class ParkedLog:
    """The parked slices, held in memory after `load` and written through to the Delta table. Safe
    to call from the merge's threads and its mirrors' thread (`mirrors_behind`): reads and writes
    hold one lock, so writes are serialized (one driver writes this table) and no reader sees a
    table half updated."""

    def __init__(self, warehouse: str) -> None:
        self.path = parked_path(warehouse)
        self._lock = threading.RLock()
        self._slices: dict[str, list[ParkedSlice]] | None = None

    def load(self, spark: SparkSession) -> None:
        with self._lock:
            if self._slices is not None:
                return
            slices: dict[str, list[ParkedSlice]] = {}
            kept = delta_tables.read_table(spark, self.path)
            if kept is not None:
                for row in kept.collect():
                    ranges = decode_ranges(row["ranges"])
                    parked = ParkedSlice(
                        row["topic"], row["batch_id"], ranges, row["error"], _aware(row["parked_at"])
                    )
                    slices.setdefault(parked.topic, []).append(parked)
            self._slices = slices

    def topics(self) -> list[str]:
        with self._lock:
            return sorted(self._loaded())

    def is_parked(self, topic: str) -> bool:
        with self._lock:
            return bool(self._loaded().get(topic))

    def slices(self, topic: str) -> list[ParkedSlice]:
        with self._lock:
            return list(self._loaded().get(topic, []))

    def is_deferred(self, topic: str) -> bool:
        """Parked only by the schedule (`DEFERRED`), not by a failure."""
        slices = self.slices(topic)
        return bool(slices) and all(s.error == DEFERRED for s in slices)

    def deferred_topics(self) -> list[str]:
        return [t for t in self.topics() if self.is_deferred(t)]

    def waiting_s(self, topic: str, now: datetime) -> float | None:
        """How long the table's oldest slice has waited (None: none waits)."""
        times = [s.parked_at for s in self.slices(topic) if s.parked_at is not None]
        return None if not times else max(0.0, (now - min(times)).total_seconds())

    def park(self, spark: SparkSession, parked: ParkedSlice) -> None:
        """Record a slice (durably, before the batch may commit its streaming checkpoint)."""
        self.park_all(spark, [parked])

    def park_all(self, spark: SparkSession, slices: list[ParkedSlice]) -> None:
        """Record slices in one commit (a batch's deferred tables: one commit, not one per table)."""
        from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

        if not slices:
            return
        schema = StructType(
            [
                StructField("topic", StringType(), False),
                StructField("batch_id", LongType(), False),
                StructField("ranges", StringType(), False),
                StructField("error", StringType(), False),
                StructField("parked_at", TimestampType(), False),
            ]
        )
        now = datetime.now(UTC)
        stamped = [replace(s, parked_at=s.parked_at or now) for s in slices]
        rows = [(s.topic, s.batch_id, encode_ranges(s.ranges), s.error, s.parked_at) for s in stamped]
        with self._lock:
            spark.createDataFrame(rows, schema).write.format("delta").mode("append").save(self.path)
            for parked in stamped:
                self._loaded().setdefault(parked.topic, []).append(parked)

    def resolve_all(self, spark: SparkSession, topics: list[str]) -> None:
        """Forget these tables' slices, in one commit."""
        from delta.tables import DeltaTable
        from pyspark.sql import functions as F

        if not topics:
            return
        with self._lock:
            DeltaTable.forPath(spark, self.path).delete(F.col("topic").isin(sorted(set(topics))))
            for topic in topics:
                self._loaded().pop(topic, None)

    def resolve_slices(self, spark: SparkSession, merged: Mapping[str, Collection[int]]) -> None:
        """Forget the slices that merged (each table's batch ids), in one commit: a slice parked
        while its table was being merged stays."""
        from delta.tables import DeltaTable
        from pyspark.sql import functions as F

        merged = {topic: sorted(set(ids)) for topic, ids in merged.items() if ids}
        if not merged:
            return
        condition = reduce(
            operator.or_,
            ((F.col("topic") == t) & F.col("batch_id").isin(ids) for t, ids in sorted(merged.items())),
        )
        with self._lock:
            DeltaTable.forPath(spark, self.path).delete(condition)
            loaded = self._loaded()
            for topic, ids in merged.items():
                kept = [s for s in loaded.get(topic, []) if s.batch_id not in ids]
                if kept:
                    loaded[topic] = kept
                else:
                    loaded.pop(topic, None)

    def _loaded(self) -> dict[str, list[ParkedSlice]]:
        if self._slices is None:
            raise RuntimeError("the parked log was not loaded: call load() first")
        return self._slices


def _aware(at: datetime | None) -> datetime | None:
    """Spark returns timestamps as naive local times."""
    return None if at is None else at.astimezone(UTC)
