"""The quality checks, verify and maintenance on a real mirror: they pass on a faithful table and
catch a planted duplicate, a NULL key and a missing row."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from delta.tables import DeltaTable
from psycopg2 import sql
from pyspark.sql import functions as F

from spark_jobs import maintenance, merge, quality, verify
from tests.integration.conftest import unique_name
from tests.integration.lakehouse import LakeCase, execute


def test_checks_pass_on_a_mirror_and_catch_planted_faults(
    lake: LakeCase, capsys: pytest.CaptureFixture[str]
) -> None:
    name = unique_name("customers")
    table = sql.Identifier(name)
    execute(
        lake.dsn,
        sql.SQL(
            "CREATE TABLE {} (id int PRIMARY KEY, email text, balance numeric(12,2), seen timestamptz)"
        ).format(table),
        sql.SQL(
            "INSERT INTO {} SELECT i, 'c' || i || '@example.com', i * 3.5, now() "
            "FROM generate_series(1, 40) i"
        ).format(table),
    )
    with lake.worker("avro", name) as worker:
        worker.wait_caught_up()
    # Through the merge job's command line, in this process (so on the shared session).
    argv = ["-b", lake.bootstrap, "-r", lake.registry, "-p", lake.prefix, "--warehouse", lake.warehouse,
            "--checkpoints", lake.checkpoints, "--topic-pattern", re.escape(lake.topic(name))]  # fmt: skip
    assert merge.main(argv) == 0
    path = lake.path(name)
    spark = lake.spark

    clean = quality.run_checks(spark, path, lake.dsn, max_lag=timedelta(hours=1))
    assert [(r.name, r.passed) for r in clean] == [
        ("key_uniqueness", True),
        ("non_null_keys", True),
        ("freshness", True),
        ("schema_drift", True),
        ("reconciliation", True),
    ]
    assert verify.verify_table(spark, path, lake.dsn).equal
    assert not quality.freshness(spark, path, max_lag=timedelta(seconds=0)).passed

    # A duplicate of row 7, a row with a NULL key, and row 5 gone.
    rows = spark.read.format("delta").load(path)
    rows.where("id = 7").write.format("delta").mode("append").save(path)
    rows.where("id = 9").withColumn("id", F.lit(None).cast("int")).write.format("delta").mode("append").save(
        path
    )
    DeltaTable.forPath(spark, path).delete("id = 5")

    duplicate = quality.key_uniqueness(spark, path)
    assert (duplicate.passed, duplicate.metadata["duplicate_keys"]) == (False, 1)
    assert duplicate.metadata["sample"] == [{"id": 7, "count": 2}]
    null_key = quality.non_null_keys(spark, path)
    assert (null_key.passed, null_key.metadata["null_key_rows"]) == (False, 1)
    reconciled = quality.reconciliation(spark, path, lake.dsn)
    assert not reconciled.passed
    assert (reconciled.metadata["delta_rows"], reconciled.metadata["postgres_rows"]) == (41, 40)
    # Over a key range that excludes every planted fault, both sides agree again.
    assert quality.reconciliation(spark, path, lake.dsn, key_range=("id", 10, 40)).passed

    diff = verify.verify_table(spark, path, lake.dsn)
    assert diff.missing_in_delta == ['{"id": 5}']
    assert diff.counts == {
        "missing_in_delta": 1,
        "extra_in_delta": 1,
        "different": 0,
        "duplicate_in_delta": 1,
    }
    assert (diff.extra_in_delta, diff.duplicate_in_delta) == (['{"id": null}'], ['{"id": 7}'])
    assert '{"id": 5}' in verify.report(diff)
    assert verify.main(["--warehouse", lake.warehouse, "-d", lake.dsn]) == 1
    printed = capsys.readouterr().out
    assert 'missing_in_delta (1): {"id": 5}' in printed and "DIFFERENT" in printed

    # A column added in Postgres and not (yet) in the lake is drift.
    execute(lake.dsn, sql.SQL("ALTER TABLE {} ADD COLUMN tier text").format(table))
    drift = quality.schema_drift(spark, path, lake.dsn)
    assert (drift.passed, drift.metadata["missing_in_delta"]) == (False, ["tier"])

    # Maintenance keeps the data: compaction Z-ordered by the key, then VACUUM.
    before = spark.read.format("delta").load(path).count()
    results = maintenance.maintain(spark, lake.warehouse, vacuum_hours=0.0, force=True)
    assert [r.path for r in results] == [path]
    assert spark.read.format("delta").load(path).count() == before
    operations = [r["operation"] for r in DeltaTable.forPath(spark, path).history().collect()]
    assert "OPTIMIZE" in operations and "VACUUM END" in operations
