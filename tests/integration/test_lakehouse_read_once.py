"""The merge reads each batch from Kafka once and keeps its records only while the batch runs."""

from __future__ import annotations

from psycopg2 import sql

from tests.integration.conftest import unique_name
from tests.integration.lakehouse import LakeCase, assert_delta_equals_postgres, execute


def test_a_merged_batch_leaves_no_kept_records_behind(lake: LakeCase) -> None:
    name = unique_name("orders")
    table = sql.Identifier(name)
    execute(
        lake.dsn,
        sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, note text)").format(table),
        sql.SQL("INSERT INTO {} SELECT i, 'n' || i FROM generate_series(1, 50) AS i").format(table),
    )
    context = lake.spark.sparkContext._jsc
    kept_before = set(context.getPersistentRDDs().keys())
    with lake.worker("avro", name) as worker:
        worker.wait_caught_up()
        execute(
            lake.dsn,
            sql.SQL("UPDATE {} SET note = note || ' v2' WHERE id % 2 = 0").format(table),
            sql.SQL("DELETE FROM {} WHERE id % 7 = 0").format(table),
        )
        worker.wait_caught_up()
    run = lake.merge(name)
    assert run.error is None and run.messages > 50
    assert_delta_equals_postgres(lake.spark, run.path, lake.dsn, name)
    # read_once's local checkpoint (and the decoded rows' cache) are released when the batch ends.
    # Delta keeps each table's log state cached ("Delta Table State ..."): its own, not the merge's.
    kept = context.getPersistentRDDs()
    left = [str(rdd.toString()) for k, rdd in kept.items() if k not in kept_before]
    assert [rdd for rdd in left if not rdd.startswith("Delta Table State")] == []
