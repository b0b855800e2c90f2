"""Changes produced before their commit, given their commit's `bw.lsn` and `bw.commit_ts` before
anything else of the merge reads them.

Under exactly-once the worker produces a large transaction's changes while it runs (docs/worker.md,
"Large transactions"): they carry `bw.op`, `bw.seq` and `bw.xid`, in that order, and neither
`bw.lsn` nor `bw.commit_ts`; the transaction's commit event on the control topic (`op` = `commit`,
`kafka_contract.control`), in the same Kafka transaction, names them. A batch's summary lists the
xids of such changes (`EARLY_XID_SQL`); `resolve` rewrites their headers into the layout every other
change has (`bw.op`, `bw.lsn`, `bw.seq`, `bw.xid`, `bw.commit_ts`, then the rest), so that the
changelog, the mirrors and everything after them see an ordinary change.

Where the commit is found: among the batch's own control records; in `<warehouse>/_bw_state/
streamed_commits`, where every batch keeps the commit events it read (the records of a transaction
may come a batch after its event: Kafka writes a transaction's markers partition by partition); or,
when Kafka showed the batch the records before the event's marker, on the control topic past the
batch's end (`read_past`), where it must be since the records are visible.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

from kafka_contract.control import STREAMED_COMMIT
from kafka_contract.headers import HEADER_COMMIT_TS, HEADER_LSN, HEADER_SEQ, iso_utc
from spark_jobs.rules import layout
from spark_jobs.rules.names import string

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

log = logging.getLogger(__name__)

STREAMED_COMMITS_DIR = "streamed_commits"
# A change produced before its commit has `bw.seq` second, where every other message has `bw.lsn`.
EARLY_SQL = f"try_element_at(headers, 2).key = {string(HEADER_SEQ)}"
EARLY_XID_SQL = "TRY_CAST(CAST(try_element_at(headers, 3).value AS STRING) AS BIGINT)"
# How long the control topic is read past a batch's end for a commit event Kafka has decided.
PAST_END_TIMEOUT_S = 60.0

# xid -> (commit LSN, `bw.commit_ts` text)
Commits = dict[int, tuple[int, str]]


def streamed_commits_path(warehouse: str) -> str:
    return f"{warehouse.rstrip('/')}/{layout.STATE_DIR}/{STREAMED_COMMITS_DIR}"


def early_xid() -> Column:
    """The xid of a change produced before its commit, null for every other record."""
    from pyspark.sql import functions as F

    return F.when(F.expr(EARLY_SQL), F.expr(EARLY_XID_SQL))


def commits_of(events: Iterable[Mapping[str, Any]]) -> Commits:
    """The commit events among decoded control events."""
    found: Commits = {}
    for event in events:
        if event.get("op") != STREAMED_COMMIT:
            continue
        stamp = event["commit_ts"]
        text = iso_utc(stamp) if isinstance(stamp, datetime) else str(stamp)
        found[int(event["xid"])] = (int(event["lsn"]), text)
    return found


def resolve(records: DataFrame, commits: Mapping[int, tuple[int, str]]) -> DataFrame:
    """`records` with every change produced before its commit in the ordinary header layout; the
    commit of each must be in `commits`."""
    from pyspark.sql import functions as F

    if not commits:
        return records
    pairs: list[Column] = []
    for xid, (lsn, stamp) in sorted(commits.items()):
        pairs += [F.lit(xid).cast("long"), F.struct(F.lit(str(lsn)).alias("lsn"), F.lit(stamp).alias("ts"))]
    commit = F.try_element_at(F.create_map(*pairs), F.expr(EARLY_XID_SQL))

    def header(name: str, value: Column) -> Column:
        return F.struct(F.lit(name).alias("key"), value.cast("binary").alias("value"))

    at = F.expr
    ordinary = F.concat(
        F.array(
            at("headers[0]"),
            header(HEADER_LSN, commit["lsn"]),
            at("headers[1]"),
            at("headers[2]"),
            header(HEADER_COMMIT_TS, commit["ts"]),
        ),
        F.slice("headers", 4, F.greatest(F.size("headers") - 3, F.lit(0))),
    )
    rewritten = F.when(F.expr(EARLY_SQL) & commit.isNotNull(), ordinary).otherwise(F.col("headers"))
    return records.withColumn("headers", rewritten)


class StreamedCommits:
    """The commits the merge has read, kept in the warehouse; `read_past(spark, xids, batch_id)` reads
    the control topic past a batch's end for the ones not found (the merge query's)."""

    def __init__(
        self, warehouse: str, read_past: Callable[[SparkSession, set[int], int], Commits] | None = None
    ) -> None:
        self.path = streamed_commits_path(warehouse)
        self._read_past = read_past

    def remember(self, spark: SparkSession, commits: Commits, batch_id: int) -> None:
        """Keep a batch's commit events (a batch replayed keeps them twice: the same rows)."""
        if not commits:
            return
        rows = [(xid, lsn, stamp, batch_id) for xid, (lsn, stamp) in sorted(commits.items())]
        frame = spark.createDataFrame(rows, "xid long, lsn long, commit_ts string, batch long")
        frame.write.format("delta").mode("append").save(self.path)

    def kept(self, spark: SparkSession, xids: set[int]) -> Commits:
        """The newest commit kept of each of `xids` (an xid is reused once in four billion)."""
        from pyspark.sql import functions as F

        from spark_jobs.lake import delta_tables

        if not xids or not delta_tables.table_exists(spark, self.path):
            return {}
        rows = (
            spark.read.format("delta")
            .load(self.path)
            .where(F.col("xid").isin(sorted(xids)))
            .groupBy("xid")
            .agg(F.max_by(F.struct("lsn", "commit_ts"), "lsn").alias("commit"))
            .collect()
        )
        return {int(r["xid"]): (int(r["commit"]["lsn"]), str(r["commit"]["commit_ts"])) for r in rows}

    def find(self, spark: SparkSession, xids: set[int], in_batch: Commits, batch_id: int | None) -> Commits:
        """The commits of `xids`: the batch's own, then the kept ones, then past the batch's end
        (kept in turn). Raises when one cannot be found."""
        found = {x: in_batch[x] for x in xids if x in in_batch}
        missing = xids - found.keys()
        if missing:
            found.update(self.kept(spark, missing))
            missing = xids - found.keys()
        if missing and self._read_past is not None and batch_id is not None:
            past = self._read_past(spark, missing, batch_id)
            self.remember(spark, past, batch_id)
            found.update({x: past[x] for x in missing if x in past})
            missing = xids - found.keys()
        if missing:
            raise RuntimeError(
                f"the commit events of streamed transactions {sorted(missing)[:5]} are not on the control "
                "topic: their changes cannot be ordered (was the control topic deleted or compacted "
                "with a tombstone?)"
            )
        return found


def resolve_kept(spark: SparkSession, records: DataFrame, warehouse: str) -> DataFrame:
    """`resolve` of records read again from Kafka (a parked slice), whose commits a batch kept."""
    rows = records.select(early_xid().alias("xid")).where("xid IS NOT NULL").distinct().collect()
    xids = {int(r["xid"]) for r in rows}
    if not xids:
        return records
    return resolve(records, StreamedCommits(warehouse).find(spark, xids, {}, None))


def read_control_past(
    consumer_settings: Mapping[str, Any],
    control_topic: str,
    starts: Mapping[int, int],
    *,
    decode: Callable[[bytes], dict[str, Any]],
    xids: set[int],
    timeout_s: float = PAST_END_TIMEOUT_S,
) -> Commits:
    """The commit events of `xids` on the control topic from `starts` (partition -> offset) on,
    read `read_committed` until all are found or `timeout_s` passed."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            **consumer_settings,
            "group.id": "bottledwater-merge-commits",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    found: Commits = {}
    try:
        consumer.assign([TopicPartition(control_topic, p, o) for p, o in starts.items()])
        deadline = time.monotonic() + timeout_s
        while not xids <= found.keys() and time.monotonic() < deadline:
            for message in consumer.consume(500, 0.5):
                value = message.value()
                if message.error() is not None or value is None:
                    continue
                found.update({x: c for x, c in commits_of([decode(value)]).items() if x in xids})
    finally:
        consumer.close()
    log.info(
        "read the control topic past the batch's end for %d commit events: %d found", len(xids), len(found)
    )
    return found
