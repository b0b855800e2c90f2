"""A table batch's columns and how its records decode: from the writer schemas for Avro; for JSON,
which carries no types, from the lake's own table, the Postgres catalog and a sample of the batch."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

from spark_jobs.connections import postgres_catalog
from spark_jobs.connections.registry import WriterSchemas
from spark_jobs.decoding import spark_decode
from spark_jobs.decoding.spark_types import infer_json_type, record_columns
from spark_jobs.lake import delta_tables
from spark_jobs.merging import batch_schema
from spark_jobs.rules import layout

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.types import DataType

log = logging.getLogger(__name__)
# Messages read to infer the type of a JSON column the lake and the catalog do not know.
JSON_SAMPLE_SIZE = 200


class DecodeRecords(Protocol):
    """The table's records (no control records) -> typed rows; `positions=True` keeps each record's
    Kafka partition and offset (`spark_decode`)."""

    def __call__(self, rows: DataFrame, *, positions: bool) -> DataFrame: ...


class DecodingSql(Protocol):
    """`DecodeRecords` as one Spark SQL SELECT over the relation `records` (a quoted view name or a
    parenthesized query) whose rows carry their metadata columns (`spark_envelope.with_metadata`);
    None when the decoding has a part that is not text."""

    def __call__(self, records: str, *, positions: bool) -> str | None: ...


@dataclass(frozen=True)
class Decoder:
    """How a table's slice of a batch decodes, and what it decodes into; `sql`, the decoding as
    text, where the format has it (Avro)."""

    keys: tuple[str, ...]
    columns: list[tuple[str, DataType]]
    decode: DecodeRecords
    source_name: str
    sql: DecodingSql | None = None


def avro_decoder(
    schemas: WriterSchemas, summary: batch_schema.BatchSummary, properties: dict[str, str], fallback_name: str
) -> Decoder:
    """The columns of the batch's writer schemas, keys first; the source table's name from them
    (`fallback_name` when they do not say)."""
    key_schemas = schemas.get_many(summary.key_schema_ids)
    value_schemas = schemas.get_many(summary.value_schema_ids)
    key_columns: dict[str, DataType] = {}
    for schema in key_schemas.values():
        key_columns.update({c.name: c.data_type for c in record_columns(schema)})
    # A batch of TRUNCATEs only has no key schema: the table's own key then.
    keys = tuple(key_columns) or layout.decode_key_columns(properties.get(layout.KEY_PROPERTY))
    ordered: dict[str, DataType] = dict(key_columns)
    source_name = ""
    for schema_id in sorted(value_schemas):
        schema = value_schemas[schema_id]
        source_name = schema.get("pg.table", source_name)
        for spec in record_columns(schema):
            ordered.setdefault(spec.name, spec.data_type)
    columns = list(ordered.items())
    decode = partial(
        spark_decode.decode_avro, key_schemas=key_schemas, value_schemas=value_schemas, columns=columns
    )

    def sql(records: str, *, positions: bool) -> str | None:
        return spark_decode.avro_decoding(key_schemas, value_schemas, columns, positions=positions).sql(
            records
        )

    return Decoder(keys, columns, decode, source_name or fallback_name, sql)


def json_columns(
    batch: DataFrame,
    summary: batch_schema.BatchSummary,
    properties: dict[str, str],
    *,
    path: str,
    postgres: str | None,
    location: layout.TableLocation,
    control_topic: str,
) -> tuple[tuple[str, ...], list[tuple[str, DataType]]]:
    """JSON carries no types: the lake's own column types first (unless the catalog's is a
    widening of it), then the Postgres catalog's, then a type inferred from a sample value (a
    number -> bigint/double, else string)."""
    spark = batch.sparkSession
    known: dict[str, DataType] = {}
    if properties:
        known = {f.name: f.dataType for f in spark.read.format("delta").load(path).schema.fields}
    catalog: dict[str, DataType] = {}
    if postgres:
        try:
            catalog = postgres_catalog.spark_columns(postgres, location.schema, location.table)
        except postgres_catalog.TableNotFoundError:
            # Dropped or renamed since these messages were written: the lake's and inferred types.
            log.warning("%s: not in the Postgres catalog; JSON columns typed from the lake or inferred",
                        location.qualified_safe_name)  # fmt: skip
    keys = layout.decode_key_columns(properties.get(layout.KEY_PROPERTY)) or tuple(summary.json_key_fields)
    names = list(dict.fromkeys([*keys, *summary.json_value_fields]))
    unknown = [n for n in names if n not in known and n not in catalog]
    samples = json_samples(batch, unknown, control_topic) if unknown else {}
    columns = []
    for n in names:
        lake, source = known.get(n), catalog.get(n)
        if lake is not None and source is not None and lake != source and delta_tables.fits(lake, source):
            lake = None  # the source column was widened (int -> bigint ...): the lake follows
        columns.append((n, lake or source or infer_json_type(samples.get(n, []))))
    return keys, columns


def json_samples(batch: DataFrame, names: list[str], control_topic: str) -> dict[str, list[Any]]:
    """The non-null values of each column among the first messages of the batch."""
    from pyspark.sql import functions as F

    rows = (
        batch.where((F.col("topic") != F.lit(control_topic)) & F.col("value").isNotNull())
        .select(F.col("value").cast("string").alias("json"))
        .limit(JSON_SAMPLE_SIZE)
        .collect()
    )
    samples: dict[str, list[Any]] = {name: [] for name in names}
    for row in rows:
        obj = json.loads(row["json"])
        if isinstance(obj, dict):
            for name in names:
                if obj.get(name) is not None:
                    samples[name].append(obj[name])
    return samples
