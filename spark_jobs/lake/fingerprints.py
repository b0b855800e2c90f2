"""Row fingerprints of a Delta table (in Spark) and of its Postgres source (streamed), comparable.

`rowhash` defines the canonical form and the hash; this module applies it to both sides over the
same columns and the same key range, whole-table (count + checksum) or per key (for `verify`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from spark_jobs.connections import postgres_catalog, postgres_rows
from spark_jobs.rules import layout
from spark_jobs.rules.names import quote
from spark_jobs.rules.rowhash import MOD, Fingerprint, RowHasher, key_text

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import DataType

KeyRange = tuple[str, Any, Any]  # (key column, low, high), inclusive, None ends open
_SIGNED = 2**63


@dataclass(frozen=True)
class Comparable:
    """The columns both sides have, in one order, with the Delta side's types."""

    columns: list[str]
    types: list[DataType]
    pg_columns: list[postgres_catalog.PgColumn]
    keys: tuple[str, ...]
    schema: str
    table: str


def comparable(spark: SparkSession, path: str, dsn: str) -> Comparable:
    from spark_jobs.lake import delta_tables

    properties = delta_tables.table_properties(spark, path)
    schema, table = postgres_catalog.split_qualified(properties.get(layout.SOURCE_PROPERTY, ""))
    pg = {c.name: c for c in postgres_catalog.table_columns(dsn, schema, table)}
    delta = spark.read.format("delta").load(path)
    fields = [f for f in delta.schema.fields if f.name in pg and f.name not in layout.META_COLUMNS]
    keys = layout.decode_key_columns(properties.get(layout.KEY_PROPERTY))
    return Comparable(
        [f.name for f in fields],
        [f.dataType for f in fields],
        [pg[f.name] for f in fields],
        keys,
        schema,
        table,
    )


def delta_rows(spark: SparkSession, path: str, spec: Comparable, key_range: KeyRange | None) -> DataFrame:
    from pyspark.sql import functions as F

    frame = spark.read.format("delta").load(path).select(*[F.col(quote(c)) for c in spec.columns])
    if key_range is not None:
        name, low, high = key_range
        if low is not None:
            frame = frame.where(F.col(quote(name)) >= F.lit(low))
        if high is not None:
            frame = frame.where(F.col(quote(name)) <= F.lit(high))
    return frame


def delta_fingerprint(
    spark: SparkSession, path: str, spec: Comparable, key_range: KeyRange | None = None
) -> Fingerprint:
    hasher = RowHasher(spec.types)

    def per_partition(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa

        total = Fingerprint()
        for batch in batches:
            for row in zip(*[c.to_pylist() for c in batch.columns], strict=True):
                total.add(hasher.hash(row))
        yield pa.RecordBatch.from_pydict({"n": [total.count], "checksum": [str(total.checksum)]})

    result = Fingerprint()
    for row in (
        delta_rows(spark, path, spec, key_range)
        .mapInArrow(per_partition, "n long, checksum string")
        .collect()
    ):
        result = result.merge(Fingerprint(row["n"], int(row["checksum"])))
    return result


def postgres_fingerprint(dsn: str, spec: Comparable, key_range: KeyRange | None = None) -> Fingerprint:
    hasher = RowHasher(spec.types)
    total = Fingerprint()
    for row in postgres_rows.fetch_rows(dsn, spec.schema, spec.table, spec.pg_columns, key_range):
        total.add(hasher.hash(row))
    return total


def delta_key_hashes(spark: SparkSession, path: str, spec: Comparable) -> DataFrame:
    """(k: the key as text, h: the row's hash) for every Delta row."""
    return frame_key_hashes(delta_rows(spark, path, spec, None), spec)


def frame_key_hashes(frame: DataFrame, spec: Comparable) -> DataFrame:
    """(k: the key as text, h: the row's hash) for every row of `frame`, a read of the mirror's
    `spec.columns` in that order (the mirror itself, or a consistent read of it)."""
    hasher = RowHasher(spec.types)
    key_positions = [spec.columns.index(k) for k in spec.keys]
    keys = spec.keys

    def per_row(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa

        for batch in batches:
            rows = list(zip(*[c.to_pylist() for c in batch.columns], strict=True))
            yield pa.RecordBatch.from_pydict(
                {
                    "k": [key_text(keys, [r[i] for i in key_positions]) for r in rows],
                    "h": [signed(hasher.hash(r)) for r in rows],
                }
            )

    return frame.mapInArrow(per_row, "k string, h long")


def postgres_key_hashes(spark: SparkSession, dsn: str, spec: Comparable) -> DataFrame:
    hasher = RowHasher(spec.types)
    key_positions = [spec.columns.index(k) for k in spec.keys]
    pairs = [
        (key_text(spec.keys, [row[i] for i in key_positions]), signed(hasher.hash(row)))
        for row in postgres_rows.fetch_rows(dsn, spec.schema, spec.table, spec.pg_columns)
    ]
    return spark.createDataFrame(pairs, "k string, h long")


def signed(value: int) -> int:
    """A 64-bit row hash as Spark's signed long."""
    return value - MOD if value >= _SIGNED else value


def key_columns_present(spec: Comparable) -> bool:
    return bool(spec.keys) and all(k in spec.columns for k in spec.keys)


__all__ = ["Comparable", "KeyRange", "comparable", "delta_fingerprint", "postgres_fingerprint"]
