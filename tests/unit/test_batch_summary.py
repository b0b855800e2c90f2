"""The batch summary folded from the merge's one aggregate (`batch_schema.fold`): what a batch holds
per partition, whatever the grouping split it into."""

from __future__ import annotations

from typing import Any

from spark_jobs.merging import batch_schema

CONTROL = "app.bottledwater.control"


def _group(
    topic: str = "app.people", partition: int = 0, *, max_offset: int, records: int, **values: Any
) -> dict[str, Any]:
    group = {"topic": topic, "partition": partition, "tombstone": False, "unchanged": None,
             "control_key": None, "control_value": None, "key_id": None, "value_id": None,
             "key_fields": None, "value_fields": None}  # fmt: skip
    group.update(values, max_offset=max_offset, records=records)
    return group


def _frame_id(schema_id: int) -> bytes:
    return schema_id.to_bytes(4, "big")


def test_avro_groups_fold_into_counts_ids_offsets_and_toast_columns() -> None:
    groups = [
        _group(max_offset=9, records=6, key_id=_frame_id(1), value_id=_frame_id(2)),
        _group(max_offset=12, records=2, key_id=_frame_id(1), value_id=_frame_id(5), unchanged="doc,blob"),
        _group(max_offset=11, records=3, key_id=_frame_id(1), tombstone=True),
        _group(
            partition=1, max_offset=4, records=1, key_id=_frame_id(1), value_id=_frame_id(2), unchanged="doc"
        ),
    ]
    summary = batch_schema.fold(groups, CONTROL, "avro")
    assert summary.offsets == {("app.people", 0): 12, ("app.people", 1): 4}
    assert (summary.table_messages, summary.tombstones) == (12, 3)
    assert (summary.key_schema_ids, summary.value_schema_ids) == ({1}, {2, 5})
    assert summary.unchanged_columns == ["doc", "blob"]
    assert summary.control_records == []
    assert summary.applied is None  # no group carried a position


def test_the_newest_position_of_the_table_records_is_kept_not_the_control_topics() -> None:
    groups = [
        _group(max_offset=9, records=6, max_position=41),
        _group(partition=1, max_offset=4, records=1, max_position=57),
        _group(max_offset=11, records=3, tombstone=True, max_position=None),
        _group(CONTROL, 0, max_offset=30, records=1, control_key=b"k", max_position=None),
    ]
    assert batch_schema.fold(groups, CONTROL, "avro").applied == 57
    assert batch_schema.fold(groups[2:], CONTROL, "avro").applied is None


def test_control_records_are_kept_once_per_record_and_count_as_no_table_message() -> None:
    truncate = (b"people", b'{"op": "truncate"}')
    groups = [
        _group(CONTROL, 0, max_offset=30, records=2, control_key=truncate[0], control_value=truncate[1]),
        _group(CONTROL, 0, max_offset=31, records=1, control_key=b"other"),
        _group(max_offset=3, records=4, key_id=_frame_id(1), value_id=_frame_id(2)),
    ]
    summary = batch_schema.fold(groups, CONTROL, "avro")
    assert summary.control_records == [truncate, truncate, (b"other", None)]
    assert summary.table_messages == 4
    assert summary.offsets == {(CONTROL, 0): 31, ("app.people", 0): 3}
    # The batch's identity covers the control topic's offsets too.
    assert summary.identity() != batch_schema.fold(groups[2:], CONTROL, "avro").identity()


def test_json_field_names_are_the_union_of_every_record_shape_shortest_first() -> None:
    groups = [
        _group(max_offset=5, records=2, key_fields=["id"], value_fields=["id", "name", "added"]),
        _group(max_offset=6, records=1, key_fields=["id"], value_fields=["id", "name"]),
        _group(max_offset=7, records=1, key_fields=["id"], tombstone=True),
    ]
    summary = batch_schema.fold(groups, CONTROL, "json")
    assert summary.json_key_fields == ["id"]
    assert summary.json_value_fields == ["id", "name", "added"]
    assert (summary.table_messages, summary.tombstones) == (4, 1)
    assert summary.key_schema_ids == set()


def test_a_summarys_ranges_are_the_first_and_last_offset_read_from_each_partition() -> None:
    summary = batch_schema.BatchSummary(offsets={("t", 0): 9, ("c", 0): 4}, starts={("t", 0): 3, ("c", 0): 4})
    assert summary.ranges() == {("t", 0): (3, 9), ("c", 0): (4, 4)}
