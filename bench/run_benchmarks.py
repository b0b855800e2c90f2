"""Run the whole benchmark set and rewrite the table of current figures in docs/benchmarks.md.

    .venv/bin/python bench/run_benchmarks.py                  # every benchmark, default sizes (~30 min)
    .venv/bin/python bench/run_benchmarks.py --only latency   # one (repeatable); the others' lines are kept
    .venv/bin/python bench/run_benchmarks.py --quick          # smoke run, small sizes; writes nothing
    .venv/bin/python bench/run_benchmarks.py --from-file      # rebuild the table from the saved lines

Each benchmark is its own process (`bench/<name>_bench.py`), run one after the other against the
local stack; its output is shown as it runs and its `RESULT name=value ...` lines are kept, with the
run's date, machine and command, in docs/benchmarks-results.txt. The table between the
`<!-- results:begin -->` and `<!-- results:end -->` comments of docs/benchmarks.md is built from that
file only, so it never shows a figure no run printed.

`BENCHES` (bench/bench_table.py) is the one place that says which benchmarks run, with which
arguments, and which RESULT keys make each row of the table: add a `Bench` (or a `Row` to one) to
add a row. A row whose
benchmark was not run, failed, or printed no such key says so in the table instead of failing.
Each row's target is judged from its own figure or ratio (`verdict`): met, missed, or "–" when it
has none or its words are not something the row's figure can be compared with.
"""

from __future__ import annotations

import argparse
import json
import operator
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from bench_table import BENCHES, Bench, Figure, Row

__all__ = ["BENCHES", "Bench", "Figure", "Row"]  # the table's names, also reached through this script

REPO = Path(__file__).resolve().parent.parent
RESULTS_FILE = REPO / "docs" / "benchmarks-results.txt"
DOC_FILE = REPO / "docs" / "benchmarks.md"
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"


@dataclass
class BenchRun:
    """One benchmark process's outcome: how and where it ran, and its RESULT lines, parsed."""

    name: str
    status: str  # "ok", or why not ("exit 1", "timeout", "no figure in its RESULT lines")
    date: str
    machine: str
    command: str
    results: list[dict[str, str]] = field(default_factory=list)

    def header(self) -> str:
        fields = {
            "name": self.name, "status": self.status, "date": self.date,
            "machine": self.machine, "command": self.command,
        }  # fmt: skip
        return "RUN " + json.dumps(fields, ensure_ascii=False)


# --- pure: RESULT lines, the results file, the table ------------------------------------------


def parse_result(line: str) -> dict[str, str] | None:
    """A `RESULT name=value ...` line as its fields (None for any other line)."""
    words = line.strip().split()
    if not words or words[0] != "RESULT":
        return None
    pairs = (word.partition("=") for word in words[1:])
    return {name: value for name, sep, value in pairs if sep and name}


def format_results(runs: Iterable[BenchRun]) -> str:
    """The results file: per run one `RUN {json}` header, then its RESULT lines verbatim."""
    lines = [
        "# bench/run_benchmarks.py: every benchmark's last run, then its RESULT lines.",
        "# docs/benchmarks.md's table is built from this file (`bench/run_benchmarks.py --from-file`).",
    ]
    for run in runs:
        lines.append(run.header())
        lines += ["RESULT " + " ".join(f"{k}={v}" for k, v in result.items()) for result in run.results]
    return "\n".join(lines) + "\n"


def parse_results(text: str) -> list[BenchRun]:
    """Read back `format_results`' file; a RESULT line before any RUN header is refused."""
    runs: list[BenchRun] = []
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("RUN "):
            fields = json.loads(line[4:])
            runs.append(
                BenchRun(
                    fields["name"], fields["status"], fields["date"], fields["machine"], fields["command"]
                )
            )
        elif (result := parse_result(line)) is not None:
            if not runs:
                raise ValueError(f"line {number}: a RESULT line before any RUN header")
            runs[-1].results.append(result)
    return runs


def merge_runs(old: Sequence[BenchRun], new: Sequence[BenchRun]) -> list[BenchRun]:
    """The saved runs with those just made replacing theirs (same name), in `BENCHES`' order."""
    by_name = {run.name: run for run in old} | {run.name: run for run in new}
    order = [bench.name for bench in BENCHES]
    return sorted(
        by_name.values(), key=lambda run: order.index(run.name) if run.name in order else len(order)
    )


def number(value: str, unit: str) -> str:
    """A figure as a reader takes it in: thousands separated, a few significant digits."""
    try:
        x = float(value)
    except ValueError:
        return f"{value} {unit}"
    if value.lstrip("-").isdigit() or abs(x) >= 100:
        text = f"{x:,.0f}"
    elif abs(x) >= 10:
        text = f"{x:.1f}"
    else:
        text = f"{x:.2f}"
    return f"{text} {unit}"


def ratio_value(row: Row, result: dict[str, str]) -> float | None:
    """The bench's own ratio key if the row names one, else figure / baseline; None without them."""
    try:
        if row.ratio and row.ratio in result:
            return float(result[row.ratio])
        return float(result[row.figure.key]) / float(result[row.baseline.key])
    except (KeyError, ValueError, ZeroDivisionError):
        return None


def ratio(row: Row, result: dict[str, str]) -> str:
    value = ratio_value(row, result)
    return "–" if value is None else f"{value:.2f}×"


# A target the table can judge: an optional word naming the statistic ("p99", "peak"), an optional
# comparison (none means equal), a number and a unit, and nothing after it.
TARGET = re.compile(r"^(?:[a-z][a-z0-9]*\s+)?(?P<op>[≥≤<>]?)\s*(?P<limit>\d+(?:\.\d+)?)\s*(?P<unit>\S+)$")
COMPARE: dict[str, Callable[[float, float], bool]] = {
    "≥": operator.ge, "≤": operator.le, "<": operator.lt, ">": operator.gt, "": operator.eq,
}  # fmt: skip


def verdict(target: str, figure: float | None, unit: str, ratio: float | None) -> str:
    """Met or missed, for a target like "≥ 0.5×", "p99 < 100 ms", "peak < 300 MB" or "0 MB"; "–"
    when there is no target, no value to judge, or the target says something else.

    A target in × is judged against the ratio; one in the figure's unit against the figure. Any
    other target ("≥ 15's ratio": another row's; "≤ 0.1 s/table with start-up": a figure that
    leaves the start-up out; a unit the figure is not in) is not judged here: the row either gives
    a `rule` in this form or shows "–"."""
    found = TARGET.match(target.strip())
    if found is None:
        return "–"
    value = ratio if found["unit"] == "×" else figure if found["unit"] == unit else None
    if value is None:
        return "–"
    return "met" if COMPARE[found["op"]](value, float(found["limit"])) else "missed"


def row_verdict(row: Row, result: dict[str, str]) -> str:
    """`verdict` of the row's rule (or its target) on one RESULT line."""
    try:
        figure: float | None = float(result[row.figure.key])
    except (KeyError, ValueError):
        figure = None
    return verdict(row.rule or row.target, figure, row.figure.unit, ratio_value(row, result))


def pick(row: Row, results: Sequence[dict[str, str]]) -> dict[str, str] | None:
    """The last of a run's RESULT lines that carries the row's `where` fields and its figure."""
    for result in reversed(results):
        if all(result.get(k) == v for k, v in row.where) and row.figure.key in result:
            return result
    return None


def run_status(bench: Bench, code: int, timed_out: bool, results: Sequence[dict[str, str]]) -> str:
    """The status: "ok" only for a run that ended by itself with 0 and gave a figure for one of its
    rows; otherwise why not. A benchmark that exits 0 without a figure measured nothing (no samples
    after its warm-up, a loop that never ran): it is not ok, and the whole run fails with it."""
    if timed_out:
        return "timeout"
    if code != 0:
        return f"exit {code}"
    if bench.rows and not any(pick(row, results) is not None for row in bench.rows):
        return "no figure in its RESULT lines"
    return "ok"


def table_row(bench: Bench, row: Row, run: BenchRun | None) -> list[str]:
    label = f"[{row.label}](#{bench.section})" if bench.section else row.label
    target = row.target or "–"
    if run is None:
        return [label, "not run", "–", "–", target, "–", "–", "–", "–", f"`{bench.command()}`"]
    command = f"`{run.command}`"
    result = pick(row, run.results) if run.status == "ok" else None
    if result is None:
        why = "no such figure in its RESULT line" if run.status == "ok" else f"failed ({run.status})"
        return [label, why, "–", "–", target, "–", "–", run.date, run.machine, command]
    baseline = (
        f"{number(result[row.baseline.key], row.baseline.unit)} ({row.baseline.what})"
        if row.baseline.key in result
        else "–"
    )
    return [
        label, f"**{number(result[row.figure.key], row.figure.unit)}**", baseline, ratio(row, result),
        target, row_verdict(row, result), result.get("load1", "–"), run.date, run.machine, command,
    ]  # fmt: skip


HEADER = [
    "benchmark", "figure", "baseline, same run", "ratio", "target", "met", "load", "date", "machine",
    "command",
]  # fmt: skip


def build_table(runs: Sequence[BenchRun], benches: Sequence[Bench] = BENCHES) -> str:
    """The markdown table of every declared row, from the runs that were made."""
    by_name = {run.name: run for run in runs}
    lines = ["| " + " | ".join(HEADER) + " |", "|" + " --- |" * len(HEADER)]
    for bench in benches:
        for row in bench.rows:
            cells = table_row(bench, row, by_name.get(bench.name))
            lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(lines)


def replace_between(text: str, new: str, begin: str = BEGIN, end: str = END) -> str:
    """`text` with what lies between the two marker lines replaced by `new`."""
    start, stop = text.find(begin), text.find(end)
    if start < 0 or stop < start:
        raise ValueError(f"no {begin} ... {end} markers in order: put them where the table goes")
    return text[: start + len(begin)] + "\n" + new.strip("\n") + "\n" + text[stop:]


# --- I/O: the machine, running the benchmarks, writing the files ------------------------------


def machine() -> str:
    """nproc, RAM and CPU model, e.g. `2 cores, 24 GB, Intel(R) Xeon(R) Platinum 8375C`."""
    model = "unknown CPU"
    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    if found := re.search(r"^model name\s*:\s*(.+)$", cpuinfo, re.MULTILINE):
        model = re.sub(r"\s+CPU\s+@.*|\s+\d+-Core Processor", "", found.group(1)).strip()
    meminfo = Path("/proc/meminfo").read_text() if Path("/proc/meminfo").exists() else ""
    memory = re.search(r"MemTotal:\s+(\d+) kB", meminfo)
    ram = f"{int(memory.group(1)) / 2**20:.0f} GB" if memory else "? GB"
    return f"{os.cpu_count()} cores, {ram}, {model}"


def run_bench(bench: Bench, quick: bool, timeout_s: float) -> BenchRun:
    """Run one benchmark to its end, its output echoed, its RESULT lines kept."""
    args = bench.quick if quick else bench.args
    process = subprocess.Popen(
        [sys.executable, str(REPO / "bench" / bench.script), *args],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,  # its own process group, so a timeout stops its children too
    )  # fmt: skip
    timed_out = threading.Event()

    def stop() -> None:
        timed_out.set()
        os.killpg(process.pid, signal.SIGTERM)

    timer = threading.Timer(timeout_s, stop)
    timer.start()
    results = []
    try:
        assert process.stdout is not None
        for line in process.stdout:
            print(line, end="", flush=True)
            if (result := parse_result(line)) is not None:
                results.append(result)
        code = process.wait()
    finally:
        timer.cancel()
    status = run_status(bench, code, timed_out.is_set(), results)
    date = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    return BenchRun(bench.name, status, date, machine(), bench.command(quick), results)


def write_table(runs: Sequence[BenchRun], doc: Path) -> None:
    doc.write_text(replace_between(doc.read_text(), build_table(runs)))
    print(f"wrote the table of {doc.relative_to(REPO) if doc.is_relative_to(REPO) else doc}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    names = [bench.name for bench in BENCHES]
    parser.add_argument("--only", action="append", choices=names, metavar="NAME", help=", ".join(names))
    parser.add_argument(
        "--quick", action="store_true", help="small sizes, a smoke run: prints, writes nothing"
    )
    parser.add_argument(
        "--from-file", action="store_true", help="run nothing: rebuild the table from --results"
    )
    parser.add_argument("--results", type=Path, default=RESULTS_FILE, help="the RESULT lines' file")
    parser.add_argument("--doc", type=Path, default=DOC_FILE, help="the page whose table is rewritten")
    parser.add_argument("--timeout-min", type=float, default=40, help="per benchmark (default: 40)")
    args = parser.parse_args(argv)

    saved = parse_results(args.results.read_text()) if args.results.exists() else []
    if args.from_file:
        write_table(saved, args.doc)
        return 0
    runs = []
    for bench in BENCHES:
        if args.only and bench.name not in args.only:
            continue
        if not (REPO / "bench" / bench.script).exists():
            print(f"== {bench.name}: bench/{bench.script} is not there, not run", flush=True)
            continue
        print(f"\n=== {bench.name}: {bench.command(args.quick)}", flush=True)
        runs.append(run_bench(bench, args.quick, args.timeout_min * 60))
        print(f"=== {bench.name}: {runs[-1].status}", flush=True)
    if args.quick:
        print("\n" + build_table(runs))
        return 0 if all(run.status == "ok" for run in runs) else 1
    # A partial run (--only) keeps the other benchmarks' saved lines; a whole run replaces them all.
    merged = merge_runs(saved, runs) if args.only else runs
    args.results.write_text(format_results(merged))
    write_table(merged, args.doc)
    return 0 if all(run.status == "ok" for run in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
