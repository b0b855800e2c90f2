"""The lake's changelog: every record of every batch of the merge query, in one Delta commit per batch.

`<warehouse>/_bw_state/changelog` (docs/lakehouse.md, "The lake's changelog") holds each Kafka record
as the merge read it (topic, partition, offset, key, value: the Avro frame with its schema id or the
JSON text, headers) with the `bw.*` headers it needs to be ordered and trimmed (`_bw_lsn`, `_bw_seq`,
`_bw_op`), the batch (`_bw_batch`) and when the batch wrote it (`_bw_written`), clustered by topic
(liquid clustering, applied by maintenance's OPTIMIZE) so that one table's slice reads few files.
The rows are not decoded: an append costs what the lake's raw pipe costs, and a schema the merge
cannot decode yet does not hold the commit up.

A commit is idempotent (`txnAppId` = query + the digest of the batch's end offsets, `txnVersion` =
batch id, as the mirrors' commits) and carries a `rules.changelog_commit.ChangelogCommit` as its
user metadata: the position it proves for every table the query reads.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from kafka_contract.headers import HEADER_COMMIT_TS, HEADER_LSN, HEADER_OP, HEADER_SEQ
from spark_jobs.connections.kafka_source import RECORD_COLUMNS, OffsetRanges
from spark_jobs.decoding import spark_envelope
from spark_jobs.decoding.spark_envelope import HEADERS_MAP, header
from spark_jobs.lake import delta_tables
from spark_jobs.rules import layout
from spark_jobs.rules.changelog_commit import ChangelogCommit, Decoding, newest_commit, parse_changelog_commit
from spark_jobs.rules.names import string

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)
BATCH = "_bw_batch"
WRITTEN = "_bw_written"
# The newest commits `newest` reads first: every batch that writes the changelog proves its position.
RECENT_COMMITS = 20
# The columns Delta keeps file statistics of: those readers filter by. Not the record's key, value
# and headers, which nothing filters by: their statistics cost about 7 % of an append.
STATS_COLUMNS = ("topic", "partition", "offset", layout.LSN, layout.SEQ, layout.OP, BATCH, WRITTEN)
# The columns Parquet writes without a dictionary: their values are about one per record (the key, the
# Avro or JSON value, the headers' values), so a dictionary fills up in every file before it is
# dropped. It cost about 0.5 s a million records of an append, and larger files
# (docs/lakehouse.md, "The lake's changelog").
# Delta hands a table's properties to its Parquet writer, OPTIMIZE's rewrites included.
PLAIN_COLUMNS = ("key", "value", "headers.list.element.value")


def exists(spark: SparkSession, warehouse: str) -> bool:
    """Whether the warehouse keeps a changelog (a merge with it wrote a batch)."""
    return delta_tables.table_exists(spark, layout.changelog_path(warehouse))


def rows(records: DataFrame, batch_id: int, written: datetime) -> DataFrame:
    """A batch's Kafka records (`kafka_source.RECORD_COLUMNS`) as changelog rows. The three headers
    are read at the worker's positions; the headers' map is built only for a record that has one
    elsewhere (`spark_envelope.header_sql`)."""
    from pyspark.sql import functions as F

    return records.select(
        *RECORD_COLUMNS,
        F.lit(batch_id).cast("long").alias(BATCH),
        header(HEADER_LSN, HEADERS_MAP).cast("long").alias(layout.LSN),
        header(HEADER_SEQ, HEADERS_MAP).cast("long").alias(layout.SEQ),
        header(HEADER_OP, HEADERS_MAP).alias(layout.OP),
        F.lit(written).cast("timestamp").alias(WRITTEN),
    )


def append(
    spark: SparkSession,
    warehouse: str,
    records: DataFrame,
    *,
    commit: ChangelogCommit,
    txn: delta_tables.Txn,
    written: datetime,
) -> None:
    """The batch's records in one commit, skipped by Delta when the same batch was committed before
    (a replay after a crash). The table is created first, clustered by topic (Delta's liquid
    clustering): a batch is written as a few files whatever the number of tables (partitioning by
    topic wrote a file per table per task), and maintenance's OPTIMIZE clusters them, so that one
    table's slice of the older batches reads few files; with file statistics of `STATS_COLUMNS` only
    and no dictionary for `PLAIN_COLUMNS`."""
    from delta.tables import DeltaTable

    frame = rows(records, commit.batch, written)
    path = layout.changelog_path(warehouse)
    if not exists(spark, warehouse):
        builder = (
            DeltaTable.createIfNotExists(spark)
            .location(path)
            .addColumns(frame.schema)
            .clusterBy("topic")
            .property("delta.dataSkippingStatsColumns", ",".join(STATS_COLUMNS))
        )
        for column in PLAIN_COLUMNS:
            builder = builder.property(f"parquet.enable.dictionary#{column}", "false")
        builder.execute()
    (
        frame.write.format("delta")
        .mode("append")
        .option("txnAppId", txn.app_id)
        .option("txnVersion", str(txn.version))
        .option("userMetadata", commit.metadata())
        .save(path)
    )


def commits(
    spark: SparkSession, warehouse: str, limit: int | None = None
) -> list[tuple[int, ChangelogCommit]]:
    """(version, commit) of the changelog's batch commits, oldest first (the newest `limit` commits
    only, if given); [] without a changelog."""
    if not exists(spark, warehouse):
        return []
    path = layout.changelog_path(warehouse)
    found = []
    for version, metadata in delta_tables.commit_metadata(spark, path, limit):
        commit = parse_changelog_commit(metadata)
        if commit is not None:
            found.append((version, commit))
    return found


def recent_commits(spark: SparkSession, warehouse: str) -> list[tuple[int, ChangelogCommit]]:
    """The batch commits among the newest RECENT_COMMITS, or all of them when none is there (a run
    of maintenance commits since the last batch)."""
    return commits(spark, warehouse, RECENT_COMMITS) or commits(spark, warehouse)


def newest(spark: SparkSession, warehouse: str) -> ChangelogCommit | None:
    """The changelog's newest proven position (its newest commits' newest watermark), None without one."""
    return newest_commit(commit for _, commit in recent_commits(spark, warehouse))


def recorded_decoding(
    spark: SparkSession, warehouse: str, recent: Sequence[tuple[int, ChangelogCommit]] | None = None
) -> Decoding | None:
    """How the changelog's records are decoded, as its newest commit that records it says (`recent`:
    its commits if already read); None without a changelog, or one written before it was recorded."""
    commits = recent_commits(spark, warehouse) if recent is None else recent
    return next((c.decoding for _, c in reversed(commits) if c.decoding is not None), None)


def read(
    spark: SparkSession,
    warehouse: str,
    topics: Iterable[str],
    version: int | None = None,
    *,
    extra: Sequence[str] = (),
) -> DataFrame:
    """The records of `topics` (in Kafka's record columns, and the changelog's `extra` columns), each
    once even when a replayed batch wrote it twice, as of the changelog's `version` (None: newest)."""
    from pyspark.sql import functions as F

    reader = spark.read.format("delta")
    if version is not None:
        reader = reader.option("versionAsOf", version)
    # The topics as one expression of text: a literal each as Columns is a JVM round trip per topic.
    listed = [string(t) for t in topics]
    wanted = F.expr(f"topic IN ({', '.join(listed)})" if listed else "false")
    frame = reader.load(layout.changelog_path(warehouse)).where(wanted)
    return frame.dropDuplicates(["topic", "partition", "offset"]).select(*RECORD_COLUMNS, *extra)


def newest_commit_before(
    spark: SparkSession, warehouse: str, topics: Iterable[str], at: datetime, version: int | None = None
) -> int | None:
    """The newest commit LSN of `topics`' records committed at or before `at` (their `bw.commit_ts`),
    as of the changelog's `version`; None when there is none."""
    from pyspark.sql import functions as F

    records = read(spark, warehouse, topics, version, extra=(layout.LSN,))
    committed = header(HEADER_COMMIT_TS).cast("timestamp")
    with_map = records.select(layout.LSN, spark_envelope.headers_map())
    row = with_map.where(committed <= F.lit(at)).agg(F.max(layout.LSN)).head()
    return None if row is None or row[0] is None else int(row[0])


def read_ranges(spark: SparkSession, warehouse: str, ranges: OffsetRanges) -> DataFrame:
    """The records of the given (topic, partition) -> (first, last) offset ranges, both included."""
    from pyspark.sql import functions as F

    within = [
        (F.col("topic") == F.lit(topic))
        & (F.col("partition") == F.lit(partition))
        & F.col("offset").between(first, last)
        for (topic, partition), (first, last) in sorted(ranges.items())
    ]
    if not within:
        raise ValueError("no offset range to read from the changelog")
    condition = within[0]
    for part in within[1:]:
        condition = condition | part
    return read(spark, warehouse, sorted({t for t, _ in ranges})).where(condition)


def trim(spark: SparkSession, warehouse: str, before: datetime, keep_topics: Iterable[str] = ()) -> int:
    """Delete the rows written before `before`, except those of `keep_topics` (tables whose changes
    still wait: parked ones); returns how many went. The newest commit's rows always stay, so the
    changelog keeps its newest proven position whatever the retention."""
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    path = layout.changelog_path(warehouse)
    if not exists(spark, warehouse):
        return 0
    recent = recent_commits(spark, warehouse)
    newest_batch = recent[-1][1].batch if recent else None
    condition = F.col(WRITTEN) < F.lit(before).cast("timestamp")
    kept = sorted(set(keep_topics))
    if kept:
        condition = condition & ~F.col("topic").isin(kept)
    if newest_batch is not None:
        condition = condition & (F.col(BATCH) != F.lit(newest_batch))
    table = DeltaTable.forPath(spark, path)
    table.delete(condition)
    metrics = table.history(1).select("operationMetrics").head()
    deleted = 0 if metrics is None or metrics[0] is None else int(metrics[0].get("numDeletedRows", "0"))
    log.info("changelog: %s rows written before %s trimmed", deleted, before.isoformat())
    return deleted
