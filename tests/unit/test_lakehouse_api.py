"""The lake's Python API (spark_jobs.lakehouse) pinned: its names and their signatures are what user
code imports and calls, whatever the modules behind them do; the old module paths that held public
names still import (with a DeprecationWarning), the other old paths are refused with their new name."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import sys

import pytest

from spark_jobs import lakehouse

PUBLIC = {
    "ChangelogRequired",
    "ConsistentRead",
    "KafkaSource",
    "MergeOptions",
    "NoCommonWatermark",
    "RebuildRefused",
    "Rebuilt",
    "SparkSettings",
    "TableRead",
    "TableRun",
    "TopicRecreated",
    "build_session",
    "read_consistent",
    "rebuild",
    "run_continuous",
    "run_merge",
}


def _parameters(function: object) -> list[str]:
    return list(inspect.signature(function).parameters)  # type: ignore[arg-type]


def test_the_public_names_are_these_and_all_importable() -> None:
    assert set(lakehouse.__all__) == PUBLIC
    assert all(getattr(lakehouse, name) is not None for name in PUBLIC)


def test_the_functions_keep_their_parameters() -> None:
    # New parameters may be added at the end, keyword-only; these are never renamed or reordered.
    read = _parameters(lakehouse.read_consistent)
    assert read[:3] == ["spark", "warehouse", "names"]
    assert {"at_lsn", "at_time", "use_history", "tail_from", "through_changelog"} <= set(read)
    assert _parameters(lakehouse.build_session) == ["settings"]
    assert _parameters(lakehouse.rebuild) == ["spark", "opts", "table"]
    assert _parameters(lakehouse.run_merge)[:4] == ["spark", "options", "kafka", "checkpoint_root"]
    assert _parameters(lakehouse.run_continuous)[:4] == ["spark", "options", "kafka", "checkpoint_root"]


def test_the_options_keep_their_fields_in_order() -> None:
    fields = [f.name for f in dataclasses.fields(lakehouse.MergeOptions)]
    assert fields[:7] == [
        "warehouse",
        "output_format",
        "schema_registry",
        "topic_prefix",
        "postgres",
        "history",
        "changelog",
    ]
    assert [f.name for f in dataclasses.fields(lakehouse.SparkSettings)][:2] == ["app_name", "master"]
    read_fields = [f.name for f in dataclasses.fields(lakehouse.ConsistentRead)]
    assert read_fields[:4] == ["position", "tables", "newest", "proven_at"]


def test_old_paths_of_public_names_still_import_with_a_warning() -> None:
    for old, name in (("spark_jobs.session", "build_session"), ("spark_jobs.merge_batch", "MergeOptions")):
        sys.modules.pop(old, None)
        with pytest.warns(DeprecationWarning, match=f"{old} moved: import from spark_jobs.lakehouse"):
            module = importlib.import_module(old)
        assert getattr(module, name) is getattr(lakehouse, name)


def test_other_old_paths_are_refused_with_their_new_name() -> None:
    with pytest.raises(ModuleNotFoundError, match="spark_jobs.watermark moved to spark_jobs.rules.watermark"):
        importlib.import_module("spark_jobs.watermark")
    with pytest.raises(ModuleNotFoundError, match="import the lake's names from spark_jobs.lakehouse"):
        importlib.import_module("spark_jobs.delta_tables")
    for old, new in (
        ("spark_jobs.consistent_views", "spark_jobs.reading.views"),
        ("spark_jobs.merging.changelog_tail", "spark_jobs.reading.changelog_tail"),
    ):
        with pytest.raises(ModuleNotFoundError, match=f"{old} moved to {new}"):
            importlib.import_module(old)
    # A name that never existed is Python's own error.
    with pytest.raises(ModuleNotFoundError, match="No module named 'spark_jobs.nothing_here'"):
        importlib.import_module("spark_jobs.nothing_here")
