"""`verify` as the demo's banner runs it, on the demo's own schema: keyed tables in two schemas and
the keyless `page_views` (insert-only, a row held twice) compared as multisets, every table equal
after the demo writer's inserts, updates and deletes; then a keyless table whose topic carried an
update is refused in one line, and a row deleted from `page_views` (its delete never published)
reported as extra in Delta, counted per occurrence."""

from __future__ import annotations

import pytest
from psycopg2 import sql

from spark_jobs import verify
from stack.demo import SAMPLE_ROWS, SAMPLE_SCHEMA
from stack.demo_writer import DemoWriter
from tests.integration.lakehouse import LakeCase, execute, running_worker

# REPLICA IDENTITY FULL without a key: its updates are published (with no key), its deletes not.
FULL_TABLE = "visits"
DUPLICATE_VIEW = "/twice"


def test_verify_as_the_demo_banner_runs_it(lake: LakeCase, capsys: pytest.CaptureFixture[str]) -> None:
    visits = sql.Identifier("public", FULL_TABLE)
    execute(
        lake.dsn,
        SAMPLE_SCHEMA,
        SAMPLE_ROWS,
        # One statement, so one now(): two identical rows, which Postgres allows without a key.
        ("INSERT INTO public.page_views (path) VALUES (%s), (%s)", (DUPLICATE_VIEW, DUPLICATE_VIEW)),
        sql.SQL("CREATE TABLE {} (path text, n int)").format(visits),
        sql.SQL("ALTER TABLE {} REPLICA IDENTITY FULL").format(visits),
        sql.SQL("INSERT INTO {} VALUES ('/', 1), ('/', 1), ('/a', 2)").format(visits),
    )
    # The banner's command line, with the demo's environment (the worker's -u, every table).
    argv = ["--warehouse", lake.warehouse, "-d", lake.dsn]
    with running_worker(lake, fmt="avro", tables="*", extra_args=["--allow-unkeyed"]) as worker:
        worker.wait_caught_up()
        DemoWriter(lake.dsn, rate=1000, seed=5).run(steps=40)  # new rows, updates, deletes, views
        worker.wait_caught_up()
        runs = lake.merge_all()
        assert sorted(runs) == sorted(["customers", "orders", "inventory.products", "page_views", FULL_TABLE])

        assert verify.main(argv) == 0
        printed = capsys.readouterr().out.splitlines()
        assert len(printed) == 5 and all(line.endswith(": equal") for line in printed), printed
        (views,) = [line for line in printed if line.startswith("public.page_views ")]
        assert "(no key: compared as multisets of rows)" in views

        execute(
            lake.dsn,
            sql.SQL("UPDATE {} SET n = 3 WHERE path = '/a'").format(visits),
            (
                "DELETE FROM public.page_views WHERE ctid = "
                "(SELECT ctid FROM public.page_views WHERE path = %s LIMIT 1)",
                (DUPLICATE_VIEW,),
            ),
        )
        worker.wait_caught_up()
    lake.merge_all()

    # Only the two keyless tables: the keyed ones were shown equal above. The worker is stopped, so the
    # lake proves no newer position: nothing to settle, the first comparison is the answer.
    only = ["--table", f"public.{FULL_TABLE}", "--table", "public.page_views", "--settle-seconds", "0"]
    assert verify.main([*argv, *only]) == 1
    lines = capsys.readouterr().out.splitlines()
    (refused,) = [line for line in lines if line.startswith(f"public.{FULL_TABLE} ")]
    views = [line for line in lines if line != refused]
    assert "CANNOT VERIFY: no key and its topic carries 1 update event(s)" in refused
    # The delete was never published: one occurrence of the twice-held row is extra in Delta.
    head, extra, hint = views
    assert head.startswith("public.page_views ") and head.endswith(": DIFFERENT")
    assert extra.startswith(f'  extra_in_delta (1): {{"path": "{DUPLICATE_VIEW}", ') and "×" not in extra
    assert "deletes of this table are never published" in hint
