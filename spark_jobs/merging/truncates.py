"""TRUNCATE as the merge sees it: the newest one of a table in a batch's control records, and the
ones seen before the table's mirror existed, kept next to the tombstones until the mirror is created
(`<warehouse>/_bw_state/<schema>/<table>/truncate`, the newest counts: `table_state` reads it)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, NamedTuple

from kafka_contract import control
from kafka_contract.headers import MICROS_PER_SECOND, iso_micros
from spark_jobs.lake import delta_tables
from spark_jobs.rules import layout

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


class Truncate(NamedTuple):
    """The newest TRUNCATE of the table in a batch: its position and commit time."""

    lsn: int
    seq: int
    commit_ts: datetime | None

    @property
    def position(self) -> tuple[int, int]:
        return self.lsn, self.seq


def newest_truncate(
    decode: Callable[[bytes], dict[str, Any]],
    topic: str,
    records: list[tuple[bytes | None, bytes | None]],
    *,
    at_most: int | None = None,
) -> Truncate | None:
    """The newest TRUNCATE of the table behind `topic` among a batch's control-topic records (at or
    before the commit LSN `at_most`, if given)."""
    newest: Truncate | None = None
    for _, value in records:
        if value is None:
            continue
        event = decode(value)
        if event.get("op") != control.TRUNCATE or event.get("topic") != topic:
            continue
        position = (int(event["lsn"]), int(event["seq"]))
        if at_most is not None and position[0] > at_most:
            continue
        if newest is None or position > newest.position:
            commit_ts = event.get("commit_ts")
            # Avro decodes timestamp-micros to a datetime; JSON carries the ISO-8601 text.
            at = (
                commit_ts
                if isinstance(commit_ts, datetime)
                else datetime.fromtimestamp(iso_micros(str(commit_ts)) / MICROS_PER_SECOND, UTC)
            )
            newest = Truncate(*position, at)
    return newest


def pending_path(warehouse: str, location: layout.TableLocation) -> str:
    """Next to the tombstones: TRUNCATEs seen before the mirror existed (lsn, seq, commit_ts)."""
    return f"{warehouse.rstrip('/')}/{layout.STATE_DIR}/{location.schema}/{location.table}/truncate"


def remember(spark: SparkSession, path: str, truncate: Truncate, txn: delta_tables.Txn) -> None:
    """Append a TRUNCATE to the table's pending ones, as an idempotent commit like every other write
    of the batch."""
    from pyspark.sql.types import LongType, StructField, StructType, TimestampType

    schema = StructType(
        [
            StructField(layout.LSN, LongType(), False),
            StructField(layout.SEQ, LongType(), False),
            StructField(layout.COMMIT_TS, TimestampType(), True),
        ]
    )
    row = spark.createDataFrame([tuple(truncate)], schema)
    with delta_tables.idempotent(spark, txn):
        row.write.format("delta").mode("append").save(path)
