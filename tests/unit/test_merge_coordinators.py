"""The merge's coordinators on real Delta tables, fed records built here (JSON, as the worker's `-f
json` writes them; no Kafka): `TableMerger` runs a slice's steps in their order (tombstones, history,
mirror, then the mark commit), and `AllTablesMerger` parks a table whose slice fails while the others
go on, and moves the marks of the tables an idle batch has nothing of without a commit of theirs."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kafka_contract import control
from kafka_contract.headers import HEADER_COMMIT_TS, HEADER_LSN, HEADER_OP, HEADER_SEQ, HEADER_XID, iso_utc
from kafka_contract.topics import control_topic_name
from spark_jobs.connections.kafka_source import KafkaSource
from spark_jobs.lake import delta_tables, watermark_io
from spark_jobs.merge_options import MergeOptions
from spark_jobs.merging import scd2
from spark_jobs.merging.merge_batch import TableMerger
from spark_jobs.merging.merge_query import AllTablesMerger
from spark_jobs.rules import layout
from spark_jobs.rules.mirror_features import PORTABLE
from spark_jobs.rules.watermark import WATERMARK_PROPERTY, parse_mark, table_key

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

PREFIX = "app"
CONTROL = control_topic_name(PREFIX)
RECORDS = (
    "topic STRING, partition INT, offset BIGINT, key BINARY, value BINARY, "
    "headers ARRAY<STRUCT<key: STRING, value: BINARY>>"
)
TS = datetime(2026, 12, 1, tzinfo=UTC)


def change(
    topic: str, offset: int, key: int, value: dict[str, Any] | None, lsn: int, *, op: str = "c"
) -> tuple[Any, ...]:
    """A table topic's message: the row as JSON (None: a delete's tombstone), its `bw.*` headers."""
    headers = [
        (HEADER_OP, op.encode()),
        (HEADER_LSN, str(lsn).encode()),
        (HEADER_SEQ, b"0"),
        (HEADER_XID, b"1"),
        (HEADER_COMMIT_TS, iso_utc(TS).encode()),
    ]
    body = None if value is None else json.dumps({"id": key, **value}).encode()
    return (topic, 0, offset, json.dumps({"id": key}).encode(), body, headers)


def progress(offset: int, lsn: int, offsets: dict[tuple[str, int], int]) -> tuple[Any, ...]:
    """A progress event on the control topic: every transaction up to `lsn` lies below `offsets`."""
    event = control.progress_record(lsn, TS, offsets)
    return (CONTROL, 0, offset, control.PROGRESS_KEY.encode(), json.dumps(event, default=str).encode(), [])


def records(spark: SparkSession, *rows: tuple[Any, ...]) -> DataFrame:
    return spark.createDataFrame(list(rows), RECORDS)


def end_offsets(checkpoint: Path, batch_id: int, ends: dict[str, int]) -> None:
    """The batch's end offsets as Structured Streaming's offsets log holds them (the watermark's)."""
    (checkpoint / "offsets").mkdir(parents=True, exist_ok=True)
    sources = json.dumps({topic: {"0": end} for topic, end in ends.items()})
    (checkpoint / "offsets" / str(batch_id)).write_text(f"v1\n{{}}\n{sources}\n")


def mirror_rows(spark: SparkSession, path: str) -> list[tuple[Any, ...]]:
    return sorted(tuple(r) for r in spark.read.format("delta").load(path).select("id", "name").collect())


def operations(spark: SparkSession, path: str) -> list[tuple[int, str, str | None]]:
    """(version, operation, user metadata) of the table's commits, oldest first."""
    rows = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").select("version", "operation", "userMetadata")
    return sorted((int(r[0]), str(r[1]), r[2]) for r in rows.collect())


def commits(spark: SparkSession, path: str, operation: str) -> list[datetime]:
    """When the table's commits of `operation` were made."""
    rows = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").where(f"operation = '{operation}'")
    return [r["timestamp"] for r in rows.select("timestamp").collect()]


def test_a_slice_writes_the_tombstones_the_history_and_the_mirror_then_the_mark_commit(
    spark: SparkSession, tmp_path: Path
) -> None:
    warehouse, checkpoint = str(tmp_path / "lake"), tmp_path / "checkpoint"
    topic = f"{PREFIX}.orders"
    merger = TableMerger(
        layout.location_for_topic(topic, PREFIX),
        MergeOptions(warehouse, output_format="json", topic_prefix=PREFIX, history=True),
    )
    merger.bind("unit-query", str(checkpoint))
    end_offsets(checkpoint, 0, {topic: 3, CONTROL: 1})
    first = records(
        spark,
        change(topic, 0, 1, {"name": "a"}, 100),
        change(topic, 1, 2, {"name": "b"}, 110),
        change(topic, 2, 3, {"name": "c"}, 120),
        progress(0, 120, {(topic, 0): 3, (CONTROL, 0): 0}),
    )
    assert merger.process(first, 0) is not None
    end_offsets(checkpoint, 1, {topic: 5, CONTROL: 2})
    second = records(
        spark,
        change(topic, 3, 1, {"name": "a2"}, 200, op="u"),
        change(topic, 4, 2, None, 210, op="d"),
        progress(1, 210, {(topic, 0): 5, (CONTROL, 0): 1}),
    )
    result = merger.process(second, 1)

    assert result is not None and (result.messages, result.changes) == (2, 2)
    assert mirror_rows(spark, merger.path) == [(1, "a2"), (3, "c")]
    tombstones = spark.read.format("delta").load(merger.location.tombstones_path(warehouse))
    assert [(r["id"], r[layout.LSN]) for r in tombstones.collect()] == [(2, 210)]
    history_path = merger.location.history_path(warehouse)
    history = spark.read.format("delta").load(history_path).select("id", "name", scd2.END_LSN)
    assert sorted(tuple(r) for r in history.collect()) == [
        (1, "a", 200), (1, "a2", None), (2, "b", 210), (3, "c", None)
    ]  # fmt: skip
    # The mirror's MERGE carries the batch's mark, the commit after it (the property) names it too.
    mark = parse_mark(delta_tables.table_properties(spark, merger.path)[WATERMARK_PROPERTY])
    assert mark is not None and mark.watermark == 210 and merger.mark == mark
    *_, merged, marked = operations(spark, merger.path)
    assert (merged[1], marked[1]) == ("MERGE", "SET TBLPROPERTIES")
    assert merged[2] == marked[2] == mark.metadata()
    # The steps' order: the tombstones, the history's MERGE, the mirror's, then the mark commits.
    newest = [
        max(commits(spark, path, operation))
        for path, operation in (
            (merger.location.tombstones_path(warehouse), "WRITE"),
            (history_path, "MERGE"),
            (merger.path, "MERGE"),
            (merger.path, "SET TBLPROPERTIES"),
            (history_path, "SET TBLPROPERTIES"),
        )
    ]
    assert newest == sorted(newest)
    assert operations(spark, history_path)[-1][2] == mark.metadata()  # the history's own mark commit


def test_a_failed_slice_is_parked_and_the_tables_later_slice_waits_behind_it_while_others_merge(
    spark: SparkSession, tmp_path: Path
) -> None:
    warehouse = str(tmp_path / "lake")
    good, bad = f"{PREFIX}.good", f"{PREFIX}.bad"
    options = MergeOptions(warehouse, output_format="json", topic_prefix=PREFIX, mirror_features=PORTABLE)
    merger = AllTablesMerger(
        options, KafkaSource("localhost:1"), lambda topic: True, threads=2, retry_parked_s=3600
    )
    merger.bind("unit-query")
    try:
        # A portable table cannot hold the column name "odd name": the slice of `bad` fails.
        merger(records(spark, change(good, 0, 1, {"name": "g1"}, 100),
                       change(bad, 0, 1, {"odd name": "x"}, 101)), 0)  # fmt: skip
        merger(records(spark, change(good, 1, 2, {"name": "g2"}, 200),
                       change(bad, 1, 2, {"name": "fine"}, 201)), 1)  # fmt: skip
    finally:
        merger.close()

    assert mirror_rows(spark, merger.merger(good).path) == [(1, "g1"), (2, "g2")]
    assert delta_tables.read_table(spark, merger.merger(bad).path) is None
    slices = merger.parked.slices(bad)
    assert [(s.batch_id, s.ranges) for s in slices] == [(0, {(bad, 0): (0, 0)}), (1, {(bad, 0): (1, 1)})]
    assert "odd name" in slices[0].error and slices[1].error == "parked behind an earlier slice"
    assert "odd name" in merger.errors[bad] and not merger.parked.is_parked(good)


def test_an_idle_batch_moves_the_marks_of_its_tables_in_one_idle_marks_commit(
    spark: SparkSession, tmp_path: Path
) -> None:
    warehouse, checkpoint = str(tmp_path / "lake"), tmp_path / "checkpoint"
    orders, items = f"{PREFIX}.orders", f"{PREFIX}.items"
    options = MergeOptions(warehouse, output_format="json", topic_prefix=PREFIX)
    merger = AllTablesMerger(
        options, KafkaSource("localhost:1"), lambda topic: True, threads=2, topics=(orders, items)
    )
    merger.bind("unit-query", str(checkpoint))
    everything = {(orders, 0): 1, (items, 0): 1, (CONTROL, 0): 0}
    try:
        end_offsets(checkpoint, 0, {orders: 1, items: 1, CONTROL: 1})
        first = (change(orders, 0, 1, {"name": "o"}, 100), change(items, 0, 1, {"name": "i"}, 110))
        merger(records(spark, *first, progress(0, 110, everything)), 0)
        paths = {topic: merger.merger(topic).path for topic in (orders, items)}
        versions = {topic: delta_tables.newest_version(spark, path) for topic, path in paths.items()}
        # Nothing of either table: only the worker's proof that every transaction up to 500 is in.
        end_offsets(checkpoint, 1, {orders: 1, items: 1, CONTROL: 2})
        merger(records(spark, progress(1, 500, {**everything, (CONTROL, 0): 1})), 1)
    finally:
        merger.close()

    assert {t: delta_tables.newest_version(spark, p) for t, p in paths.items()} == versions
    idle = watermark_io.idle_marks(spark, warehouse)
    assert {t: [m.mark.watermark for m in idle[table_key(p)]] for t, p in paths.items()} == {
        orders: [500], items: [500]
    }  # fmt: skip
    assert merger.marks() == {orders: None, items: None}  # their newest batch had nothing of them
