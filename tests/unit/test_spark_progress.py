"""The Spark snapshot's progress lines, as the worker's log and a Dagster run show them."""

from __future__ import annotations

import pickle

from cdc_worker.shell.snapshot.spark_progress import CountsParam, LoadProgress


def test_counts_from_the_tasks_add_up_per_table() -> None:
    param = pickle.loads(pickle.dumps(CountsParam()))  # as Spark ships it
    total = param.zero({})
    for update in ({"public.a": (100, 1)}, {"public.b": (5, 1)}, {"public.a": (50, 1)}):
        total = param.addInPlace(total, update)
    assert total == {"public.a": (150, 2), "public.b": (5, 1)}


def test_a_line_per_table_done_then_tables_ranges_rows_rate_and_eta() -> None:
    progress = LoadProgress({"public.a": 2, "public.b": 1}, expected_rows=1000, interval=10.0, started=0.0)
    assert progress.lines({}, 5.0) == [], "nothing to say before the interval"
    assert progress.lines({"public.a": (200, 1)}, 10.0) == [
        "spark snapshot: 0/2 tables, 1/3 ranges, 200 rows, 20 rows/s, 20% of ~1,000, ETA 40s"
    ]
    assert progress.lines({"public.a": (200, 1), "public.b": (100, 1)}, 12.0) == [
        "spark snapshot: public.b done, 100 rows",
        "spark snapshot: 1/2 tables, 2/3 ranges, 300 rows, 25 rows/s, 30% of ~1,000, ETA 28s",
    ]
    done = {"public.a": (900, 2), "public.b": (100, 1)}
    assert progress.lines(done, 20.0) == [
        "spark snapshot: public.a done, 900 rows",
        "spark snapshot: 2/2 tables, 3/3 ranges, 1,000 rows, 50 rows/s, 100% of ~1,000",
    ]
    assert progress.lines(done, 21.0) == [], "a table is done once"


def test_without_estimates_there_is_no_eta() -> None:
    progress = LoadProgress({"public.a": 1}, expected_rows=0, interval=10.0, started=0.0)
    assert progress.lines({}, 10.0) == ["spark snapshot: 0/1 tables, 0/1 ranges, 0 rows, 0 rows/s"]
