"""Control-topic events (`[prefix.]bottledwater.control`, keyed by table).

- TRUNCATE: `op` = `t`, keyed `<schema>.<table>`; consumers ordering by LSN apply it.
- Re-snapshot reports: `op` = one of `SNAPSHOT_OPS`, keyed `<schema>.<table>#snapshot`, so that
  compaction keeps a table's TRUNCATE beside them.
- DDL (`--capture-ddl`): `op` = `ddl`, keyed `<schema>.<table>#ddl` for the same reason (a compacted
  control topic must not lose a TRUNCATE to a later ALTER TABLE), with the `ddl_*` fields.
- Streamed commit: `op` = `commit`, keyed `#commit#<xid>` (a key of its own per transaction, so
  that compaction keeps every one): a transaction produced before its commit (a large one, streamed
  while it ran, under exactly-once) has changes carrying `bw.op`, `bw.seq` and `bw.xid` but neither
  `bw.lsn` nor `bw.commit_ts`; this event, in the same Kafka transaction as those changes, gives
  its `xid`, commit `lsn` and `commit_ts` (`headers.resolved_headers` puts them into the changes'
  headers as a change published at its commit has them).
- Progress: `op` = `progress`, keyed `#progress` (no table's key has no dot, so none clashes; compaction
  keeps the newest): `lsn` is the highest commit LSN of which every transaction is in Kafka (every
  transaction committed at or before it was acknowledged by Kafka before the event was made), and
  `progress_offsets` lists, for every partition of the worker's topics and of the control topic, an
  offset that every message of those transactions lies below. `commit_ts` is when the worker took
  the offsets (its clock). What the merge makes of it: spark_jobs/rules/watermark.py, docs/lakehouse.md.

Values are Avro records (Confluent-framed, the control value schema) or JSON objects with the same
fields. `ControlDecoder` reads either back into a dict, taking the writer schema by id from a
callable, so this module needs no registry client.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from kafka_contract.framing import parse_frame
from kafka_contract.headers import OP_TRUNCATE

TRUNCATE = OP_TRUNCATE
SNAPSHOT_PROGRESS = "snapshot_progress"
SNAPSHOT_DONE = "snapshot_done"
SNAPSHOT_FAILED = "snapshot_failed"
SNAPSHOT_OPS = frozenset({SNAPSHOT_PROGRESS, SNAPSHOT_DONE, SNAPSHOT_FAILED})
SNAPSHOT_KEY_SUFFIX = "#snapshot"
DDL = "ddl"
DDL_KEY_SUFFIX = "#ddl"
PROGRESS = "progress"
PROGRESS_KEY = "#progress"
STREAMED_COMMIT = "commit"
COMMIT_KEY_PREFIX = "#commit#"

# A writer schema by its registered id, as JSON text or an already parsed object.
SchemaById = Callable[[int], Any]


def table_key(qualified_name: str) -> str:
    """The control key of a table's TRUNCATE events."""
    return qualified_name


def snapshot_key(qualified_name: str) -> str:
    """The control key of a table's re-snapshot reports."""
    return qualified_name + SNAPSHOT_KEY_SUFFIX


def ddl_key(qualified_name: str) -> str:
    """The control key of a table's DDL events."""
    return qualified_name + DDL_KEY_SUFFIX


def commit_key(xid: int) -> str:
    """The control key of a streamed transaction's commit event."""
    return f"{COMMIT_KEY_PREFIX}{xid}"


def commit_record(xid: int, lsn: int, commit_ts: datetime) -> dict[str, Any]:
    """A streamed transaction's commit event's fields (the control record's others neutral)."""
    return {
        "op": STREAMED_COMMIT, "schema": "", "table": "", "topic": "", "lsn": lsn, "seq": 0, "xid": xid,
        "commit_ts": commit_ts, "cascade": False, "restart_identity": False,
    }  # fmt: skip


def progress_record(lsn: int, at: datetime, offsets: Mapping[tuple[str, int], int]) -> dict[str, Any]:
    """A progress event's fields (the control record's other fields hold neutral values)."""
    return {
        "op": PROGRESS, "schema": "", "table": "", "topic": "", "lsn": lsn, "seq": 0, "xid": 0,
        "commit_ts": at, "cascade": False, "restart_identity": False,
        "progress_offsets": [
            {"topic": topic, "partition": partition, "offset": offset}
            for (topic, partition), offset in sorted(offsets.items())
        ],
    }  # fmt: skip


def progress_offsets(record: Mapping[str, Any]) -> dict[tuple[str, int], int]:
    """A decoded progress event's offset bounds, by (topic, partition)."""
    return {
        (str(o["topic"]), int(o["partition"])): int(o["offset"]) for o in record.get("progress_offsets") or ()
    }


class ControlDecoder:
    """A control value -> its record as a dict (Avro timestamps as datetimes, JSON as text)."""

    def __init__(self, message_format: str, schema_by_id: SchemaById | None = None) -> None:
        if message_format not in ("avro", "json"):
            raise ValueError(f"unknown message format {message_format!r}: avro or json")
        if message_format == "avro" and schema_by_id is None:
            raise ValueError("decoding Avro control events needs the writer schemas by id")
        self.message_format = message_format
        self._schema_by_id = schema_by_id
        self._parsed: dict[int, Any] = {}

    def __call__(self, value: bytes) -> dict[str, Any]:
        if self.message_format == "json":
            record = json.loads(value)
        else:
            import fastavro  # only the Avro path needs it

            schema_id, offset = parse_frame(value)
            schema = self._parsed.get(schema_id)
            if schema is None:
                assert self._schema_by_id is not None
                raw = self._schema_by_id(schema_id)
                schema = fastavro.parse_schema(json.loads(raw) if isinstance(raw, str) else raw)
                self._parsed[schema_id] = schema
            record = fastavro.schemaless_reader(io.BytesIO(value[offset:]), schema, None)
        return record if isinstance(record, dict) else {}
