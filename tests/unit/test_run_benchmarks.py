"""bench/run_benchmarks.py's pure part: RESULT lines, the results file, the table, the markers."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "run_benchmarks.py"


def _load() -> ModuleType:
    # bench/ is a folder of scripts, not a package: load the script by its path.
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
    assert cells[5:8] == ["8.52", "2026-11-25 20:00 UTC", "2 cores, 24 GB, AMD EPYC"]
    assert cells[8] == "`cmd latency`"


def test_ratio_is_computed_when_the_row_names_no_ratio_key() -> None:
    row = rb.Row("x", rb.Figure("a", "s"), rb.Figure("b", "s", "b"))
    assert rb.ratio(row, {"a": "3", "b": "12"}) == "0.25×"
    assert rb.ratio(row, {"a": "3"}) == "–"
    assert rb.ratio(row, {"a": "3", "b": "0"}) == "–"


def test_rows_of_benches_not_run_failed_or_without_the_key_say_so() -> None:
    bench = rb.Bench(
        "new", "new_bench.py", ("--big",), ("--small",),
        (rb.Row("New thing", rb.Figure("x_s", "s"), rb.Figure("y_s", "s", "y")),),
    )  # fmt: skip
    assert "not run" in _cells(rb.build_table([], [bench]), "New thing")[1]
    assert (
        _cells(rb.build_table([], [bench]), "New thing")[8] == "`.venv/bin/python bench/new_bench.py --big`"
    )
    failed = rb.build_table([_run("new", status="timeout")], [bench])
    assert _cells(failed, "New thing")[1] == "failed (timeout)"
    missing = rb.build_table([_run("new", "RESULT bench=new other=1 load1=1.0")], [bench])
    assert _cells(missing, "New thing")[1] == "no such figure in its RESULT line"


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
