"""One micro-batch of one table topic (plus the control topic) -> its Delta mirror, exactly once.

`TableMerger` is the `foreachBatch` function of a table's stream. Per batch:
read Kafka once (`batch_schema.read_once`) -> summarize -> fetch writer schemas -> decode
(from_avro/from_json) -> carry TOAST values -> drop events older than a TRUNCATE -> newest per key ->
drop resurrections of deleted keys -> create/evolve the table -> append the deletes to the tombstone
table, MERGE the history and the mirror (append into a mirror this batch created), each as an
idempotent commit (txnAppId = query id + batch identity, txnVersion = batch id).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

from kafka_contract import control
from kafka_contract.topics import control_topic_name
from spark_jobs.connections.registry import WriterSchemas
from spark_jobs.decoding import spark_decode, spark_envelope
from spark_jobs.lake import delta_tables, watermark_io
from spark_jobs.merge_options import MergeOptions
from spark_jobs.merging import batch_columns, batch_schema, ddl, scd2, truncates
from spark_jobs.merging.truncates import Truncate
from spark_jobs.rules import changes, key_range, layout, mirror_features
from spark_jobs.rules.watermark import Mark

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import DataType

log = logging.getLogger(__name__)
QUERY_ID_WAIT_S = 60.0


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


@dataclass
class BatchResult:
    batch_id: int
    messages: int
    changes: int
    truncated_before: tuple[int, int] | None
    added_columns: list[str]


class TableMerger:
    """The foreachBatch function of one table's stream."""

    def __init__(self, location: layout.TableLocation, options: MergeOptions) -> None:
        self.location = location
        self.options = options
        self.path = location.path(options.warehouse)
        self.control_topic = control_topic_name(options.topic_prefix)
        self.results: list[BatchResult] = []
        self._schemas = (
            WriterSchemas(options.schema_registry, options.registry_config)
            if options.schema_registry
            else None
        )
        self._query_id: str | None = None
        self._bound = threading.Event()
        self._mirrored = False
        # Whether the mirror's own features were compared with the option's (once per merger).
        self._features_checked = False
        if options.output_format == "avro" and self._schemas is None:
            raise ValueError("Avro topics need --schema-registry to fetch writer schemas")
        self._pending_path = truncates.pending_path(options.warehouse, location)
        self.control_decoder = control.ControlDecoder(
            options.output_format, None if self._schemas is None else self._schemas.get
        )
        history = location.history_path(options.warehouse) if options.history else None
        self.watermark = watermark_io.TableWatermark(
            self.path, history, (location.topic, self.control_topic), self.control_decoder
        )

    def bind(self, query_id: str, checkpoint: str | None = None) -> None:
        """The streaming query's id (stable for the life of its checkpoint), known once it started,
        and its checkpoint (the batches' end offsets, for the watermark; None: none recorded)."""
        self._query_id = query_id
        self.watermark.checkpoint = checkpoint
        self._bound.set()

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        if not self._bound.wait(QUERY_ID_WAIT_S):
            raise RuntimeError("the merge query's id was never bound: call bind() after start()")
        result = self.process(batch, batch_id)
        if result is not None:
            self.results.append(result)

    def has_mirror(self, spark: SparkSession) -> bool:
        """Whether the mirror exists (asked of Delta until it does; no mirror is dropped under a
        running merge: Dagster's reset waits for it)."""
        if not self._mirrored:
            self._mirrored = delta_tables.table_exists(spark, self.path)
        return self._mirrored

    def process(self, batch: DataFrame, batch_id: int) -> BatchResult | None:
        # One Kafka read per batch: the summary's pass keeps the records for the decoding.
        with batch_schema.read_once(batch) as records:
            return self._process(records, batch_id)

    def process_slice(
        self, records: DataFrame, batch_id: int, summary: batch_schema.BatchSummary
    ) -> BatchResult | None:
        """This table's slice of a batch of many topics (`merge_query`): its records and the control
        topic's, already read once and summarized; the result is also kept in `results`."""
        result = self._process(records, batch_id, summary)
        if result is not None:
            self.results.append(result)
        return result

    def _process(
        self, batch: DataFrame, batch_id: int, summary: batch_schema.BatchSummary | None = None
    ) -> BatchResult | None:
        from pyspark import StorageLevel
        from pyspark.sql import functions as F

        spark = batch.sparkSession
        if summary is None:
            summary = batch_schema.summarize(batch, self.control_topic, self.options.output_format)
        truncate = truncates.newest_truncate(
            self.control_decoder, self.location.topic, summary.control_records
        )
        # DDL (--capture-ddl) first: the table's DDL log, and columns added before any row has them.
        ddl.apply(
            spark,
            warehouse=self.options.warehouse,
            location=self.location,
            mirror_path=self.path,
            events=ddl.table_events(self.control_decoder, self.location.topic, summary.control_records),
            txn=delta_tables.Txn(f"bottledwater-ddl-{self._query_id}-{summary.identity()}", batch_id),
        )
        if summary.table_messages == 0 and truncate is None:
            # Nothing of this table: its watermark still advances (an idle table holds no reader back).
            self.watermark.batch(spark, batch_id, summary.control_records, None)
            self.watermark.finish(spark)
            return None
        exists = delta_tables.table_exists(spark, self.path)
        if not exists and summary.table_messages == 0:
            # A TRUNCATE before the table's first row. The mirror is not created here: without rows
            # the batch carries no key schema (JSON not even field names), so the table would be
            # created keyless, indistinguishable from an --allow-unkeyed one, and the registry's
            # latest key schema is no substitute (a table that never had a row may have none, and
            # JSON has no registry). There is nothing to delete yet, but changes older than the
            # TRUNCATE may still arrive in later batches (another topic, a split backlog, a replay):
            # its position is kept in the table's state and the mirror, once created, starts from it.
            if truncate is not None:
                txn = delta_tables.Txn(f"bottledwater-merge-{self._query_id}-{summary.identity()}", batch_id)
                truncates.remember(spark, self._pending_path, truncate, txn)
                log.info(
                    "%s: TRUNCATE at %s/%s before the first row, remembered",
                    self.location.topic,
                    *truncate.position,
                )
            return BatchResult(batch_id, 0, 0, None if truncate is None else truncate.position, [])
        properties = delta_tables.table_properties(spark, self.path) if exists else {}
        known_truncate = (
            layout.parse_position(properties.get(layout.TRUNCATED_BEFORE_PROPERTY))
            if exists
            else truncates.pending(spark, self._pending_path)
        )
        table_records = batch.where(F.col("topic") != F.lit(self.control_topic))
        decoded = self.decode(table_records, summary, properties)
        decoded.frame.persist(StorageLevel.MEMORY_AND_DISK)
        try:
            mark = self.watermark.batch(
                spark, batch_id, summary.control_records, None, applied_changes=summary.applied
            )
            result = self._apply(
                spark,
                batch_id,
                summary=summary,
                properties=properties,
                decoded=decoded,
                truncate=truncate,
                known_truncate=known_truncate,
                mark=mark,
            )
            self.watermark.finish(spark)  # the mark commit (docs/lakehouse.md)
            return result
        finally:
            decoded.frame.unpersist()

    def decode(
        self, batch: DataFrame, summary: batch_schema.BatchSummary, properties: dict[str, str]
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
        self, records: str, summary: batch_schema.BatchSummary, properties: dict[str, str]
    ) -> DecodedText | None:
        """`decode` of the table's messages in the relation `records` (a quoted view name or a
        parenthesized query, whose rows carry their metadata columns: `spark_envelope.with_metadata`),
        as one SELECT; None when the decoding is not all text (JSON, a nested column) or the table is
        unkeyed (its rows' identity is computed as a Column)."""
        if self.options.output_format != "avro":
            return None
        assert self._schemas is not None
        decoder = batch_columns.avro_decoder(
            self._schemas, summary, properties, self.location.qualified_safe_name
        )
        text = None if decoder.sql is None or not decoder.keys else decoder.sql(records, positions=False)
        return None if text is None else DecodedText(decoder.keys, decoder.columns, text)

    def _apply(
        self,
        spark: SparkSession,
        batch_id: int,
        *,
        summary: batch_schema.BatchSummary,
        properties: dict[str, str],
        decoded: DecodedBatch,
        truncate: Truncate | None,
        known_truncate: tuple[int, int] | None,
        mark: Mark | None = None,
    ) -> BatchResult:
        from pyspark import StorageLevel

        # Only the data commits carry the batch's mark: a version before them lacks the batch's rows.
        keys, columns = decoded.keys, decoded.columns
        truncate_at = None if truncate is None else truncate.commit_ts
        truncate_position = None if truncate is None else truncate.position
        effective = (
            max(p for p in (truncate_position, known_truncate) if p is not None)
            if (truncate_position or known_truncate)
            else None
        )
        # An unkeyed table has no row identity to merge on (and its deletes are not published):
        # its mirror keeps every event as a row, like its topic, identified by (lsn, seq) so that a
        # replayed event is recognised and adds nothing.
        row_identity = keys or (layout.LSN, layout.SEQ)
        toast = [c for c in summary.unchanged_columns if c in dict(columns)] if keys else []
        carried = changes.carry_unchanged(decoded.frame, row_identity, toast)
        events = changes.drop_truncated(carried, effective)
        newest = changes.newest_per_key(events, row_identity)
        tombstones_path = self.location.tombstones_path(self.options.warehouse)
        newest = delta_tables.drop_resurrections(spark, tombstones_path, newest, row_identity).persist(
            StorageLevel.MEMORY_AND_DISK
        )
        try:
            added = self._prepare_table(spark, decoded, properties, known_truncate=known_truncate)
            if truncate_position is not None and (
                known_truncate is None or truncate_position > known_truncate
            ):
                delta_tables.set_property(
                    spark,
                    self.path,
                    layout.TRUNCATED_BEFORE_PROPERTY,
                    layout.format_position(*truncate_position),
                )
            txn = delta_tables.Txn(f"bottledwater-merge-{self._query_id}-{summary.identity()}", batch_id)
            # One aggregate gives the result's count and the MERGE's key range.
            count, bounds = key_range.counted(newest, row_identity)
            if summary.tombstones:
                delta_tables.append_tombstones(
                    spark, tombstones_path, newest, row_identity, txn, features=self.options.mirror_features
                )
            if self.options.history:
                history_path = self.location.history_path(self.options.warehouse)
                # The history keeps the versions a TRUNCATE in this batch ended.
                history_events = changes.drop_truncated(carried, known_truncate)
                vectors = delta_tables.deletion_vector_writes(spark, history_path)
                with watermark_io.recording(spark, mark), vectors:
                    scd2.merge_history(
                        spark,
                        history_path,
                        self.path,
                        history_events,
                        keys=row_identity,
                        data_columns=[n for n, _ in columns],
                        toast_columns=toast,
                        truncate=None if truncate_position is None else (*truncate_position, truncate_at),
                        txn=txn,
                        # Its own range: its events hold keys that `newest` may not (resurrections).
                        key_range=None
                        if truncate_position is not None
                        else key_range.of_batch(history_events, row_identity),
                        features=self.options.mirror_features,
                    )
            with watermark_io.recording(spark, mark), delta_tables.deletion_vector_writes(spark, self.path):
                delta_tables.merge_changes(
                    spark,
                    self.path,
                    newest,
                    keys=row_identity,
                    data_columns=[n for n, _ in columns],
                    toast_columns=toast,
                    truncate_before=truncate_position if truncate_position == effective else None,
                    txn=txn,
                    # Created by this batch (_prepare_table): nothing to join with, so an append.
                    target_empty=not properties,
                    key_range=bounds,
                )
            log.info(
                "merged batch %s of %s: %s messages", batch_id, self.location.topic, summary.table_messages
            )
            return BatchResult(batch_id, summary.table_messages, count, truncate_position, added)
        finally:
            newest.unpersist()

    def _prepare_table(
        self,
        spark: SparkSession,
        decoded: DecodedBatch,
        properties: dict[str, str],
        *,
        known_truncate: tuple[int, int] | None,
    ) -> list[str]:
        """Create the mirror, or add the columns it lacks; returns the names of those added."""
        from pyspark.sql.types import StructType

        keys, columns, decoded_schema = decoded.keys, decoded.columns, decoded.frame.schema
        meta = [(f.name, f.dataType) for f in decoded_schema.fields if f.name in layout.META_COLUMNS]
        wanted = [*columns, *meta]
        if not properties:
            # The metadata columns as the contract declares them (lsn, seq, op never null), whatever
            # nullability the decoding expressions carry.
            declared = {f.name: f for f in spark_envelope.META_FIELDS}
            schema = StructType([declared.get(name, decoded_schema[name]) for name, _ in wanted])
            created = {
                layout.KEY_PROPERTY: layout.encode_key_columns(keys),
                layout.SOURCE_PROPERTY: decoded.source_name,
                layout.TOPIC_PROPERTY: self.location.topic,
            }
            if known_truncate is not None:
                # A TRUNCATE remembered before the table existed: in the same commit as the table,
                # so no later batch can see the table without it.
                created[layout.TRUNCATED_BEFORE_PROPERTY] = layout.format_position(*known_truncate)
            delta_tables.create_table(spark, self.path, schema, created, self.options.mirror_features)
            self._features_checked = True
            return []
        if not self._features_checked:
            self._features_checked = True
            have = mirror_features.of_table(properties)
            if have != self.options.mirror_features:
                # Kept, not refused: converting is a rewrite of every file, the operator's to start.
                log.warning(mirror_features.kept_message(self.path, have, self.options.mirror_features))
        stored_keys = layout.decode_key_columns(properties.get(layout.KEY_PROPERTY))
        if stored_keys and stored_keys != keys:
            raise delta_tables.SchemaEvolutionError(
                f"{self.location.topic}: the key is now {list(keys)}, the Delta table {self.path} was "
                f"built on {list(stored_keys)}: a new primary key needs the table rebuilt "
                "(drop it and its checkpoint)"
            )
        return delta_tables.add_missing_columns(spark, self.path, wanted)

    def _decoder(
        self, batch: DataFrame, summary: batch_schema.BatchSummary, properties: dict[str, str]
    ) -> batch_columns.Decoder:
        """The decoding is Spark's own (`spark_decode`): no Python runs per record."""
        if self.options.output_format == "avro":
            assert self._schemas is not None
            return batch_columns.avro_decoder(
                self._schemas, summary, properties, self.location.qualified_safe_name
            )
        keys, columns = batch_columns.json_columns(
            batch,
            summary,
            properties,
            path=self.path,
            postgres=self.options.postgres,
            location=self.location,
            control_topic=self.control_topic,
        )
        decode_json = partial(spark_decode.decode_json, keys=keys, columns=columns)
        return batch_columns.Decoder(keys, columns, decode_json, self.location.qualified_safe_name)


# Kafka partitions of one topic stay far below this, so (offset, partition) packs into one long.
_PARTITION_SPACE = 1 << 16


def _unkeyed_seq() -> Column:
    """An unkeyed table's rows are identified by (lsn, seq) alone, but every snapshot read carries
    the same lsn and seq; such a row takes its Kafka position instead, as a negative seq (it still
    sorts before every streamed change, whose seq is >= 0), so a replayed read is recognised."""
    from pyspark.sql import functions as F

    position = F.col(spark_envelope.OFFSET) * F.lit(_PARTITION_SPACE) + F.col(spark_envelope.PARTITION)
    is_read = F.col(layout.OP) == F.lit("r")
    return F.when(is_read, -position - F.lit(1)).otherwise(F.col(layout.SEQ))
