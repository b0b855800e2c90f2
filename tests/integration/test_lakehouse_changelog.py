"""The lake's changelog (merge --changelog): every batch's records of every table in one Delta
commit, exactly Kafka's records, a position proven for all tables at once, replays adding nothing, a
merge without it refused, a parked table's changes replayed from it after Kafka no longer has them,
a mirror rebuilt from it equal to the merged one, and retention."""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource
from delta.tables import DeltaTable
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from kafka_contract.topics import control_topic_name
from spark_jobs import consistent_read
from spark_jobs.connections.kafka_source import RECORD_COLUMNS, KafkaSource, list_partitions
from spark_jobs.lake import changelog, local_log, watermark_io
from spark_jobs.maintenance import maintain_changelog
from spark_jobs.merge import ChangelogRequired
from spark_jobs.merge_options import MergeOptions
from spark_jobs.merging.changelog_writer import ChangelogWriter
from spark_jobs.reading.consistent import NoCommonWatermark, read_consistent
from spark_jobs.reading.result import summary
from spark_jobs.reading.views import query_rows
from spark_jobs.rebuild import RebuildRefused, rebuild
from spark_jobs.rules import layout
from tests.integration.conftest import unique_name
from tests.integration.lakehouse import (
    LakeCase,
    assert_delta_equals_postgres,
    assert_same_rows,
    postgres_frame,
    running_worker,
)
from tests.integration.test_lakehouse_changelog_reads import _count, _newest_lsn, _prove
from tests.integration.test_lakehouse_many_tables import (
    _create,
    _parked_topics,
    _set_key_property,
    _touch_all,
)


def _kafka_records(lake: LakeCase) -> DataFrame:
    """Every record under the test's prefix and its control topic, as Kafka holds them now."""
    topics = [t for t in list_partitions(KafkaSource(lake.bootstrap)) if t.startswith(lake.prefix + ".")]
    return (
        lake.spark.read.format("kafka")
        .option("kafka.bootstrap.servers", lake.bootstrap)
        .option("subscribe", ",".join(sorted(topics)))
        .option("startingOffsets", "earliest")
        .option("includeHeaders", "true")
        .load()
        .select(*RECORD_COLUMNS)
    )


def _changelog_records(lake: LakeCase) -> DataFrame:
    return lake.spark.read.format("delta").load(layout.changelog_path(lake.warehouse)).select(*RECORD_COLUMNS)


_DICTIONARY = {"PLAIN_DICTIONARY", "RLE_DICTIONARY"}


def _column_encodings(files: Iterable[Path]) -> dict[str, set[str]]:
    """Every Parquet encoding each column (by its path in the schema) is written with in `files`."""
    encodings: dict[str, set[str]] = {}
    for file in files:
        metadata = pq.ParquetFile(file).metadata
        for group in range(metadata.num_row_groups):
            for index in range(metadata.num_columns):
                column = metadata.row_group(group).column(index)
                encodings.setdefault(column.path_in_schema, set()).update(column.encodings)
    return encodings


def _drop_from_kafka(lake: LakeCase, topic: str) -> None:
    """Kafka's retention, now: every record of `topic` deleted (DeleteRecords needs the delete policy
    beside the compaction the worker sets)."""
    admin = AdminClient({"bootstrap.servers": lake.bootstrap})
    policy = ConfigEntry("cleanup.policy", "compact,delete", incremental_operation=AlterConfigOpType.SET)
    for future in admin.incremental_alter_configs(
        [ConfigResource("topic", topic, incremental_configs=[policy])]
    ).values():
        future.result(30)
    partitions = admin.list_topics(topic, timeout=30).topics[topic].partitions
    # OFFSET_END: up to each partition's high watermark.
    wanted = [TopicPartition(topic, p, -1) for p in partitions]
    for future in admin.delete_records(wanted).values():
        future.result(30)


def test_the_changelog_holds_every_batch_in_one_commit_and_a_parked_table_replays_from_it(
    lake: LakeCase, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    names = [unique_name("ok"), unique_name("broken")]
    broken = names[1]
    _create(lake, names)
    with running_worker(lake, fmt="avro", tables="public.*", partitions=2) as worker:
        worker.wait_caught_up()
        lake.merge_all(changelog=True)
        _touch_all(lake, names, 1)
        worker.wait_caught_up()
        lake.merge_all(changelog=True)

        # Exactly Kafka's records of every table, each once, and the control topic's it read (the
        # worker's progress events go on arriving after the run).
        control = control_topic_name(lake.prefix)
        kafka, logged = _kafka_records(lake), _changelog_records(lake)
        tables_kafka, tables_logged = (
            kafka.where(F.col("topic") != control),
            logged.where(F.col("topic") != control),
        )
        assert tables_kafka.count() == tables_logged.count() > 0
        assert tables_kafka.exceptAll(tables_logged).count() == 0
        assert tables_logged.exceptAll(tables_kafka).count() == 0
        assert logged.exceptAll(kafka).count() == 0
        path = layout.changelog_path(lake.warehouse)
        rows = lake.spark.read.format("delta").load(path)
        assert {r["topic"] for r in rows.select("topic").distinct().collect()} == {
            *(lake.topic(n) for n in names),
            control,
        }
        # One commit per batch, for all tables: as many commits as batches in it.
        commits = changelog.commits(lake.spark, lake.warehouse)
        batches = rows.select(changelog.BATCH).distinct().count()
        assert len(commits) == batches >= 2
        history = DeltaTable.forPath(lake.spark, path).history()
        assert history.where(F.col("operation") == "WRITE").count() == len(commits)
        # Its files' statistics bound the columns readers filter by (a slice by topic or position
        # skips files), not the records' bytes.
        actions = local_log.commit_actions(path, local_log.commit_versions(path) or [])
        stats = [json.loads(action["add"]["stats"]) for _, action in actions if "add" in action]
        assert stats and all(set(s["nullCount"]) == set(changelog.STATS_COLUMNS) for s in stats), stats[0]
        # The records' bytes are written without a dictionary (one value per record: it would fill up
        # in every file), the headers' names with one.
        files = [Path(path, action["add"]["path"]) for _, action in actions if "add" in action]
        encodings = _column_encodings(files)
        assert all(not encodings[c] & _DICTIONARY for c in changelog.PLAIN_COLUMNS), encodings
        assert encodings["headers.list.element.key"] & _DICTIONARY, encodings
        # The position the newest commit proves holds for all tables at once: at least the oldest of
        # the mirrors' own watermarks (proven from the same events, each for its own topic; a newer
        # event proven for one table may not be for both yet), and never back from one commit to the
        # next.
        head = changelog.newest(lake.spark, lake.warehouse)
        assert head is not None and head.watermark > 0
        marks = [watermark_io.stored_mark(lake.spark, lake.path(n)).watermark for n in names]
        assert head.watermark >= min(marks) > 0, (head, marks)
        positions = [c.watermark for _, c in commits]
        assert positions == sorted(positions), positions

        # A merge without it would leave a hole in it: refused, in one line that names the fix.
        with pytest.raises(ChangelogRequired, match=r"merge with it \(drop --no-changelog\), or delete"):
            lake.merge_all()

        # A batch committed again (the query replayed after a crash) adds nothing.
        version, last = commits[-1]
        writer = ChangelogWriter(lake.warehouse)
        replayed = lake.spark.read.format("delta").option("versionAsOf", version).load(path)
        rebatch = replayed.where(F.col(changelog.BATCH) == last.batch).select(*RECORD_COLUMNS)
        writer.write(
            lake.spark, rebatch, query_id=last.query, checkpoint=None, batch_id=last.batch,
            ends=last.ends, events=[], table_records=True,
        )  # fmt: skip
        assert _changelog_records(lake).count() == logged.count()

        # A table that fails is parked; its records wait in the changelog.
        _set_key_property(lake, broken, ("nope",))
        _touch_all(lake, names, 2)
        worker.wait_caught_up()
        runs = lake.merge_all(changelog=True)
        assert runs[broken].error and "the key is now" in runs[broken].error, runs[broken]
        assert _parked_topics(lake) == {lake.topic(broken)}

        # Read through the changelog, the parked table is as fresh as the other: its mirror trails,
        # its tail waits in the changelog, and the read at the changelog's position equals Postgres.
        wanted = _newest_lsn(lake, names[:1])
        head = _prove(lake, wanted)
        options = MergeOptions(lake.warehouse, "avro", lake.registry, lake.prefix)
        fresh = read_consistent(lake.spark, lake.warehouse, [f"public.{n}" for n in names], tail_from=options)
        assert fresh.position == head.watermark and fresh.changelog_version is not None
        behind = fresh.tables[f"public.{broken}"]
        assert behind.tail_after is not None and behind.tail_after < wanted, behind
        assert summary(fresh)["tables"][f"public.{broken}"]["from"] == "mirror+changelog"
        for name in names:
            frame = fresh.frame(f"public.{name}").drop(*layout.META_COLUMNS)
            assert_same_rows(frame, postgres_frame(lake.spark, lake.dsn, name, frame))
        # The same read as SQL: every table a view at the position, registered in one call; the CLI's
        # --sql prints query_rows of them.
        views = fresh.register_views(prefix="fresh_")
        assert views == {f"public.{n}": f"fresh_{n}" for n in names}
        union = " UNION ALL ".join(f"SELECT '{n}' AS t, count(*) AS n FROM fresh_{n}" for n in names)
        answer = query_rows(lake.spark, union)
        assert answer["truncated"] is False
        assert {r["t"]: r["n"] for r in answer["rows"]} == {n: _count(lake, n) for n in names}
        sliced = lake.spark.sql(f"SELECT * FROM fresh_{broken}").drop(*layout.META_COLUMNS)
        assert_same_rows(sliced, postgres_frame(lake.spark, lake.dsn, broken, sliced))
        # The CLI with nothing but the warehouse and the table (no -r, nor the worker's variable):
        # the changelog records how its records are decoded.
        monkeypatch.delenv("BOTTLEDWATER_SCHEMA_REGISTRY", raising=False)
        assert consistent_read.main(["--warehouse", lake.warehouse, f"public.{broken}"]) == 0
        printed = json.loads(capsys.readouterr().out)
        assert (printed["position"], printed["not_fresh"]) == (head.watermark, None), printed
        assert printed["tables"][f"public.{broken}"]["from"] == "mirror+changelog"
        # The library alike; through the mirrors alone the read is behind, and says why.
        recorded = read_consistent(lake.spark, lake.warehouse, [f"public.{n}" for n in names])
        assert (recorded.position, recorded.not_fresh) == (head.watermark, None)
        with contextlib.suppress(NoCommonWatermark):
            stale = read_consistent(
                lake.spark, lake.warehouse, [f"public.{n}" for n in names], through_changelog=False
            )
            assert stale.position < wanted and stale.not_fresh, stale

    # Kafka's retention takes its records before the operator's fix: the changelog still has them.
    _drop_from_kafka(lake, lake.topic(broken))
    _set_key_property(lake, broken, ("id",))
    runs = lake.merge_all(changelog=True)
    assert not [r.error for r in runs.values() if r.error], runs
    assert runs[broken].messages, "the parked changes were not replayed"
    assert _parked_topics(lake) == set()
    for name in names:
        assert_delta_equals_postgres(lake.spark, lake.path(name), lake.dsn, name)

    # A mirror rebuilt from the changelog alone equals the merged one, metadata columns included.
    ok = names[0]
    merged = lake.spark.read.format("delta").load(lake.path(ok)).collect()
    done = rebuild(
        lake.spark, MergeOptions(lake.warehouse, "avro", lake.registry, lake.prefix), f"public.{ok}"
    )
    assert done.replaced is not None and done.messages > 0
    assert done.mark.watermark >= head.watermark
    rebuilt = lake.spark.read.format("delta").load(lake.path(ok)).collect()
    assert sorted(map(tuple, rebuilt)) == sorted(map(tuple, merged))
    assert_delta_equals_postgres(lake.spark, lake.path(ok), lake.dsn, ok)

    # Retention: the rows past it go, the newest batch's stay (its position), so does the position.
    before = _changelog_records(lake).count()
    newest_batch = changelog.commits(lake.spark, lake.warehouse)[-1][1].batch
    result = maintain_changelog(
        lake.spark,
        lake.warehouse,
        timedelta(0),
        vacuum_hours=None,
        now=datetime.now(UTC) + timedelta(seconds=1),
    )
    assert result is not None and 0 < result.trimmed < before
    left = lake.spark.read.format("delta").load(path)
    assert {r[0] for r in left.select(changelog.BATCH).distinct().collect()} == {newest_batch}
    kept = changelog.newest(lake.spark, lake.warehouse)
    assert kept is not None and kept.watermark >= head.watermark
    assert re.fullmatch(r".*/_bw_state/changelog", result.path)
    # Its first messages gone, the changelog can no longer rebuild a table: refused, naming the remedy.
    with pytest.raises(RebuildRefused, match="re-snapshot the table instead"):
        rebuild(lake.spark, MergeOptions(lake.warehouse, "avro", lake.registry, lake.prefix), f"public.{ok}")
