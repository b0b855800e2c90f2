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


def test_the_commit_files_list_the_versions_and_files_delta_knows(
    spark: SparkSession, tmp_path: Path
) -> None:
    from delta.tables import DeltaTable

    path = str(tmp_path / "appended")
    for _ in range(3):
        spark.range(5).repartition(2).write.format("delta").mode("append").save(path)
    versions = local_log.commit_versions(path)
    assert versions == sorted(r["version"] for r in DeltaTable.forPath(spark, path).history().collect())
    actions = local_log.commit_actions(path, versions)
    added = {a["add"]["path"] for _, a in actions if "add" in a}
    in_table = {Path(f).name for f in spark.read.format("delta").load(path).inputFiles()}
    assert added == in_table and len(added) == 6
    assert [v for v, a in actions if "commitInfo" in a] == versions
    assert local_log.commit_actions(path, [versions[-1], 99]) == [a for a in actions if a[0] == versions[-1]]
    assert local_log.commit_versions(str(tmp_path / "no-table")) is None


def test_a_tables_properties_and_newest_version_from_its_commit_files_equal_deltas(
    spark: SparkSession, tmp_path: Path
) -> None:
    from delta.tables import DeltaTable

    path = str(tmp_path / "with_properties")
    spark.range(2).write.format("delta").option("delta.appendOnly", "false").save(path)
    delta_tables.set_property(spark, path, "bottledwater.probe", "1")
    delta_tables.set_property(spark, path, "bottledwater.probe", "2")
    for _ in range(3):  # commits that do not change the metadata
        spark.range(2).write.format("delta").mode("append").save(path)

    def deltas() -> dict[str, str]:
        return dict(DeltaTable.forPath(spark, path).detail().select("properties").collect()[0][0])

    assert delta_tables.table_properties(spark, path) == deltas()
    assert delta_tables.table_properties(spark, path)["bottledwater.probe"] == "2"
    metadata = local_log.newest_metadata(path)
    assert metadata is not None and metadata["configuration"]["bottledwater.probe"] == "2"
    # Without the newest version's checksum file: the commit files, or Delta when they do not say.
    (tmp_path / "with_properties" / "_delta_log" / f"{5:020d}.crc").unlink()
    from_commits = local_log.newest_metadata(path)
    assert from_commits is not None and from_commits["configuration"] == metadata["configuration"]
    assert delta_tables.table_properties(spark, path) == deltas()
    assert local_log.newest_metadata(path, within=3) is None
    history = DeltaTable.forPath(spark, path).history(1).collect()[0]["version"]
    assert delta_tables.newest_version(spark, path) == history == 5
    assert delta_tables.table_exists(spark, path)
    assert not delta_tables.table_exists(spark, str(tmp_path / "none"))
    assert delta_tables.newest_version(spark, str(tmp_path / "none")) == -1


def test_a_versions_column_names_from_its_commit_files_equal_deltas(
    spark: SparkSession, tmp_path: Path
) -> None:
    from spark_jobs.rules.names import delta_path

    path = str(tmp_path / "widened")
    spark.sql("SELECT 1L AS id, 'a' AS `x.y z`").write.format("delta").option(
        "delta.columnMapping.mode", "name"
    ).save(path)
    spark.sql(f"ALTER TABLE {delta_path(path)} ADD COLUMNS (`it's` string)")  # version 1
    spark.sql("SELECT 2L AS id, 'b' AS `x.y z`, 'c' AS `it's`").write.format("delta").mode("append").save(
        path
    )

    def deltas(version: int) -> list[str]:
        return spark.read.format("delta").option("versionAsOf", version).load(path).columns

    assert deltas(0) == ["id", "x.y z"]
    for version in range(3):
        assert local_log.column_names_at(path, version) == deltas(version), version
        assert delta_tables.column_names_at(spark, path, version) == deltas(version), version
    # Without a version's checksum file: its metadata from the commit files up to it.
    for version in range(3):
        (tmp_path / "widened" / "_delta_log" / f"{version:020d}.crc").unlink(missing_ok=True)
    assert [local_log.column_names_at(path, v) for v in range(3)] == [deltas(v) for v in range(3)]
    assert local_log.column_names_at("s3a://lake/public/t", 0) is None
