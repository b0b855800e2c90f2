"""The merge's steps fed DataFrames directly, without Kafka: TOAST carry-over, TRUNCATE, newest per
key, and the guarded MERGE (ordering by (lsn, seq), deletes, idempotent replays)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spark_jobs.lake import delta_tables, mirror_merge
from spark_jobs.lake.mirror_merge import MergeSpec
from spark_jobs.rules import changes, layout
from spark_jobs.rules.key_range import KeyRange

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

SCHEMA = (
    "id INT, label STRING, body STRING, _bw_lsn BIGINT, _bw_seq BIGINT, _bw_op STRING, "
    "_bw_commit_ts TIMESTAMP, _bw_unchanged ARRAY<STRING>"
)
TS = datetime(2024, 1, 1, tzinfo=UTC)
KEYS = ("id",)
DATA = ["id", "label", "body"]


def events(spark: SparkSession, *rows: tuple[Any, ...]) -> DataFrame:
    """(id, label, body, lsn, seq, op, unchanged) rows as decoded events."""
    return spark.createDataFrame(
        [
            (i, label, body, lsn, seq, op, TS, list(unchanged))
            for i, label, body, lsn, seq, op, unchanged in rows
        ],
        SCHEMA,
    )


def rows(frame: DataFrame) -> list[tuple[Any, ...]]:
    return sorted(tuple(r) for r in frame.select("id", "label", "body").collect())


def test_newest_per_key_orders_by_lsn_then_seq_not_by_arrival(spark: SparkSession) -> None:
    batch = events(
        spark,
        (1, "newest", "b", 200, 1, "u", ()),
        (1, "oldest", "b", 100, 5, "c", ()),
        (1, "middle", "b", 200, 0, "u", ()),
        (2, "only", "b", 150, 0, "c", ()),
    )
    assert rows(changes.newest_per_key(batch, KEYS)) == [(1, "newest", "b"), (2, "only", "b")]


def test_an_unchanged_toast_value_is_carried_from_the_keys_earlier_event_but_not_across_a_delete(
    spark: SparkSession,
) -> None:
    batch = events(
        spark,
        (1, "v1", "big", 100, 0, "c", ()),
        (1, "v2", None, 200, 0, "u", ("body",)),
        (2, "v1", "big2", 100, 1, "c", ()),
        (2, None, None, 150, 0, "d", ()),
        (2, "v3", None, 300, 0, "u", ("body",)),
    )
    carried = changes.carry_unchanged(batch, KEYS, ["body"])
    newest = {r["id"]: r for r in changes.newest_per_key(carried, KEYS).collect()}
    assert (newest[1]["body"], newest[1]["_bw_unchanged"]) == ("big", [])
    # After the delete nothing is carried: it stays unresolved, for the MERGE to keep the target's.
    assert (newest[2]["body"], newest[2]["_bw_unchanged"]) == (None, ["body"])


def test_events_at_or_before_a_truncate_are_dropped(spark: SparkSession) -> None:
    batch = events(
        spark,
        (1, "before", "b", 100, 0, "c", ()),
        (2, "at", "b", 200, 3, "c", ()),
        (3, "after", "b", 200, 4, "c", ()),
    )
    assert rows(changes.drop_truncated(batch, (200, 3))) == [(3, "after", "b")]
    assert len(rows(changes.drop_truncated(batch, None))) == 3


def merge(
    spark: SparkSession,
    path: str,
    batch: DataFrame,
    version: int,
    *,
    target_empty: bool = False,
    key_range: bool | KeyRange | None = True,
) -> None:
    newest = changes.newest_per_key(batch, KEYS).drop(layout.UNCHANGED)
    spec = MergeSpec(
        path,
        KEYS,
        tuple(DATA),
        delta_tables.Txn("unit-merge-steps", version),
        target_empty=target_empty,
        key_range=key_range,
    )
    mirror_merge.merge_changes(spark, newest, spec)


def test_the_merge_is_guarded_by_lsn_and_a_replayed_batch_changes_nothing(
    spark: SparkSession, tmp_path: Path
) -> None:
    path = str(tmp_path / "mirror")
    first = events(spark, (1, "a", "x", 100, 0, "c", ()), (2, "b", "y", 100, 1, "c", ()))
    target_schema = first.drop(layout.UNCHANGED).schema
    delta_tables.create_table(
        spark, path, target_schema, {layout.KEY_PROPERTY: layout.encode_key_columns(KEYS)}
    )
    merge(spark, path, first, 0)
    # Older than what the mirror holds (a late partition): ignored. Newer delete: applied.
    merge(spark, path, events(spark, (1, "stale", "x", 50, 0, "u", ()), (2, None, None, 300, 0, "d", ())), 1)
    mirror = spark.read.format("delta").load(path)
    assert rows(mirror) == [(1, "a", "x")]
    versions = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").count()
    # The same batch again under the same transaction version: no new commit, same rows.
    merge(spark, path, events(spark, (1, "replayed", "x", 400, 0, "u", ())), 1)
    assert spark.sql(f"DESCRIBE HISTORY delta.`{path}`").count() == versions
    assert rows(spark.read.format("delta").load(path)) == [(1, "a", "x")]


def test_a_key_deleted_twice_is_remembered_twice_and_only_older_changes_are_dropped(
    spark: SparkSession, tmp_path: Path
) -> None:
    tombstones = str(tmp_path / "tombstones")
    # Two batches delete key 1 (at 200 and at 400); a replay of the first adds nothing.
    first = events(spark, (1, None, None, 200, 0, "d", ()), (2, "kept", "b", 210, 0, "c", ()))

    def remember(deletes: DataFrame, version: int) -> None:
        spec = MergeSpec(tombstones, KEYS, tuple(DATA), delta_tables.Txn("unit-tombstones", version))
        mirror_merge.append_tombstones(spark, deletes, spec)

    remember(first, 0)
    remember(first, 0)
    second = events(spark, (1, None, None, 400, 0, "d", ()))
    remember(second, 1)
    remembered = sorted(
        tuple(r) for r in spark.read.format("delta").load(tombstones).select("id", "_bw_lsn").collect()
    )
    assert remembered == [(1, 200), (1, 400)]

    late = events(
        spark,
        (1, "before the first delete", "b", 150, 0, "c", ()),
        (1, "between the deletes", "b", 300, 0, "c", ()),
        (1, None, None, 350, 0, "d", ()),
        (1, "after both", "b", 500, 0, "c", ()),
        (3, "never deleted", "b", 100, 0, "c", ()),
    )
    alive = mirror_merge.drop_resurrections(spark.read.format("delta").load(tombstones), late, KEYS)
    # Each surviving change once (the two remembered deletes do not double it), deletes always kept.
    assert sorted((r["id"], r["_bw_op"], r["label"] or "") for r in alive.collect()) == [
        (1, "c", "after both"),
        (1, "d", ""),
        (3, "c", "never deleted"),
    ]


def test_a_mirror_created_by_the_batch_gets_its_rows_appended_exactly_once(
    spark: SparkSession, tmp_path: Path
) -> None:
    path = str(tmp_path / "mirror")
    batch = events(
        spark,
        (1, "a", "x", 100, 0, "c", ()),
        (2, "b", "y", 100, 1, "c", ()),
        (2, None, None, 200, 0, "d", ()),  # deleted in the same batch: nothing to write
        (3, None, None, 200, 1, "d", ()),  # a delete of a row the new mirror never had
    )
    newest = changes.newest_per_key(batch, KEYS).drop(layout.UNCHANGED)
    delta_tables.create_table(
        spark, path, newest.schema, {layout.KEY_PROPERTY: layout.encode_key_columns(KEYS)}
    )
    merge(spark, path, batch, 0, target_empty=True)
    merge(spark, path, batch, 0, target_empty=True)  # the batch replayed: the same version commits nothing
    assert rows(spark.read.format("delta").load(path)) == [(1, "a", "x")]
    # The next batch MERGEs into what the append wrote, guarded by (lsn, seq) as always.
    merge(spark, path, events(spark, (1, "stale", "x", 50, 0, "u", ()), (4, "d", "z", 300, 0, "c", ())), 1)
    assert rows(spark.read.format("delta").load(path)) == [(1, "a", "x"), (4, "d", "z")]


def test_a_merge_marks_rows_in_deletion_vectors_and_maintenance_purges_them_and_compacts_tombstones(
    spark: SparkSession, tmp_path: Path
) -> None:
    from spark_jobs import maintenance

    warehouse = str(tmp_path / "lake")
    location = layout.TableLocation("", "public", "items")
    path = location.path(warehouse)
    loaded = events(spark, *[(i, "a", "x", 100, i, "c", ()) for i in range(40)]).drop(layout.UNCHANGED)
    delta_tables.create_table(
        spark, path, loaded.schema, {layout.KEY_PROPERTY: layout.encode_key_columns(KEYS)}
    )
    # Four files of ten keys, as maintenance's Z-order by the key leaves them.
    loaded.repartitionByRange(4, "id").write.format("delta").mode("append").save(path)
    # A history table from before deletion vectors were the default: maintenance turns them on.
    delta_tables.create_table(
        spark, location.history_path(warehouse), loaded.schema, {delta_tables.DELETION_VECTORS: "false"}
    )
    tombstones = location.tombstones_path(warehouse)
    for version, key in enumerate((102, 103, 104)):
        deleted = events(spark, (key, None, None, 100 + version, 0, "d", ()))
        spec = MergeSpec(tombstones, KEYS, tuple(DATA), delta_tables.Txn("unit-maint", version))
        mirror_merge.append_tombstones(spark, deleted, spec)

    # Keys 35..41 (bounded by the batch's key range): an update, a stale update, a delete, an insert.
    batch = events(
        spark,
        (35, "b", "y", 200, 0, "u", ()),
        (36, "stale", "y", 50, 0, "u", ()),
        (38, None, None, 200, 1, "d", ()),
        (41, "new", "z", 200, 2, "c", ()),
    )
    merge(spark, path, batch, 1)
    metrics = spark.sql(f"DESCRIBE HISTORY delta.`{path}` LIMIT 1").head()["operationMetrics"]
    # Deletion vectors are on by default: the touched file is marked, nothing copied or removed.
    assert (metrics["numTargetDeletionVectorsAdded"], metrics["numTargetFilesRemoved"]) == ("1", "0")
    assert metrics["numTargetRowsCopied"] == "0"
    expected = sorted(
        [(i, "a", "x") for i in range(40) if i not in (35, 38)] + [(35, "b", "y"), (41, "new", "z")]
    )
    assert rows(spark.read.format("delta").load(path)) == expected

    # The events' commit time is in 2024: a retention that keeps the tombstones.
    results = maintenance.maintain(
        spark, warehouse, vacuum_hours=None, tombstone_retention=timedelta(days=36500), deletion_vectors=True
    )
    assert [r.deletion_vectors_purged for r in results] == [1]
    assert rows(spark.read.format("delta").load(path)) == expected
    history = delta_tables.table_properties(spark, location.history_path(warehouse))
    assert history[delta_tables.DELETION_VECTORS] == "true"
    detail = spark.sql(f"DESCRIBE DETAIL delta.`{tombstones}`").head()
    assert detail is not None and detail["numFiles"] == 1
    assert sorted(r["id"] for r in spark.read.format("delta").load(tombstones).collect()) == [102, 103, 104]


def test_a_small_mirror_is_merged_by_copying_its_touched_file_and_a_large_one_with_deletion_vectors(
    spark: SparkSession, tmp_path: Path, monkeypatch: Any
) -> None:
    from spark_jobs.rules import key_range

    path = str(tmp_path / "mirror")
    loaded = events(spark, *[(i, "a", "x", 100, i, "c", ()) for i in range(20)]).drop(layout.UNCHANGED)
    delta_tables.create_table(
        spark, path, loaded.schema, {layout.KEY_PROPERTY: layout.encode_key_columns(KEYS)}
    )
    loaded.coalesce(1).write.format("delta").mode("append").save(path)
    size = delta_tables.size_bytes(spark, path)
    assert size is not None and 0 < size < delta_tables.SMALL_TABLE_BYTES
    assert delta_tables.size_bytes(spark, str(tmp_path / "nothing")) is None

    def merged(version: int, key: int) -> dict[str, str]:
        batch = events(spark, (key, "b", "y", 200, 0, "u", ()))
        count, bounds = key_range.counted(changes.newest_per_key(batch, KEYS), KEYS)
        assert (count, bounds) == (1, key_range.KeyRange("id", key, key))
        with delta_tables.deletion_vector_writes(spark, path):
            merge(spark, path, batch, version, key_range=bounds)
        # The session's own setting is back after the block.
        assert spark.conf.get(delta_tables.MERGE_DELETION_VECTORS_CONF, None) is None
        history = spark.sql(f"DESCRIBE HISTORY delta.`{path}` LIMIT 1").head()
        assert history is not None
        return dict(history["operationMetrics"])

    # A small table: the touched file is copied (a vector's own Spark jobs cost more than the copy).
    small = merged(1, 3)
    assert (small["numTargetDeletionVectorsAdded"], small["numTargetFilesRemoved"]) == ("0", "1")
    # The same table counted as large: the row is marked in a deletion vector, nothing copied.
    monkeypatch.setattr(delta_tables, "SMALL_TABLE_BYTES", 0)
    large = merged(2, 4)
    assert (large["numTargetDeletionVectorsAdded"], large["numTargetRowsCopied"]) == ("1", "0")
    expected = sorted([(i, "a", "x") for i in range(20) if i not in (3, 4)] + [(3, "b", "y"), (4, "b", "y")])
    assert rows(spark.read.format("delta").load(path)) == expected


def test_the_history_merge_is_bounded_by_the_batchs_key_range_and_closes_versions_the_same(
    spark: SparkSession, tmp_path: Path
) -> None:
    from spark_jobs.merging import scd2
    from spark_jobs.rules import key_range

    def history_after(path: str, bounded: bool) -> tuple[list[tuple[Any, ...]], str]:
        # Two batches of ten new keys: two files, each holding one range of keys.
        for version in range(2):
            batch = events(
                spark, *[(i, "a", "x", 100, i, "c", ()) for i in range(10 * version, 10 * version + 10)]
            )
            spec = MergeSpec(
                path, KEYS, tuple(DATA), delta_tables.Txn("unit-history", version), key_range=None
            )
            scd2.merge_history(spark, batch, spec)
        # Keys 11 and 13 change: their open versions (in the last file) are closed, new ones open.
        batch = events(spark, (11, "b", "y", 200, 0, "u", ()), (13, None, None, 200, 1, "d", ()))
        spec = MergeSpec(
            path, KEYS, tuple(DATA), delta_tables.Txn("unit-history", 2),
            key_range=key_range.of_batch(batch, KEYS) if bounded else None,
        )  # fmt: skip
        scd2.merge_history(spark, batch, spec)
        metrics = spark.sql(f"DESCRIBE HISTORY delta.`{path}` LIMIT 1").head()
        assert metrics is not None
        rows = spark.read.format("delta").load(path).select("id", "label", scd2.START_LSN, scd2.END_LSN)
        return sorted(tuple(r) for r in rows.collect()), str(metrics["operationParameters"]["predicate"])

    bounded_rows, bounded = history_after(str(tmp_path / "bounded"), True)
    plain_rows, plain = history_after(str(tmp_path / "plain"), False)
    assert bounded_rows == plain_rows
    assert (11, "a", 100, 200) in bounded_rows and (11, "b", 200, None) in bounded_rows
    assert (13, "a", 100, 200) in bounded_rows and len(bounded_rows) == 21
    # The bounded MERGE's condition holds the batch's range, which Delta skips files by (the
    # mirror's own pruning: docs/lakehouse.md, "Deletion vectors and the key range").
    assert ">= 11)" in bounded and "<= 13)" in bounded
    assert ">= 11)" not in plain and "<= 13)" not in plain
