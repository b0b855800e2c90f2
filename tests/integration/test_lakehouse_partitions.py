"""The lake follows what the worker publishes: one Delta mirror for a partitioned table captured as
one (`--partitions root`), equal to the root in Postgres after rows moved between partitions, a leaf
truncated and a partition created, and whose rows of a partition detached since `verify` reports as
extra; a mirror of the published columns and rows of a table with a column list and a row filter,
which `verify` finds equal."""

from __future__ import annotations

from spark_jobs.verify import verify_table
from tests.integration.lakehouse import (
    LakeCase,
    assert_delta_equals_postgres,
    delta_data,
    execute,
    running_worker,
)
from tests.integration.worker_harness import query


def test_one_mirror_for_a_partitioned_table(lake: LakeCase) -> None:
    execute(
        lake.dsn,
        "CREATE TABLE orders (id int, region text, month int, total numeric(10,2),"
        " PRIMARY KEY (id, region, month)) PARTITION BY LIST (region)",
        "CREATE TABLE orders_eu PARTITION OF orders FOR VALUES IN ('eu') PARTITION BY RANGE (month)",
        "CREATE TABLE orders_eu_h1 PARTITION OF orders_eu FOR VALUES FROM (1) TO (7)",
        "CREATE TABLE orders_eu_h2 PARTITION OF orders_eu FOR VALUES FROM (7) TO (13)",
        "CREATE TABLE orders_rest PARTITION OF orders DEFAULT",
        "INSERT INTO orders SELECT g, (ARRAY['eu', 'us'])[g % 2 + 1], g % 12 + 1, g / 4.0"
        " FROM generate_series(1, 400) g",
    )
    with lake.worker("avro", "orders") as worker:
        worker.wait_caught_up()
        lake.merge("orders")
        execute(
            lake.dsn,
            "UPDATE orders SET region = 'eu' WHERE region = 'us' AND id % 5 = 0",  # across leaves
            "UPDATE orders SET month = 9 WHERE region = 'eu' AND month = 2",  # across sub-partitions
            "TRUNCATE orders_eu_h1",
            "CREATE TABLE orders_apac PARTITION OF orders FOR VALUES IN ('apac')",
            "INSERT INTO orders VALUES (1000, 'apac', 3, 1.5), (1001, 'eu', 4, 2.5)",
            "DELETE FROM orders WHERE id % 13 = 0",
        )
        worker.wait_caught_up()
    runs = lake.merge_all()
    assert set(runs) == {"orders"}, "one topic, one mirror: the root's"
    assert_delta_equals_postgres(lake.spark, lake.path("orders"), lake.dsn, "orders")
    # A DETACH sends nothing through pgoutput: the partition's rows stay in the mirror, and `verify`
    # reports exactly them as extra (docs/worker.md, Partitioned tables).
    ((detached,),) = query(lake.dsn, "SELECT count(*) FROM orders_eu_h2")
    execute(lake.dsn, "ALTER TABLE orders_eu DETACH PARTITION orders_eu_h2")  # a sub-partition
    diff = verify_table(lake.spark, lake.path("orders"), lake.dsn)
    assert detached > 0 and diff.counts["extra_in_delta"] == detached, diff.counts
    assert sum(diff.counts.values()) == detached, diff.counts


def test_a_mirror_holds_the_published_columns_and_rows(lake: LakeCase) -> None:
    """Column lists and row filters (Postgres 15+): the mirror has only the published columns and the
    rows of the filter, through updates that move rows into and out of it; `verify` compares it
    with exactly those rows and finds it equal."""
    execute(
        lake.dsn,
        "CREATE TABLE accounts (id int PRIMARY KEY, region text NOT NULL, secret text, balance int)",
        # The filter's column in the replica identity (and so in the key), the secret out of both.
        "CREATE UNIQUE INDEX accounts_identity ON accounts (id, region)",
        "ALTER TABLE accounts REPLICA IDENTITY USING INDEX accounts_identity",
        "INSERT INTO accounts SELECT g, (ARRAY['eu', 'us'])[g % 2 + 1], 's' || g, g"
        " FROM generate_series(1, 200) g",
    )
    selection = ("--columns", "accounts=id,region,balance", "--row-filter", "accounts=region = 'eu'")
    with running_worker(lake, fmt="avro", tables="public.accounts", extra_args=selection) as worker:
        worker.wait_caught_up()
        lake.merge("accounts")
        execute(
            lake.dsn,
            "UPDATE accounts SET region = 'us' WHERE id IN (2, 4, 6)",  # out of the filter: deleted
            "UPDATE accounts SET region = 'eu' WHERE id IN (1, 3)",  # into it: inserted
            "UPDATE accounts SET balance = -1 WHERE id IN (8, 9)",
            "DELETE FROM accounts WHERE id = 10",
        )
        worker.wait_caught_up()
    lake.merge("accounts")
    mirror = delta_data(lake.spark, lake.path("accounts"))
    assert mirror.columns == ["id", "region", "balance"], "only the published columns"
    assert_delta_equals_postgres(lake.spark, lake.path("accounts"), lake.dsn, "accounts")  # the filter's rows
    # 100 even ids in 'eu', three moved out, two moved in, one deleted.
    assert {r["region"] for r in mirror.collect()} == {"eu"} and mirror.count() == 98
    diff = verify_table(lake.spark, lake.path("accounts"), lake.dsn)
    assert diff.equal and diff.postgres_rows == mirror.count(), diff.counts
