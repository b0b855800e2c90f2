"""The demo's banner commands as the demo runs them, on its own schema: the worker streaming, the
continuous merge keeping the lake's changelog with the mirrors behind it (the demo's settings) and
the demo writer writing all along. `verify` exits 0 although the lake trails the source (the keys in
flight settle: read again at one source position once the lake proves it), keyed tables in two
schemas and the keyless `page_views` (insert-only, a row held twice) compared as multisets;
`consistent_read` exits 0. Then, the pipeline stopped, a keyless table whose topic carried an update
is refused in one line, and a row deleted from `page_views` (its delete never published) reported as
extra in Delta, counted per occurrence."""

from __future__ import annotations

import threading
import time

import pytest
from psycopg2 import sql

from spark_jobs import consistent_read, verify
from spark_jobs.lake import warehouse
from spark_jobs.merge_options import MergeOptions
from spark_jobs.reading.consistent import NoCommonWatermark, read_consistent
from stack.demo import DEMO_MIRROR_BUDGET_S, SAMPLE_ROWS, SAMPLE_SCHEMA
from stack.demo_writer import DEFAULT_RATE, DemoWriter
from tests.integration.lakehouse import ContinuousMerge, LakeCase, continuous_merge, execute, running_worker
from tests.integration.test_lakehouse_changelog_reads import _newest_changelog_lsn, _prove

# REPLICA IDENTITY FULL without a key: its updates are published (with no key), its deletes not.
FULL_TABLE = "visits"
DUPLICATE_VIEW = "/twice"
TABLES = ("customers", "orders", "inventory.products", "page_views", FULL_TABLE)
# Shorter than the demo's 10 s, so that the test is quick; the lake still trails the writer.
TRIGGER_S = 4.0


def test_the_demo_banners_commands_exit_0_on_the_live_demo(
    lake: LakeCase, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
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
    # What the changelog records decodes the lake (the banner gives no prefix or format).
    for variable in ("BOTTLEDWATER_TOPIC_PREFIX", "BOTTLEDWATER_OUTPUT_FORMAT"):
        monkeypatch.delenv(variable, raising=False)
    # The banner's command lines, with the demo's environment (the worker's -u, every table).
    argv = ["--warehouse", lake.warehouse, "-d", lake.dsn]
    read_argv = ["--warehouse", lake.warehouse, "-r", lake.registry, "public.customers", "public.orders"]
    options = MergeOptions(
        lake.warehouse,
        "avro",
        lake.registry,
        lake.prefix,
        changelog=True,
        mirror_budget_s=float(DEMO_MIRROR_BUDGET_S),
    )
    writer = DemoWriter(lake.dsn, rate=DEFAULT_RATE * 2, seed=5)
    with running_worker(lake, fmt="avro", tables="*", extra_args=["--allow-unkeyed"]) as worker:
        worker.wait_caught_up()
        topics = [lake.topic(t) for t in TABLES]
        with continuous_merge(lake, options, topics, TRIGGER_S) as merge:
            writing = threading.Thread(target=writer.run, daemon=True)  # new rows, updates, deletes, views
            writing.start()
            try:
                _wait_for_every_mirror(lake, merge, writer)
                before = writer.done
                assert verify.main(argv) == 0, capsys.readouterr()
                assert writer.done > before  # the source moved while verify ran
                printed = capsys.readouterr().out.splitlines()
                assert len(printed) == len(TABLES) and all(line.endswith(": equal") for line in printed), (
                    printed
                )
                (view_line,) = [line for line in printed if line.startswith("public.page_views ")]
                assert "(no key: compared as multisets of rows)" in view_line

                assert consistent_read.main(read_argv) == 0, capsys.readouterr()
                assert '"public.orders"' in capsys.readouterr().out
            finally:
                writer.stop.set()
                writing.join(30)
            assert not merge.failure, merge.failure
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
        lake.merge_all(changelog=True, mirror_budget_s=float(DEMO_MIRROR_BUDGET_S))
        # Until the lake proves these last changes' position (the running worker's progress events
        # prove it): verify reads the lake at its proven position.
        _prove(lake, _newest_changelog_lsn(lake), mirror_budget_s=float(DEMO_MIRROR_BUDGET_S))

    # Only the two keyless tables: the keyed ones were shown equal above. The pipeline is stopped, so
    # the lake never proves a newer position: nothing to wait for.
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


def _wait_for_every_mirror(lake: LakeCase, merge: ContinuousMerge, writer: DemoWriter) -> None:
    """Until the continuous merge created every table's mirror and the lake proves a position."""
    deadline = time.monotonic() + 180
    names = [
        "public.customers",
        "public.orders",
        "inventory.products",
        "public.page_views",
        f"public.{FULL_TABLE}",
    ]
    while time.monotonic() < deadline:
        assert merge.running(), merge.failure
        if len(warehouse.list_tables(lake.spark, lake.warehouse)) == len(names):
            try:
                read_consistent(lake.spark, lake.warehouse, names)
                return
            except NoCommonWatermark:
                pass
        time.sleep(1)
    raise AssertionError(f"the continuous merge did not create every mirror ({writer.done} writes)")
