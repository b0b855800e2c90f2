"""The integration tests' row comparison (tests/integration/lakehouse.assert_same_rows): multisets of
rows, in Python for small frames and through Spark for large ones, with the same answers."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from tests.integration import lakehouse
from tests.integration.lakehouse import assert_same_rows

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

COLUMNS = ["id INT", "x DOUBLE", "tags ARRAY<STRING>", "raw BINARY", "attrs MAP<STRING, INT>"]


# In Python (maps too), then through Spark (whose set operations take no map column).
@pytest.mark.parametrize(("collect_rows", "columns"), [(lakehouse.COLLECT_ROWS, 5), (1, 4)])
def test_equal_multisets_pass_and_any_difference_fails(
    spark: SparkSession, monkeypatch: pytest.MonkeyPatch, collect_rows: int, columns: int
) -> None:
    monkeypatch.setattr(lakehouse, "COLLECT_ROWS", collect_rows)
    schema = ", ".join(COLUMNS[:columns])

    def frame(*rows: tuple[Any, ...]) -> Any:
        return spark.createDataFrame([r[:columns] for r in rows], schema)

    rows = [
        (1, float("nan"), ["a"], bytearray(b"\x00"), {"k": 1}),
        (2, -0.0, [], None, {}),
        (2, -0.0, [], None, {}),
    ]
    same = frame(*reversed(rows))
    assert_same_rows(frame(*rows), same)
    changed = [
        rows[:2],  # one duplicate fewer
        [*rows[:2], (2, 0.5, [], None, {})],  # one value differs
        [(1, float("nan"), ["b"], bytearray(b"\x00"), {"k": 1}), *rows[1:]],  # inside an array
    ]
    if columns == 5:
        changed.append([(1, float("nan"), ["a"], bytearray(b"\x00"), {"k": 2}), *rows[1:]])  # inside a map
    for different in changed:
        with pytest.raises(AssertionError):
            assert_same_rows(frame(*different), same)
