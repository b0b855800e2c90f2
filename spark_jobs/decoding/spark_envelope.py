"""A Kafka record's envelope read with Spark's own expressions: the bottledwater headers that carry
the change's position and operation, the partition and offset, and the 5-byte Confluent frame
(magic byte and schema id) cut off an Avro key or value.

Split from `spark_decode`, which decodes what the frame holds; `spark_values` converts the values
to the lake's conventions.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

from pyspark.sql.types import ArrayType, IntegerType, LongType, StringType, StructField, TimestampType

from kafka_contract.framing import CONFLUENT_MAGIC
from kafka_contract.headers import (
    HEADER_COMMIT_TS,
    HEADER_LSN,
    HEADER_OP,
    HEADER_SEQ,
    HEADER_UNCHANGED,
    OP_DELETE,
)
from spark_jobs.rules import layout
from spark_jobs.rules.names import string

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

T = TypeVar("T")
FRAME_BYTES = 5
# Kept on the decoded rows because an unkeyed table's snapshot rows are told apart by their Kafka
# position (`slice_decoding._unkeyed_seq`); the merge drops them right after.
PARTITION = "_bw_partition"
OFFSET = "_bw_offset"
# Shared with the reference decoder (tests/reference), so that both decode into the same row.
META_FIELDS = [
    StructField(layout.LSN, LongType(), False),
    StructField(layout.SEQ, LongType(), False),
    StructField(layout.OP, StringType(), False),
    StructField(layout.COMMIT_TS, TimestampType(), True),
    StructField(layout.UNCHANGED, ArrayType(StringType(), False), True),
    StructField(PARTITION, IntegerType(), False),
    StructField(OFFSET, LongType(), False),
]


# --- expressions built once per JVM ---------------------------------------------------------------


def once_per_jvm(build: Callable[[], T]) -> Callable[[], T]:
    """`build` run once per JVM, its Columns then shared by every table's plan.

    A Column is an unresolved expression, immutable in the JVM: each plan that uses it resolves its
    own copy, so the envelope's expressions built for one table serve every table. Building them is a
    round trip to the JVM per function, literal and operator (and one more when Python releases it):
    nearly a third of the calls that built a table's frame in a consistent read (and each table's
    decoding in the merge) went to building the same envelope again (docs/lakehouse.md, "Many tables").
    Built anew when PySpark has launched another gateway (the previous JVM's objects are gone)."""
    built: list[tuple[object, T]] = []

    @functools.wraps(build)
    def shared() -> T:
        from pyspark import SparkContext

        gateway = SparkContext._gateway
        if built and built[0][0] is gateway:
            return built[0][1]
        value = build()
        built[:] = [(gateway, value)]
        return value

    return shared


# --- record metadata: headers, partition, offset ------------------------------------------------


def fail(where: Column, text: str) -> Column:
    from pyspark.sql import functions as F

    return F.raise_error(F.concat(where, F.lit(f": {text}")))


# The record's description in errors: `topic <t> partition <p> offset <o>`.
_RECORD_AT = "concat_ws(' ', 'topic', topic, 'partition', partition, 'offset', offset)"


def _fail_sql(text: str) -> str:
    """An error naming the record (`_RECORD_AT`): `<record>: <text>`."""
    return f"raise_error(concat({_RECORD_AT}, {string(': ' + text)}))"


HEADERS = "_bw_headers"
# The record's headers as one map, built once per record (the metadata reads it five times). A
# repeated header keeps its last value, as a dict of them does: the session's
# `spark.sql.mapKeyDedupPolicy` is LAST_WIN (shared_connections.spark_session).
HEADERS_MAP = "map_from_entries(headers)"
HEADERS_MAP_SQL = f"{HEADERS_MAP} AS {HEADERS}"
# Where every message of the worker carries its first three headers (1-based, as `try_element_at`
# counts them): the changes, snapshot rows, TRUNCATEs, DDL and progress events all start with
# `bw.op`, `bw.lsn` (then `bw.seq`). Read there when the name matches, they cost no map: building
# the map for them was about 0.9 s of a million records' changelog append.
WORKER_HEADER_POSITIONS = {HEADER_OP: 1, HEADER_LSN: 2, HEADER_SEQ: 3}


@once_per_jvm
def headers_map() -> Column:
    """`HEADERS_MAP_SQL` as a Column."""
    from pyspark.sql import functions as F

    return F.expr(HEADERS_MAP_SQL)


def header_sql(name: str, headers_map: str = HEADERS) -> str:
    """The header's text, null when absent, as Spark SQL text: the header at the worker's position
    (`WORKER_HEADER_POSITIONS`) when it has this name, else the one of this name in `headers_map`
    (the records' `HEADERS` column, or `HEADERS_MAP` to build it only for the records that need
    it). So a header repeated after its position is read at its position, by every reader alike."""
    by_name = f"CAST(try_element_at({headers_map}, {string(name)}) AS STRING)"
    position = WORKER_HEADER_POSITIONS.get(name)
    if position is None:
        return by_name
    at = f"try_element_at(headers, {position})"
    return f"CASE WHEN {at}.key = {string(name)} THEN CAST({at}.value AS STRING) ELSE {by_name} END"


def header(name: str, headers_map: str = HEADERS) -> Column:
    """`header_sql` as a Column."""
    from pyspark.sql import functions as F

    return F.expr(header_sql(name, headers_map))


def _required_sql(name: str) -> str:
    """The header's text; an error naming the record (`_RECORD_AT`) when it is absent."""
    missing = _fail_sql(f"message without the {name} header: not written by bottledwater")
    return f"CASE WHEN {header_sql(name)} IS NULL THEN {missing} ELSE {header_sql(name)} END"


# The change's position and operation from the headers, the record's partition and offset (the
# `META_FIELDS`, in order), each failing with the record's description when a header is missing; as
# Spark SQL text, so that a table's whole decoding can be one statement (`spark_decode`).
META_SQL = (
    f"CAST({_required_sql(HEADER_LSN)} AS BIGINT) AS {layout.LSN}",
    f"CAST({_required_sql(HEADER_SEQ)} AS BIGINT) AS {layout.SEQ}",
    f"CASE WHEN key IS NULL AND value IS NULL THEN {_fail_sql('a message with neither key nor value')}"
    f" WHEN value IS NULL THEN {string(OP_DELETE)} ELSE {_required_sql(HEADER_OP)} END AS {layout.OP}",
    f"CAST({_required_sql(HEADER_COMMIT_TS)} AS TIMESTAMP) AS {layout.COMMIT_TS}",
    f"CASE WHEN {header_sql(HEADER_UNCHANGED)} != '' THEN split({header_sql(HEADER_UNCHANGED)}, ',') END"
    f" AS {layout.UNCHANGED}",
    f"`partition` AS {PARTITION}",
    f"`offset` AS {OFFSET}",
)


def with_metadata(records: DataFrame) -> DataFrame:
    """The records with their metadata columns (`META_FIELDS`, read from the headers: `META_SQL`), as
    `spark_decode.AvroDecoding.sql` reads them."""
    return records.selectExpr("*", HEADERS_MAP_SQL).selectExpr("*", *META_SQL).drop(HEADERS)


@once_per_jvm
def meta_columns() -> tuple[Column, ...]:
    """`META_SQL` as Columns, over the records with their `headers_map`."""
    from pyspark.sql import functions as F

    return tuple(F.expr(text) for text in META_SQL)


@once_per_jvm
def meta_field_columns() -> tuple[Column, ...]:
    """The decoded row's metadata columns by name (`META_FIELDS`), as the decoders select them last."""
    from pyspark.sql import functions as F

    return tuple(F.col(f.name) for f in META_FIELDS)


def frame_id_sql(part: str) -> str:
    """The frame's 4 schema id bytes, compared as bytes (converting them to an int per record cost
    about 9 % of decoding and appending a batch)."""
    return f"substring({part}, 2, 4)"


def frame_id_literal(schema_id: int) -> str:
    """The schema id's 4 frame bytes as a Spark SQL binary literal."""
    return f"X'{schema_id.to_bytes(4, 'big').hex()}'"


def frame_check_sql(part: str, schema_ids: Sequence[int]) -> str:
    """Null, or the error of a framed message this batch cannot decode (naming it, `_RECORD_AT`),
    as Spark SQL text: one JVM call per table's plan where the Columns cost one per operator."""
    magic = f"X'{CONFLUENT_MAGIC:02x}'"
    bad_magic = f"substring({part}, 1, 1) != {magic}"
    malformed = f"{part} IS NOT NULL AND ({bad_magic} OR length({part}) < {FRAME_BYTES})"
    ids = ", ".join(frame_id_literal(i) for i in schema_ids)
    unknown = f"NOT ({frame_id_sql(part)} IN ({ids}))" if schema_ids else "true"
    return (
        f"CASE WHEN {malformed} THEN {_fail_sql(f'{part} is not a Confluent-framed Avro message')}"
        f" WHEN {part} IS NOT NULL AND {unknown}"
        f" THEN {_fail_sql(f'{part} schema id not fetched for this batch')} END"
    )
