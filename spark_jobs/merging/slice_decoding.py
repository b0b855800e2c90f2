"""A table's slice of a merge batch as typed rows: its messages decoded by Spark's own decoding
(`spark_decode`, no Python per record), Avro with the writer schemas from the registry, JSON typed
from the catalog, the lake or the records (`batch_columns`)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

from spark_jobs.connections.registry import WriterSchemas
from spark_jobs.decoding import spark_decode, spark_envelope
from spark_jobs.merging import batch_columns, batch_schema
from spark_jobs.rules import layout

if TYPE_CHECKING:
    from collections.abc import Mapping

    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import DataType

# Kafka partitions of one topic stay far below this, so (offset, partition) packs into one long.
_PARTITION_SPACE = 1 << 16


@dataclass(frozen=True)
class DecodedBatch:
    """A batch's table messages as typed rows, and what typing them established."""

    keys: tuple[str, ...]
    columns: list[tuple[str, DataType]]
    frame: DataFrame
    # The Postgres table the messages came from, as the value schema names it.
    source_name: str


@dataclass(frozen=True)
class DecodedText:
    """`DecodedBatch` as Spark SQL text: `sql`, a SELECT of the typed rows, not analyzed yet."""

    keys: tuple[str, ...]
    columns: list[tuple[str, DataType]]
    sql: str

    @property
    def names(self) -> list[str]:
        """The SELECT's columns: the table's, then the metadata (without the Kafka positions)."""
        return [*(n for n, _ in self.columns), *spark_decode.metadata_names(positions=False)]


@dataclass(frozen=True)
class SliceDecoder:
    """How one table's messages are decoded: `output_format` (avro or json), the registry's writer
    schemas (Avro), the catalog's DSN (JSON, optional)."""

    location: layout.TableLocation
    path: str
    output_format: str
    control_topic: str
    schemas: WriterSchemas | None
    postgres: str | None = None

    def decode(
        self, batch: DataFrame, summary: batch_schema.BatchSummary, properties: Mapping[str, str]
    ) -> DecodedBatch:
        """The table's messages (`batch` without the control topic's records) as typed rows."""
        decoder = self._decoder(batch, summary, properties)
        if decoder.keys:
            frame = decoder.decode(batch, positions=False)
        else:
            decoded = decoder.decode(batch, positions=True).withColumn(layout.SEQ, _unkeyed_seq())
            frame = decoded.drop(spark_envelope.PARTITION, spark_envelope.OFFSET)
        return DecodedBatch(decoder.keys, decoder.columns, frame, decoder.source_name)

    def decode_sql(
        self, records: str, summary: batch_schema.BatchSummary, properties: Mapping[str, str]
    ) -> DecodedText | None:
        """`decode` of the table's messages in the relation `records` (a quoted view name or a
        parenthesized query, whose rows carry their metadata columns: `spark_envelope.with_metadata`),
        as one SELECT; None when the decoding is not all text (JSON, a nested column) or the table is
        unkeyed (its rows' identity is computed as a Column)."""
        if self.output_format != "avro":
            return None
        assert self.schemas is not None
        decoder = batch_columns.avro_decoder(
            self.schemas, summary, dict(properties), self.location.qualified_safe_name
        )
        text = None if decoder.sql is None or not decoder.keys else decoder.sql(records, positions=False)
        return None if text is None else DecodedText(decoder.keys, decoder.columns, text)

    def _decoder(
        self, batch: DataFrame, summary: batch_schema.BatchSummary, properties: Mapping[str, str]
    ) -> batch_columns.Decoder:
        if self.output_format == "avro":
            assert self.schemas is not None
            return batch_columns.avro_decoder(
                self.schemas, summary, dict(properties), self.location.qualified_safe_name
            )
        keys, columns = batch_columns.json_columns(
            batch,
            summary,
            dict(properties),
            path=self.path,
            postgres=self.postgres,
            location=self.location,
            control_topic=self.control_topic,
        )
        decode_json = partial(spark_decode.decode_json, keys=keys, columns=columns)
        return batch_columns.Decoder(keys, columns, decode_json, self.location.qualified_safe_name)


def _unkeyed_seq() -> Column:
    """An unkeyed table's rows are identified by (lsn, seq) alone, but every snapshot read carries
    the same lsn and seq; such a row takes its Kafka position instead, as a negative seq (it still
    sorts before every streamed change, whose seq is >= 0), so a replayed read is recognised."""
    from pyspark.sql import functions as F

    position = F.col(spark_envelope.OFFSET) * F.lit(_PARTITION_SPACE) + F.col(spark_envelope.PARTITION)
    is_read = F.col(layout.OP) == F.lit("r")
    return F.when(is_read, -position - F.lit(1)).otherwise(F.col(layout.SEQ))
