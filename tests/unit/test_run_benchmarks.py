"""bench/run_benchmarks.py's pure part: RESULT lines, the results file, the table, the markers."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "run_benchmarks.py"


def _load() -> ModuleType:
    # bench/ is a folder of scripts, not a package: load the script by its path, with bench/ on the
    # path for the table it imports (as when it runs as a script).
    if str(SCRIPT.parent) not in sys.path:
        sys.path.insert(0, str(SCRIPT.parent))
    spec = importlib.util.spec_from_file_location("run_benchmarks", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


rb = _load()

LATENCY = (
    "RESULT bench=latency format=avro transactions=10000 rate=983 p50_ms=15.986 p99_ms=69.289 "
    "baseline_p99_ms=24.507 p99_vs_baseline=2.827 load1=8.52"
)


def _run(name: str, *lines: str, status: str = "ok") -> object:
    results = [rb.parse_result(line) for line in lines]
    return rb.BenchRun(
        name, status, "2026-11-25 20:00 UTC", "2 cores, 24 GB, AMD EPYC", f"cmd {name}", results
    )


def test_parse_result_reads_fields_and_ignores_other_lines() -> None:
    fields = rb.parse_result(LATENCY + "\n")
    assert fields["bench"] == "latency"
    assert fields["p99_ms"] == "69.289"
    assert fields["load1"] == "8.52"
    assert rb.parse_result("== (c) latency") is None
    assert rb.parse_result("  RESULTS bench=x") is None
    assert rb.parse_result("RESULT bench=spark_snapshot master=local[2,4]")["master"] == "local[2,4]"


def test_results_file_round_trips() -> None:
    runs = [_run("latency", LATENCY), _run("merge", status="exit 1")]
    text = rb.format_results(runs)
    back = rb.parse_results(text)
    assert [(r.name, r.status, r.date, r.machine, r.command) for r in back] == [
        (r.name, r.status, r.date, r.machine, r.command) for r in runs
    ]
    assert back[0].results == runs[0].results
    assert back[1].results == []
    assert LATENCY in text.splitlines()  # the RESULT line is kept verbatim


def test_results_file_refuses_a_result_before_any_run() -> None:
    with pytest.raises(ValueError, match="before any RUN"):
        rb.parse_results(LATENCY)


def test_merge_runs_replaces_by_name_and_keeps_the_declared_order() -> None:
    old = [_run("stream"), _run("latency", LATENCY), _run("someone_elses")]
    new = [_run("snapshot"), _run("latency")]
    merged = rb.merge_runs(old, new)
    assert [r.name for r in merged] == ["snapshot", "stream", "latency", "someone_elses"]
    assert merged[2].results == []  # the new latency run, not the saved one


def _cells(table: str, label: str) -> list[str]:
    line = next(line for line in table.splitlines() if label in line)
    return [cell.strip() for cell in line.strip("|").split(" | ")]


def test_table_row_shows_figure_baseline_ratio_load_date_machine_and_command() -> None:
    table = rb.build_table([_run("latency", LATENCY)])
    cells = _cells(table, "Latency")
    assert cells[1] == "**69.3 ms**"
    assert cells[2] == "24.5 ms (a bare producer)"
    assert cells[3] == "2.83×"  # the bench's own ratio key
    assert cells[4:6] == ["p99 < 100 ms", "met"]  # 69.3 ms against its target
    assert cells[6:9] == ["8.52", "2026-11-25 20:00 UTC", "2 cores, 24 GB, AMD EPYC"]
    assert cells[9] == "`cmd latency`"


def test_ratio_is_computed_when_the_row_names_no_ratio_key() -> None:
    row = rb.Row("x", rb.Figure("a", "s"), rb.Figure("b", "s", "b"))
    assert rb.ratio(row, {"a": "3", "b": "12"}) == "0.25×"
    assert rb.ratio(row, {"a": "3"}) == "–"
    assert rb.ratio(row, {"a": "3", "b": "0"}) == "–"


@pytest.mark.parametrize(
    ("target", "figure", "unit", "ratio", "expected"),
    [
        ("≥ 0.5×", 196850.0, "rows/s", 0.52, "met"),  # a ratio target reads the ratio
        ("≥ 0.8×", 86583.0, "rows/s", 0.69, "missed"),
        ("≥ 0.9×", 0.30, "×", 0.79, "missed"),  # a figure in × too: the ratio column is judged
        ("p99 < 100 ms", 59.5, "ms", 1.66, "met"),  # the statistic's name is the figure's
        ("p99 < 100 ms", 100.0, "ms", 1.66, "missed"),
        ("p99 ≤ 20 s", 12.8, "s", 0.19, "met"),
        ("p99 ≤ 20 s", 20.0, "s", None, "met"),
        ("peak < 300 MB", 144.0, "MB", 2.06, "met"),
        ("0 MB", 0.0, "MB", 0.0, "met"),  # no comparison: equal
        ("0 MB", 0.5, "MB", 0.0, "missed"),
        ("≤ 15 s", 0.24, "s", 0.03, "met"),
        ("≤ 60 s", 61.0, "s", 2.0, "missed"),
        ("≤ 3 s/min", 2.5, "s/min", 5.0, "met"),
        ("≤ 2×", 32.6, "s", 3.26, "missed"),  # the watermark rows' rule
        ("≥ 0.5×", 1.0, "rows/s", None, "–"),  # no ratio to judge
        ("≤ 15 s", None, "s", 0.03, "–"),  # no figure to judge
        ("p99 ≤ 2 intervals", 32.6, "s", 3.26, "–"),  # a unit the figure is not in
        ("≥ 15's ratio", 220658.0, "changes/s", 1.02, "–"),  # another row's ratio
        ("≤ 0.1 s/table with start-up", 1.87, "s/table", 0.93, "–"),  # the figure leaves it out
        ("", 1.0, "s", 1.0, "–"),  # no target
    ],
)
def test_verdict_judges_each_target_form(
    target: str, figure: float | None, unit: str, ratio: float | None, expected: str
) -> None:
    assert rb.verdict(target, figure, unit, ratio) == expected


def test_a_rows_rule_is_judged_instead_of_its_words() -> None:
    (row,) = next(b for b in rb.BENCHES if b.name == "watermark_lag").rows
    assert (row.target, row.rule) == ("p99 ≤ 2 intervals", "≤ 2×")
    assert rb.row_verdict(row, {"lag_p99_s": "32.6", "trigger_s": "10", "p99_intervals": "3.26"}) == "missed"
    assert rb.row_verdict(row, {"lag_p99_s": "18.0", "trigger_s": "10", "p99_intervals": "1.80"}) == "met"


def test_every_declared_target_is_judged_or_says_why_not() -> None:
    # A new target in a form `verdict` cannot read shows "–"; this lists the ones that do, on purpose.
    unjudged = {
        row.target
        for bench in rb.BENCHES
        for row in bench.rows
        if row.target and rb.TARGET.match(row.rule or row.target) is None
    }
    assert unjudged == {"≥ 15's ratio", "≤ 0.1 s/table with start-up"}


def test_rows_of_benches_not_run_failed_or_without_the_key_say_so() -> None:
    bench = rb.Bench(
        "new", "new_bench.py", ("--big",), ("--small",),
        (rb.Row("New thing", rb.Figure("x_s", "s"), rb.Figure("y_s", "s", "y")),),
    )  # fmt: skip
    assert "not run" in _cells(rb.build_table([], [bench]), "New thing")[1]
    assert (
        _cells(rb.build_table([], [bench]), "New thing")[9] == "`.venv/bin/python bench/new_bench.py --big`"
    )
    failed = rb.build_table([_run("new", status="timeout")], [bench])
    assert _cells(failed, "New thing")[1] == "failed (timeout)"
    assert _cells(failed, "New thing")[5] == "–"  # nothing to judge
    missing = rb.build_table([_run("new", "RESULT bench=new other=1 load1=1.0")], [bench])
    assert _cells(missing, "New thing")[1] == "no such figure in its RESULT line"


def test_a_run_is_ok_only_when_it_ended_by_itself_with_a_figure() -> None:
    bench = rb.Bench(
        "new", "new_bench.py", (), (),
        (rb.Row("New thing", rb.Figure("x_s", "s"), rb.Figure("y_s", "s", "y")),),
    )  # fmt: skip
    measured = [rb.parse_result("RESULT bench=new x_s=1.5 y_s=1.0")]
    assert rb.run_status(bench, 0, False, measured) == "ok"
    # Exit 0, but no sample after the warm-up: its line lacks the figure, or there is no line.
    without = [rb.parse_result("RESULT bench=new samples=0 load1=1.0")]
    assert rb.run_status(bench, 0, False, without) == "no figure in its RESULT lines"
    assert rb.run_status(bench, 0, False, []) == "no figure in its RESULT lines"
    assert rb.run_status(bench, 1, False, measured) == "exit 1"
    assert rb.run_status(bench, -15, True, measured) == "timeout"
    table = rb.build_table([_run("new", status=rb.run_status(bench, 0, False, without))], [bench])
    assert _cells(table, "New thing")[1] == "failed (no figure in its RESULT lines)"


def test_where_picks_among_several_result_lines() -> None:
    rows = tuple(
        rb.Row(
            f"Postgres {v}", rb.Figure("rate", "rows/s"), rb.Figure("base", "rows/s", "b"), where=(("pg", v),)
        )
        for v in ("14", "18")
    )
    bench = rb.Bench("multi", "multi_bench.py", (), (), rows)
    run = _run(
        "multi",
        "RESULT bench=multi pg=14 rate=1000 base=2000",
        "RESULT bench=multi pg=18 rate=3000 base=2000",
    )
    table = rb.build_table([run], [bench])
    assert _cells(table, "Postgres 14")[1] == "**1,000 rows/s**"
    assert _cells(table, "Postgres 18")[3] == "1.50×"


def test_every_declared_row_renders_from_an_empty_run_set() -> None:
    table = rb.build_table([])
    assert len(table.splitlines()) == 2 + sum(len(b.rows) for b in rb.BENCHES)
    names = [b.name for b in rb.BENCHES]
    assert len(names) == len(set(names))
    for bench in rb.BENCHES:
        assert (SCRIPT.parent / bench.script).exists(), bench.script


def test_replace_between_markers() -> None:
    text = f"# Benchmarks\n\n{rb.BEGIN}\nold table\n{rb.END}\n\n## Snapshot\n"
    out = rb.replace_between(text, "| new |\n")
    assert out == f"# Benchmarks\n\n{rb.BEGIN}\n| new |\n{rb.END}\n\n## Snapshot\n"
    assert rb.replace_between(out, "| new |") == out  # idempotent
    with pytest.raises(ValueError, match="markers"):
        rb.replace_between("no markers here", "x")
    with pytest.raises(ValueError, match="markers"):
        rb.replace_between(f"{rb.END}\n{rb.BEGIN}", "x")


def test_numbers_read_at_a_glance() -> None:
    assert rb.number("149031", "rows/s") == "149,031 rows/s"
    assert rb.number("35.730", "s") == "35.7 s"
    assert rb.number("69", "MB") == "69 MB"  # an integer figure stays one
    assert rb.number("2.827", "×") == "2.83 ×"
    assert rb.number("n/a", "s") == "n/a s"
