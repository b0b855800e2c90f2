"""Where each table's Delta data, history, tombstones and checkpoint live, and its extra columns.

`<warehouse>/<schema>/<table>` uses the Bottled Water safe names of the topic (`[prefix.][schema.]table`,
schema `public` when the topic has one part), so a Postgres name with a `/` or `..` in it can never
escape the warehouse, and the layout is the same for Avro and JSON topics (JSON carries no table name).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from kafka_contract.topics import DEFAULT_SCHEMA, control_topic_name

# Columns the merge adds to every table (docs/lakehouse.md, "Table layout").
LSN = "_bw_lsn"
SEQ = "_bw_seq"
OP = "_bw_op"
COMMIT_TS = "_bw_commit_ts"
META_COLUMNS = (LSN, SEQ, OP, COMMIT_TS)
# Only inside a merge batch: the unchanged TOAST columns of an event (never stored).
UNCHANGED = "_bw_unchanged"

# Delta table properties the merge writes and the other jobs read.
KEY_PROPERTY = "bottledwater.key"  # JSON list of the key columns, in key order
SOURCE_PROPERTY = "bottledwater.source"  # the Postgres table, schema.table
TOPIC_PROPERTY = "bottledwater.topic"
# "<lsn>/<seq>" of the newest TRUNCATE applied: events older than it are stale wherever they come from.
TRUNCATED_BEFORE_PROPERTY = "bottledwater.truncatedBefore"

HISTORY_SUFFIX = "__history"
STATE_DIR = "_bw_state"
# The marks of tables a merge batch had nothing of (docs/lakehouse.md, "Idle tables").
IDLE_MARKS_DIR = "_merge/idle_marks"


# The newest proofs of unchanged marks of each merge query (docs/lakehouse.md, "An idle source").
PROOFS_DIR = "_merge/proofs"
# Every record of every batch, one commit per batch (docs/lakehouse.md, "The changelog").
CHANGELOG_DIR = "changelog"


def changelog_path(warehouse: str) -> str:
    return f"{warehouse.rstrip('/')}/{STATE_DIR}/{CHANGELOG_DIR}"


def idle_marks_path(warehouse: str) -> str:
    return f"{warehouse.rstrip('/')}/{STATE_DIR}/{IDLE_MARKS_DIR}"


def proofs_path(warehouse: str) -> str:
    return f"{warehouse.rstrip('/')}/{STATE_DIR}/{PROOFS_DIR}"


def proof_file_name(query_id: str, batch_id: int) -> str:
    """`<query id>.<batch id>.json`: the newest of a query's files is its newest proof."""
    return f"{query_id}.{batch_id:020d}.json"


def is_proof_file(name: str) -> bool:
    """A whole proof file (not a hidden one being written, nor a file system's checksum)."""
    return name.endswith(".json") and not name.startswith(".")


@dataclass(frozen=True)
class TableLocation:
    """One source table as the lakehouse sees it: its topic and its safe schema and table names."""

    topic: str
    schema: str
    table: str

    def path(self, warehouse: str) -> str:
        return f"{warehouse.rstrip('/')}/{self.schema}/{self.table}"

    def history_path(self, warehouse: str) -> str:
        """The optional SCD type 2 table, next to the mirror."""
        return self.path(warehouse) + HISTORY_SUFFIX

    def tombstones_path(self, warehouse: str) -> str:
        """Keys deleted recently, with the delete's position: a stale insert must not resurrect them."""
        return f"{warehouse.rstrip('/')}/{STATE_DIR}/{self.schema}/{self.table}/tombstones"

    def checkpoint(self, checkpoint_root: str) -> str:
        return f"{checkpoint_root.rstrip('/')}/{self.schema}/{self.table}"

    @property
    def qualified_safe_name(self) -> str:
        return f"{self.schema}.{self.table}"


def location_for_topic(topic: str, prefix: str | None = None) -> TableLocation:
    """The table behind `topic`, given the worker's `--topic-prefix`."""
    rest = topic
    if prefix:
        if not topic.startswith(prefix + "."):
            raise ValueError(f"topic {topic!r} does not start with the topic prefix {prefix!r}.")
        rest = topic[len(prefix) + 1 :]
    parts = rest.split(".")
    if len(parts) == 1:
        return TableLocation(topic, DEFAULT_SCHEMA, parts[0])
    if len(parts) == 2 and all(parts):
        return TableLocation(topic, parts[0], parts[1])
    raise ValueError(
        f"topic {topic!r} is not [prefix.][schema.]table"
        + (f" under prefix {prefix!r}" if prefix else "")
        + ": pass the worker's --topic-prefix"
    )


def is_table_topic(topic: str, prefix: str | None = None) -> bool:
    """A table topic's name (`[prefix.][schema.]table`)."""
    try:
        location_for_topic(topic, prefix)
    except ValueError:
        return False
    return True


def is_control_topic(topic: str, prefix: str | None = None) -> bool:
    return topic == control_topic_name(prefix)


def encode_key_columns(columns: tuple[str, ...]) -> str:
    return json.dumps(list(columns))


def decode_key_columns(text: str | None) -> tuple[str, ...]:
    if not text:
        return ()
    return tuple(json.loads(text))


def format_position(lsn: int, seq: int) -> str:
    return f"{lsn}/{seq}"


def parse_position(text: str | None) -> tuple[int, int] | None:
    if not text:
        return None
    lsn, _, seq = text.partition("/")
    return int(lsn), int(seq or 0)
