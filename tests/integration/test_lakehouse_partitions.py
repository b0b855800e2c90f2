"""The lake follows a partitioned table captured as one (`--partitions root`): one Delta mirror for
the root, equal to the root in Postgres after rows moved between partitions, a leaf truncated and a
sub-partition created."""

from __future__ import annotations

from tests.integration.lakehouse import LakeCase, assert_delta_equals_postgres, execute


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
