"""A local Delta table's commits read from its log files (`lake.local_log`) give what Delta's own
history gives: the same versions and user metadata, the same newest `limit`; a table elsewhere is
left to Delta."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from spark_jobs.lake import delta_tables, local_log

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def _history(spark: SparkSession, path: str, limit: int | None) -> list[tuple[int, str]]:
    from delta.tables import DeltaTable

    rows = DeltaTable.forPath(spark, path).history(limit).where("userMetadata IS NOT NULL").collect()
    return sorted((int(r["version"]), str(r["userMetadata"])) for r in rows)


def test_the_commit_files_give_what_deltas_history_gives(spark: SparkSession, tmp_path: Path) -> None:
    path = str(tmp_path / "marked")
    frame = spark.range(3)
    for n in range(7):
        writer = frame.write.format("delta").mode("append")
        if n % 3 != 1:  # some commits carry no metadata, as a maintenance commit does not
            writer = writer.option("userMetadata", f'{{"n": {n}, "text": "line\\nbreak"}}')
        writer.save(path)
    for limit in (None, 1, 2, 4, 20):
        expected = _history(spark, path, limit)
        assert local_log.commits_with_metadata(path, limit) == expected, limit
        assert local_log.commits_with_metadata(f"file://{path}", limit) == expected, limit
        assert delta_tables.commit_metadata(spark, path, limit) == expected, limit
    assert [v for v, _ in local_log.commits_with_metadata(path) or []] == [0, 2, 3, 5, 6]


def test_a_table_not_on_the_local_file_system_is_left_to_delta(tmp_path: Path) -> None:
    assert local_log.commits_with_metadata("s3a://lake/public/t") is None
    assert local_log.commits_with_metadata(str(tmp_path / "no-table")) is None
    assert local_log.local_path("abfss://c@a.dfs.core.windows.net/t") is None
    assert local_log.local_path("file:///tmp/t") == Path("/tmp/t")
