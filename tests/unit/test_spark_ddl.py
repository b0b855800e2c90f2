"""The merge's reading of `ddl` control events, without Spark: which events are the table's, in
which order, and which columns they add with which lake types."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from pyspark.sql.types import ArrayType, DecimalType, IntegerType, LongType, StringType

from kafka_contract.control import ControlDecoder
from spark_jobs.merging.ddl import DdlRecord, new_columns, spark_column, table_events


def column(name: str, base: str, typmod: int = -1, array: bool = False) -> dict[str, Any]:
    return {
        "name": name,
        "type": base,
        "base_type": base,
        "typmod": typmod,
        "array": array,
        "not_null": False,
    }


def control(op: str, topic: str, lsn: int, seq: int, **fields: Any) -> tuple[bytes | None, bytes | None]:
    record = {"op": op, "topic": topic, "lsn": lsn, "seq": seq, "commit_ts": "2024-05-01T12:00:00.000000Z"}
    return b"key", json.dumps({**record, **fields}).encode()


def test_the_tables_ddl_events_oldest_first() -> None:
    records = [
        control("ddl", "p.orders", 20, 1, ddl_command="ALTER TABLE", ddl_columns=[column("id", "int4")]),
        control("ddl", "p.other", 5, 0, ddl_command="ALTER TABLE"),
        control("t", "p.orders", 7, 0),
        (b"key", None),
        control("ddl", "p.orders", 10, 0, ddl_command="DROP TABLE", ddl_renamed_to=None, ddl_columns=[]),
    ]
    events = table_events(ControlDecoder("json"), "p.orders", records)
    assert [(e.lsn, e.seq, e.command) for e in events] == [(10, 0, "DROP TABLE"), (20, 1, "ALTER TABLE")]
    assert events[0].commit_ts == datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


def test_columns_are_typed_as_the_catalog_maps_them() -> None:
    numeric_10_2 = (10 << 16 | 2) + 4
    assert spark_column(column("amount", "numeric", numeric_10_2)) == ("amount", DecimalType(10, 2))
    assert spark_column(column("n", "numeric")) == ("n", StringType())
    assert spark_column(column("tags", "text", array=True)) == ("tags", ArrayType(StringType(), True))
    assert spark_column(column("big", "int8")) == ("big", LongType())


def record(lsn: int, command: str, columns: list[dict[str, Any]]) -> DdlRecord:
    return DdlRecord(lsn, 0, None, command, "table", "public.t", "", None, tuple(columns))


def test_new_columns_come_from_the_newest_event_that_lists_columns() -> None:
    events = [
        record(1, "ALTER TABLE", [column("id", "int4"), column("a", "text")]),
        record(2, "ALTER TABLE", [column("id", "int4"), column("a", "text"), column("b", "int4")]),
    ]
    assert new_columns(events, {"id", "a"}) == [("b", IntegerType())]
    assert new_columns(events, {"id", "a", "b"}) == []
    # A column dropped since an older event is not brought back by it.
    dropped = [*events, record(3, "ALTER TABLE", [column("id", "int4")])]
    assert new_columns(dropped, {"id"}) == []
    assert new_columns([*events, record(4, "DROP TABLE", [])], {"id"}) == [
        ("a", StringType()),
        ("b", IntegerType()),
    ]
