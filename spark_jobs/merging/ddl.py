"""DDL events (`--capture-ddl`) as the merge applies them: the table's history and its new columns.

Each merge batch of a table reads the control topic too. Its `ddl` events for the table (matched by
topic, like TRUNCATE) are:

- appended to the table's DDL log, `<warehouse>/_bw_state/<schema>/<table>/ddl` (a Delta table: lsn,
  seq, commit time, command tag, object type and identity, statement, the new name of a rename, the
  columns after the command as JSON), once per `(lsn, seq)` however often a batch is replayed. DROP
  TABLE, RENAME and ALTER COLUMN TYPE are recorded there, and the Dagster Delta asset shows it;
- applied to the mirror when they add columns: the columns the newest event lists and the Delta table
  lacks are added right away, typed as the Postgres catalog maps them (`spark_types.pg_type`), so a
  column added in Postgres reaches the lake when its ALTER TABLE commits, before any row carries it.
  Nothing is dropped or retyped here: rows carry the values, the log carries the history.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from kafka_contract import control
from kafka_contract.headers import MICROS_PER_SECOND, iso_micros
from spark_jobs.connections.postgres_catalog import numeric_precision_scale
from spark_jobs.decoding.spark_types import pg_type
from spark_jobs.lake import delta_tables
from spark_jobs.rules import layout

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.types import DataType

log = logging.getLogger(__name__)

LOG_DIR = "ddl"
DROP_TABLE = "DROP TABLE"


@dataclass(frozen=True)
class DdlRecord:
    """One `ddl` control event of the table."""

    lsn: int
    seq: int
    commit_ts: datetime | None
    command: str
    object_type: str
    object_identity: str
    statement: str
    renamed_to: str | None
    columns: tuple[dict[str, Any], ...]

    @property
    def position(self) -> tuple[int, int]:
        return self.lsn, self.seq


def log_path(warehouse: str, location: layout.TableLocation) -> str:
    """The table's DDL log, next to its tombstones."""
    return f"{warehouse.rstrip('/')}/{layout.STATE_DIR}/{location.schema}/{location.table}/{LOG_DIR}"


def _timestamp(value: object) -> datetime | None:
    if isinstance(value, datetime):
        return value
    if value is None:
        return None
    return datetime.fromtimestamp(iso_micros(str(value)) / MICROS_PER_SECOND, UTC)


def table_events(
    decode: Callable[[bytes], dict[str, Any]], topic: str, records: list[tuple[bytes | None, bytes | None]]
) -> list[DdlRecord]:
    """The `ddl` events of the table behind `topic` among a batch's control records, oldest first."""
    found = []
    for _, value in records:
        if value is None:
            continue
        event = decode(value)
        if event.get("op") != control.DDL or event.get("topic") != topic:
            continue
        found.append(
            DdlRecord(
                lsn=int(event["lsn"]),
                seq=int(event["seq"]),
                commit_ts=_timestamp(event.get("commit_ts")),
                command=str(event.get("ddl_command") or ""),
                object_type=str(event.get("ddl_object_type") or ""),
                object_identity=str(event.get("ddl_object_identity") or ""),
                statement=str(event.get("ddl_statement") or ""),
                renamed_to=event.get("ddl_renamed_to"),
                columns=tuple(event.get("ddl_columns") or ()),
            )
        )
    return sorted(found, key=lambda record: record.position)


def spark_column(column: dict[str, Any]) -> tuple[str, DataType]:
    """A column of a DDL event as the lake types it (as `postgres_catalog` does for JSON topics)."""
    base = str(column["base_type"])
    typmod = int(column.get("typmod", -1))
    numeric = numeric_precision_scale(typmod) if base == "numeric" else None
    return str(column["name"]), pg_type(base, numeric, array=bool(column.get("array")))


def new_columns(events: list[DdlRecord], current: set[str]) -> list[tuple[str, DataType]]:
    """The columns the newest non-drop event lists that the mirror lacks, in table order."""
    for record in reversed(events):
        if record.command != DROP_TABLE and record.columns:
            return [spark_column(c) for c in record.columns if c["name"] not in current]
    return []


def apply(
    spark: SparkSession,
    *,
    warehouse: str,
    location: layout.TableLocation,
    mirror_path: str,
    mirror_properties: Mapping[str, str] | None,
    events: list[DdlRecord],
    txn: delta_tables.Txn,
) -> list[str]:
    """Record `events` in the table's DDL log and add the columns they add to the mirror (if it
    exists yet, `mirror_properties` its properties: otherwise its first rows create it with every
    column). Returns the columns added."""
    if not events:
        return []
    _record(spark, log_path(warehouse, location), events, txn)
    if mirror_properties is None:
        return []
    current = {f.name for f in spark.read.format("delta").load(mirror_path).schema.fields}
    wanted = new_columns(events, current)
    if not wanted:
        return []
    added = delta_tables.add_missing_columns(spark, mirror_path, wanted, mirror_properties)
    log.info("%s: columns %s added by DDL at %s/%s", location.topic, added, *events[-1].position)
    return added


def _record(spark: SparkSession, path: str, events: list[DdlRecord], txn: delta_tables.Txn) -> None:
    from pyspark.sql import functions as F
    from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

    schema = StructType(
        [
            StructField(layout.LSN, LongType(), False),
            StructField(layout.SEQ, LongType(), False),
            StructField(layout.COMMIT_TS, TimestampType(), True),
            StructField("command", StringType(), False),
            StructField("object_type", StringType(), False),
            StructField("object_identity", StringType(), False),
            StructField("statement", StringType(), False),
            StructField("renamed_to", StringType(), True),
            StructField("columns", StringType(), False),
        ]
    )
    rows = [
        (e.lsn, e.seq, e.commit_ts, e.command, e.object_type, e.object_identity, e.statement, e.renamed_to,
         json.dumps(list(e.columns)))
        for e in events
    ]  # fmt: skip
    frame = spark.createDataFrame(rows, schema)
    logged = delta_tables.read_table(spark, path)
    if logged is not None:
        # A replay under another checkpoint (another txn id) must not log an event twice either.
        frame = frame.join(logged.select(layout.LSN, layout.SEQ), [layout.LSN, layout.SEQ], "left_anti")
    frame = frame.orderBy(F.col(layout.LSN), F.col(layout.SEQ))
    with delta_tables.idempotent(spark, txn):
        frame.write.format("delta").mode("append").save(path)


def read_log(spark: SparkSession, warehouse: str, location: layout.TableLocation) -> list[dict[str, Any]]:
    """The table's DDL log, oldest first (empty when it has none), for the Dagster asset."""
    logged = delta_tables.read_table(spark, log_path(warehouse, location))
    if logged is None:
        return []
    return [row.asDict() for row in logged.orderBy(layout.LSN, layout.SEQ).collect()]


HISTORY_SHOWN = 10


def history_metadata(spark: SparkSession, warehouse: str, location: layout.TableLocation) -> dict[str, Any]:
    """What the Dagster Delta asset shows of the table's DDL log: how many events, and the newest
    `HISTORY_SHOWN` as `lsn/seq commit-time: statement` lines (DROP TABLE, renames, type changes)."""
    entries = read_log(spark, warehouse, location)
    lines = []
    for entry in entries[-HISTORY_SHOWN:]:
        renamed = f" (renamed to {entry['renamed_to']})" if entry.get("renamed_to") else ""
        at = entry[layout.COMMIT_TS].isoformat() if entry.get(layout.COMMIT_TS) else "?"
        lines.append(f"{entry[layout.LSN]}/{entry[layout.SEQ]} {at}: {entry['statement']}{renamed}")
    return {"ddl_events": len(entries), "ddl_history": "\n".join(lines) or "none"}
