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
    from pyspark.sql import Column

T = TypeVar("T")
FRAME_BYTES = 5
# Kept on the decoded rows because an unkeyed table's snapshot rows are told apart by their Kafka
# position (`merge_batch._unkeyed_seq`); the merge drops them right after.
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
    decoding in the merge) went to building the same envelope again (docs/lakehouse.md).
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


_RECORD_AT = "concat_ws(' ', 'topic', topic, 'partition', partition, 'offset', offset)"


@once_per_jvm
def record_at() -> Column:
    """The record's description in errors: `topic <t> partition <p> offset <o>`."""
    from pyspark.sql import functions as F

    return F.expr(_RECORD_AT)


HEADERS = "_bw_headers"


@once_per_jvm
def headers_map() -> Column:
    """The record's headers as one map, built once per record (`meta_columns` reads it five times).
    A repeated header keeps its last value, as a dict of them does: the session's
    `spark.sql.mapKeyDedupPolicy` is LAST_WIN (spark_jobs.connections.session)."""
    from pyspark.sql import functions as F

    return F.map_from_entries(F.col("headers")).alias(HEADERS)


def header(name: str) -> Column:
    """The header's text; null when absent."""
    from pyspark.sql import functions as F

    return F.try_element_at(F.col(HEADERS), F.lit(name)).cast("string")


def required(name: str, at: Column) -> Column:
    """The header's text; an error naming the record (`at`, `record_at`) when it is absent."""
    from pyspark.sql import functions as F

    value = header(name)
    missing = fail(at, f"message without the {name} header: not written by bottledwater")
    return F.when(value.isNull(), missing).otherwise(value)


@once_per_jvm
def meta_columns() -> tuple[Column, ...]:
    """The change's position and operation from the headers, the record's partition and offset (the
    `META_FIELDS`), each failing with the record's description (`record_at`) when a header is
    missing."""
    from pyspark.sql import functions as F

    at = record_at()
    unchanged = header(HEADER_UNCHANGED)
    neither = fail(at, "a message with neither key nor value")
    op = (
        F.when(F.col("key").isNull() & F.col("value").isNull(), neither)
        .when(F.col("value").isNull(), F.lit(OP_DELETE))
        .otherwise(required(HEADER_OP, at))
    )
    return (
        required(HEADER_LSN, at).cast("long").alias(layout.LSN),
        required(HEADER_SEQ, at).cast("long").alias(layout.SEQ),
        op.alias(layout.OP),
        required(HEADER_COMMIT_TS, at).cast("timestamp").alias(layout.COMMIT_TS),
        F.when(unchanged != F.lit(""), F.split(unchanged, ",")).alias(layout.UNCHANGED),
        F.col("partition").alias(PARTITION),
        F.col("offset").alias(OFFSET),
    )


@once_per_jvm
def meta_field_columns() -> tuple[Column, ...]:
    """The decoded row's metadata columns by name (`META_FIELDS`), as the decoders select them last."""
    from pyspark.sql import functions as F

    return tuple(F.col(f.name) for f in META_FIELDS)


def frame_id_sql(part: str) -> str:
    """The frame's 4 schema id bytes, compared as bytes (converting them to an int per record cost
    about 9 % of decoding and appending a batch, docs/benchmarks-history.md)."""
    return f"substring({part}, 2, 4)"


def frame_id_literal(schema_id: int) -> str:
    """The schema id's 4 frame bytes as a Spark SQL binary literal."""
    return f"X'{schema_id.to_bytes(4, 'big').hex()}'"


def frame_check_sql(part: str, schema_ids: Sequence[int]) -> str:
    """Null, or the error of a framed message this batch cannot decode (naming it, as `record_at`),
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


def _fail_sql(text: str) -> str:
    """`fail(record_at(), text)` as Spark SQL text."""
    return f"raise_error(concat({_RECORD_AT}, {string(': ' + text)}))"
