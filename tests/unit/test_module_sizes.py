"""The lake's code stays readable a module at a time: no module of spark_jobs over 400 lines and no
function over 80. What grows gets a module of its own (a batch's steps each a handler, the read
side, the settings, verify's comparisons), not a longer one."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 80


def test_no_spark_jobs_module_is_longer_than_a_sitting() -> None:
    long = {
        str(path.relative_to(ROOT)): lines
        for path in sorted((ROOT / "spark_jobs").rglob("*.py"))
        if (lines := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert not long, f"split these modules (over {MAX_MODULE_LINES} lines): {long}"


def test_no_spark_jobs_function_is_longer_than_a_screenful_or_two() -> None:
    long = {}
    for path in sorted((ROOT / "spark_jobs").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno is not None:
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long[f"{path.relative_to(ROOT)}:{node.name}"] = lines
    assert not long, f"split these functions (over {MAX_FUNCTION_LINES} lines): {long}"
