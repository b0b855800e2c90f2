"""Decoding with Spark's built-in expressions (`spark_decode`: from_avro, from_json) equals the
Python reference decoder (`decoders`, fastavro in mapInArrow) on every type of the catalog, for
Avro and JSON.

The messages are the worker's own: every catalog table's rows read through a real pgoutput slot and
encoded by the worker's serializers (Avro schemas registered with the stack's registry), plus a
tombstone and an update carrying `bw.unchanged`, and a table of what the catalog lacks (decimals
wider than Spark's 38 digits, arrays of dates, times and timestamps with their infinities). Avro's
decoding as one SQL statement (a consistent read's) is held to the same reference.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient

from cdc_worker.core.encoding.avro_serializer import AvroEventSerializer
from cdc_worker.core.encoding.json_serializer import JsonEventSerializer
from cdc_worker.core.encoding.serializers import EncodedMessage
from cdc_worker.core.model import ChangeEvent
from kafka_contract.headers import HEADER_OP, HEADER_UNCHANGED, OP_DELETE
from spark_jobs.connections import postgres_catalog
from spark_jobs.connections.registry import WriterSchemas
from spark_jobs.decoding import spark_decode, spark_envelope
from spark_jobs.decoding.spark_types import record_columns
from tests.integration.conftest import unique_name
from tests.integration.test_type_catalog import catalog_slot, load_type_infos, pgoutput_events
from tests.integration.type_catalog import CATALOG, CatalogTable, N, col
from tests.reference import decoders

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import DataType

pytestmark = pytest.mark.integration

WIDE = CatalogTable("wide_and_nested", (
    col("n50", "numeric(50,2)", "-123456789012345678901234567890123456789012.34", "0", "0.5", "-0.01",
        "99999999999999999999999999999999999999999999999.99", "-1", N),
    col("n45", "numeric(45)", "-1", "340282366920938463463374607431768211456", "127", "-128", "0", "256", N),
    col("ad", "date[]", "'{infinity,-infinity,2024-02-29,NULL}'", "'{}'", N, N, N, N, N),
    col("at", "time[]", "'{24:00:00,00:00:00.000001,NULL}'", "'{}'", N, N, N, N, N),
    col("ats", "timestamp[]", "'{infinity,-infinity,\"2024-01-02 03:04:05.5\"}'", N, N, N, N, N, N),
    col("aiv", "interval[]", "ARRAY['1 day'::interval, '-2 mons 3 s', NULL]", N, N, N, N, N, N),
))  # fmt: skip
KAFKA_ROWS = (
    "topic string, partition int, offset long, key binary, value binary, "
    "headers array<struct<key:string,value:binary>>"
)


def kafka_rows(spark: SparkSession, messages: list[EncodedMessage]) -> DataFrame:
    """The messages as the Kafka source's rows, alternating between two partitions."""
    rows = [
        (m.topic, i % 2, i, m.key, m.value, [(k, v) for k, v in m.headers]) for i, m in enumerate(messages)
    ]
    return spark.createDataFrame(rows, KAFKA_ROWS)


def with_delete_and_unchanged(messages: list[EncodedMessage]) -> list[EncodedMessage]:
    first, second = messages[0], messages[-1]
    delete_headers = [(k, OP_DELETE.encode() if k == HEADER_OP else v) for k, v in first.headers]
    tombstone = EncodedMessage(first.topic, first.key, None, delete_headers)
    unchanged = EncodedMessage(
        second.topic, second.key, second.value, [*second.headers, (HEADER_UNCHANGED, b"x,y")]
    )
    return [*messages, tombstone, unchanged]


def avro_columns(
    schemas: WriterSchemas, messages: list[EncodedMessage]
) -> tuple[dict[int, Any], dict[int, Any], list[tuple[str, DataType]]]:
    """As `TableMerger` types an Avro batch: key columns first, then the value schema's."""
    key_ids = {int.from_bytes(m.key[1:5], "big") for m in messages if m.key}
    value_ids = {int.from_bytes(m.value[1:5], "big") for m in messages if m.value}
    keys, values = schemas.get_many(key_ids), schemas.get_many(value_ids)
    ordered: dict[str, DataType] = {}
    for schema in [*keys.values(), *values.values()]:
        for spec in record_columns(schema):
            ordered.setdefault(spec.name, spec.data_type)
    return keys, values, list(ordered.items())


# Where the reference is wrong and Spark's decoding right: a JSON number in a json column went
# through a Python float (12345678901234567890.123 -> 1.2345678901234567e+19); Spark keeps its text.
REFERENCE_ROUNDED = {"1.2345678901234567e+19": "12345678901234567890.123"}


def rows_of(frame: DataFrame) -> list[dict[str, Any]]:
    """Each row as Spark writes it to JSON (timestamps as UTC text, NaN spelt out, binary as base64):
    Python's datetime cannot hold the ends of Spark's range the ±infinity sentinels are clamped to."""
    from pyspark.sql import functions as F

    ordered = frame.orderBy(spark_envelope.OFFSET).select(F.to_json(F.struct("*")).alias("row"))
    return [json.loads(r["row"]) for r in ordered.collect()]


def assert_same(reference: DataFrame, native: DataFrame, where: str) -> None:
    def shape(frame: DataFrame) -> list[tuple[str, str]]:
        return [(f.name, f.dataType.simpleString()) for f in frame.schema]

    assert shape(native) == shape(reference), where
    expected, actual = rows_of(reference), rows_of(native)
    expected = [
        {k: REFERENCE_ROUNDED.get(v, v) if isinstance(v, str) else v for k, v in r.items()} for r in expected
    ]
    assert len(actual) == len(expected), where
    for want, got in zip(expected, actual, strict=True):
        assert got == want, f"{where} offset {want[spark_envelope.OFFSET]}"


def without_uuid_logical_type(schema: Any) -> Any:
    """The reference decoder hands fastavro's uuid.UUID objects to Arrow, which wants text (a bug of
    the Python decoder that Spark's does not have): give it the plain strings on the wire."""
    if isinstance(schema, list):
        return [without_uuid_logical_type(s) for s in schema]
    if isinstance(schema, dict):
        bare = {k: without_uuid_logical_type(v) for k, v in schema.items()}
        if bare.get("logicalType") == "uuid":
            del bare["logicalType"]
        return bare
    return schema


def reference_decode(
    rows: DataFrame, decoder: decoders.AvroBatchDecoder | decoders.JsonBatchDecoder
) -> DataFrame:
    from pyspark.sql.pandas.types import to_arrow_schema

    schema = decoders.output_schema(decoder.columns)
    return rows.mapInArrow(decoders.decode_batches(decoder, to_arrow_schema(schema, timezone="UTC")), schema)


def test_native_decoding_equals_the_python_reference_on_every_type(
    fresh_db: str, registry_url: str, spark: SparkSession
) -> None:
    tables = (*CATALOG, WIDE)
    prefix = unique_name("native")
    client = SchemaRegistryClient({"url": registry_url})
    with catalog_slot(fresh_db, tables) as (conn, slot):
        events = pgoutput_events(conn, slot)
        infos = load_type_infos(conn)
    serializers: dict[str, Callable[[ChangeEvent], Any]] = {
        "avro": AvroEventSerializer(client, infos, topic_prefix=prefix),
        "json": JsonEventSerializer(infos, topic_prefix=prefix),
    }
    schemas = WriterSchemas(registry_url)
    as_statements = 0
    try:
        for table in tables:
            table_events = [e for e in events if e.table.name == table.name]
            assert table_events, table.name
            for fmt, serialize in serializers.items():
                messages = with_delete_and_unchanged([serialize(e) for e in table_events])
                rows = kafka_rows(spark, messages)
                where = f"{fmt} {table.name}"
                if fmt == "avro":
                    keys, values, columns = avro_columns(schemas, messages)
                    plain = {i: without_uuid_logical_type(v) for i, v in values.items()}
                    reference = reference_decode(rows, decoders.AvroBatchDecoder(keys, plain, columns))
                    native = spark_decode.decode_avro(rows, keys, values, columns)
                    # The same decoding as one statement over the records with their metadata, as
                    # a consistent read's tails build it (None with a nested column).
                    view = unique_name("records")
                    statement = spark_decode.avro_decoding(keys, values, columns).sql(view)
                    if statement is not None:
                        spark_envelope.with_metadata(rows).createOrReplaceTempView(view)
                        assert_same(reference, spark.sql(statement), f"{where} as one statement")
                        spark.catalog.dropTempView(view)
                        as_statements += 1
                else:
                    catalog = postgres_catalog.spark_columns(fresh_db, table.schema, table.name)
                    columns = list(catalog.items())
                    reference = reference_decode(rows, decoders.JsonBatchDecoder(columns))
                    native = spark_decode.decode_json(rows, ("id",), columns)
                assert_same(reference, native, where)
        assert as_statements >= len(tables) // 2, as_statements
    finally:
        for subject in client.get_subjects():
            if subject.startswith(prefix):
                client.delete_subject(subject)
                client.delete_subject(subject, permanent=True)
