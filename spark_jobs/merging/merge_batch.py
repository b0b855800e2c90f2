"""One micro-batch of one table topic (plus the control topic) -> its Delta mirror, exactly once.

`TableMerger` is the `foreachBatch` function of a table's stream, and the coordinator of a table's
slice of the one merge query's batches (`merge_query`). Per slice: the table's state is read once
(`table_state`), then each step of `slice_steps` is handed it and returns what it did: the DDL
events, the TRUNCATE, the decoding (`slice_decoding`), the watermark's mark, the changes prepared
(TOAST carried, events before a TRUNCATE and resurrections of deleted keys dropped, newest per key),
the mirror created or evolved, the tombstones, the history, the mirror's MERGE, and last the mark
commit. Every data commit is idempotent (txnAppId = query id + batch identity, txnVersion = batch
id) and carries the batch's mark.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from kafka_contract import control
from kafka_contract.topics import control_topic_name
from spark_jobs.connections.registry import WriterSchemas
from spark_jobs.lake import delta_tables, watermark_io
from spark_jobs.lake.table_state import TablePaths, read_state
from spark_jobs.merge_options import MergeOptions
from spark_jobs.merging import batch_schema, slice_steps, truncates
from spark_jobs.merging.slice_decoding import DecodedBatch, DecodedText, SliceDecoder
from spark_jobs.merging.slice_steps import BatchResult, SliceInput
from spark_jobs.rules import layout
from spark_jobs.rules.watermark import Mark

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["QUERY_ID_WAIT_S", "BatchResult", "TableMerger"]

log = logging.getLogger(__name__)
QUERY_ID_WAIT_S = 60.0


class TableMerger:
    """The foreachBatch function of one table's stream."""

    def __init__(self, location: layout.TableLocation, options: MergeOptions) -> None:
        self.location = location
        self.options = options
        self.path = location.path(options.warehouse)
        self.control_topic = control_topic_name(options.topic_prefix)
        self.results: list[BatchResult] = []
        schemas = (
            WriterSchemas(options.schema_registry, options.registry_config)
            if options.schema_registry
            else None
        )
        if options.output_format == "avro" and schemas is None:
            raise ValueError("Avro topics need --schema-registry to fetch writer schemas")
        self.decoder = SliceDecoder(
            location, self.path, options.output_format, self.control_topic, schemas, options.postgres
        )
        self._query_id: str | None = None
        self._bound = threading.Event()
        self._mirrored = False
        # Whether the mirror's own features were compared with the option's (once per merger).
        self._features_checked = False
        history = location.history_path(options.warehouse) if options.history else None
        self.paths = TablePaths(
            self.path,
            history=history,
            tombstones=location.tombstones_path(options.warehouse),
            pending_truncates=truncates.pending_path(options.warehouse, location),
        )
        self.control_decoder = control.ControlDecoder(
            options.output_format, None if schemas is None else schemas.get
        )
        self.watermark = watermark_io.TableWatermark(
            self.path, history, (location.topic, self.control_topic), self.control_decoder
        )
        # The mark of the newest batch that computed one (None: none), for the commit reports.
        self.mark: Mark | None = None

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
            self._mirrored = delta_tables.newest_version(spark, self.path) >= 0
        return self._mirrored

    def process(self, batch: DataFrame, batch_id: int) -> BatchResult | None:
        # One Kafka read per batch: the summary's pass keeps the records for the decoding.
        with batch_schema.read_once(batch) as records:
            summary = batch_schema.summarize(records, self.control_topic, self.options.output_format)
            return self.merge_slice(records, batch_id, summary)

    def process_slice(
        self, records: DataFrame, batch_id: int, summary: batch_schema.BatchSummary
    ) -> BatchResult | None:
        """This table's slice of a batch of many topics (`merge_query`): its records and the control
        topic's, already read once and summarized; the result is also kept in `results`."""
        result = self.merge_slice(records, batch_id, summary)
        if result is not None:
            self.results.append(result)
        return result

    def decode(
        self, batch: DataFrame, summary: batch_schema.BatchSummary, properties: dict[str, str]
    ) -> DecodedBatch:
        """The table's messages (`batch` without the control topic's records) as typed rows."""
        return self.decoder.decode(batch, summary, properties)

    def decode_sql(
        self, records: str, summary: batch_schema.BatchSummary, properties: dict[str, str]
    ) -> DecodedText | None:
        """`SliceDecoder.decode_sql`: the decoding as one SELECT of the relation `records`."""
        return self.decoder.decode_sql(records, summary, properties)

    def merge_slice(
        self, batch: DataFrame, batch_id: int, summary: batch_schema.BatchSummary
    ) -> BatchResult | None:
        """One slice: `batch`, the table's records and the control topic's, as `summary` found them.
        The steps run in this order, each handed the table's state as read once here."""
        from pyspark import StorageLevel
        from pyspark.sql import functions as F

        spark = batch.sparkSession
        at = SliceInput(
            spark,
            batch_id,
            summary,
            read_state(spark, self.paths),
            truncates.newest_truncate(self.control_decoder, self.location.topic, summary.control_records),
            self.location,
            self.options.warehouse,
            self.options.mirror_features,
            self._query_id,
        )
        slice_steps.apply_ddl(at, self.control_decoder)
        if summary.table_messages == 0 and at.truncate is None:
            # Nothing of this table: its watermark still advances (an idle table holds no reader back).
            step = self._begin_mark(at, applied=None)
            self.watermark.finish(
                spark, step, mirror_exists=at.state.exists, history_exists=at.state.history_exists
            )
            return None
        if not at.state.exists and summary.table_messages == 0:
            return slice_steps.remember_truncate(at)
        table_records = batch.where(F.col("topic") != F.lit(self.control_topic))
        decoded = self.decoder.decode(table_records, summary, at.state.properties)
        decoded.frame.persist(StorageLevel.MEMORY_AND_DISK)
        try:
            return self._write(at, decoded)
        finally:
            decoded.frame.unpersist()

    def _write(self, at: SliceInput, decoded: DecodedBatch) -> BatchResult:
        """The slice's commits: the mirror prepared, its TRUNCATE, the data commits (each carrying
        the batch's mark: a version before them lacks the batch's rows), then the mark commit."""
        step = self._begin_mark(at, applied=at.summary.applied)
        mark = None if step is None else step.mark
        prepared = slice_steps.prepare_changes(at, decoded)
        try:
            check_features, self._features_checked = not self._features_checked, True
            added = slice_steps.prepare_mirror(at, decoded, check_features=check_features)
            slice_steps.record_truncate(at)
            if at.summary.tombstones:
                slice_steps.append_tombstones(at, prepared)
            if self.options.history:
                slice_steps.merge_history(at, prepared, mark)
            result = slice_steps.merge_mirror(at, prepared, mark, added=added)
        finally:
            prepared.newest.unpersist()
        # The mark commit (docs/lakehouse.md): the history exists now if the merge keeps one.
        self.watermark.finish(at.spark, step, mirror_exists=True, history_exists=self.options.history)
        return result

    def _begin_mark(self, at: SliceInput, *, applied: int | None) -> watermark_io.BatchMark | None:
        control_records = at.summary.control_records
        step = self.watermark.batch(
            at.spark, at.batch_id, control_records, None, stored=at.state.mark, applied_changes=applied
        )
        self.mark = None if step is None else step.mark
        return step
