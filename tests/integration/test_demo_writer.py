"""The demo writer against the sample schema of `make demo`, on the stack's Postgres."""

from __future__ import annotations

import psycopg2

from stack.demo import SAMPLE_ROWS, SAMPLE_SCHEMA
from stack.demo_writer import DemoWriter

COUNTS = (
    "SELECT (SELECT count(*) FROM public.customers), (SELECT count(*) FROM public.orders), "
    "(SELECT count(*) FROM public.page_views), (SELECT sum(price) FROM inventory.products)"
)


def test_the_writer_changes_the_sample_database(fresh_db: str) -> None:
    with psycopg2.connect(fresh_db) as conn, conn.cursor() as cur:
        cur.execute(SAMPLE_SCHEMA)
        cur.execute(SAMPLE_ROWS)
        cur.execute(COUNTS)
        before = cur.fetchone()
    writer = DemoWriter(fresh_db, rate=1000, seed=11)
    assert writer.run(steps=200) == 200
    with conn.cursor() as cur:
        cur.execute(COUNTS)
        after = cur.fetchone()
    conn.close()
    assert before is not None and after is not None
    customers, orders, views, prices = after
    assert customers > before[0] and orders > before[1] and views > before[2]
    assert prices != before[3]  # prices changed
