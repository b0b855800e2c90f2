"""The merge query's first step per batch: every record of the batch into the lake's changelog.

One commit for every table (`lake.changelog`), written before any mirror is merged: once it is in,
the batch's transactions are in the lake, whatever happens to the mirrors' merges after it. The
commit carries the position the batch proves for every table the query reads
(`rules.changelog_commit`), never older than the changelog's newest.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from kafka_contract import control
from spark_jobs.lake import changelog, delta_tables, watermark_io
from spark_jobs.merging.batch_schema import offsets_identity
from spark_jobs.rules.changelog_commit import ChangelogCommit, Decoding, query_topics
from spark_jobs.rules.watermark import NO_POSITION, ProgressLog, progress_of

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)


class ChangelogWriter:
    """Appends each batch of one merge query to the changelog of `warehouse`, each commit with how
    its records are decoded (`decoding`), for readers that are given nothing but the warehouse."""

    def __init__(self, warehouse: str, decoding: Decoding | None = None) -> None:
        self.warehouse = warehouse
        self.decoding = decoding
        self.progress = ProgressLog()
        # The changelog's newest commit (read at the query's first batch, then this writer's own).
        self.head: ChangelogCommit | None = None
        self._loaded = False

    def write(
        self,
        spark: SparkSession,
        records: DataFrame,
        *,
        query_id: str,
        checkpoint: str | None,
        batch_id: int,
        ends: Mapping[tuple[str, int], int],
        events: Sequence[dict[str, Any]],
        table_records: bool,
        topic_ids: Mapping[str, str] | None = None,
    ) -> ChangelogCommit | None:
        """Append the batch's `records` (read up to `ends`; `events` its decoded control records;
        `table_records`: whether it holds any table topic's; `topic_ids`: Kafka's ids of the topics
        the query has read, recorded with the commit). A batch of progress events alone that
        moves no position writes nothing: an idle source costs no commit. Returns the commit written."""
        if not ends:
            return None
        if not self._loaded:
            self.head = changelog.newest(spark, self.warehouse)
            self._loaded = True
        self.progress.add(p for p in (progress_of(e) for e in events) if p is not None)
        planned = None if checkpoint is None else watermark_io.end_offsets(spark, checkpoint, batch_id)
        proven = None if planned is None else self.progress.proven(planned, query_topics(planned))
        head = self.head
        commit = ChangelogCommit(
            query_id,
            batch_id,
            dict(ends),
            NO_POSITION if head is None else head.watermark,
            None if head is None else head.at,
            dict(topic_ids or {}),
            self.decoding,
        ).proving(proven)
        only_progress = all(e.get("op") == control.PROGRESS for e in events)
        moved = head is None or commit.watermark != head.watermark
        if not table_records and only_progress and not moved:
            return None
        txn = delta_tables.Txn(f"bottledwater-changelog-{query_id}-{offsets_identity(ends)}", batch_id)
        changelog.append(spark, self.warehouse, records, commit=commit, txn=txn, written=datetime.now(UTC))
        if proven is not None:
            self.progress.forget_through(proven.lsn)
        self.head = commit
        log.debug("changelog: batch %s committed, watermark %s", batch_id, commit.watermark)
        return commit

    def batches(self, spark: SparkSession, query_id: str) -> set[int]:
        """The query's batches the changelog has a commit of (and so their records: a parked slice of
        a batch written before the changelog was on is not there)."""
        return {c.batch for _, c in changelog.commits(spark, self.warehouse) if c.query == query_id}
