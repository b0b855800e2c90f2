"""`BW_MERGE_MODE`: which merge the code location runs, the supervised continuous merge (the default)
or the schedule, never both (one writer per checkpoint)."""

from __future__ import annotations

import dagster as dg
import pytest

from orchestration.definitions import build_definitions
from orchestration.discovery import CapturedTable
from orchestration.settings import MergeMode, SettingsError, load_settings

TABLE = CapturedTable("public", "accounts", ("id",), ("id", "balance"), "public.accounts")


def _states(env: dict[str, str]) -> tuple[dg.DefaultScheduleStatus, dg.DefaultSensorStatus]:
    defs = build_definitions(load_settings(env), [TABLE])
    schedule = defs.resolve_schedule_def("merge_schedule")
    sensor = defs.resolve_sensor_def("continuous_merge_supervisor")
    return schedule.default_status, sensor.default_status


def test_the_continuous_merge_by_default() -> None:
    assert load_settings({}).merge_mode is MergeMode.CONTINUOUS
    assert _states({}) == (dg.DefaultScheduleStatus.STOPPED, dg.DefaultSensorStatus.RUNNING)


def test_scheduled_turns_the_schedule_on_and_the_supervisor_off() -> None:
    env = {"BW_MERGE_MODE": "scheduled"}
    assert load_settings(env).merge_mode is MergeMode.SCHEDULED
    assert _states(env) == (dg.DefaultScheduleStatus.RUNNING, dg.DefaultSensorStatus.STOPPED)


def test_continuous_turns_the_supervisor_on_and_the_schedule_off() -> None:
    env = {"BW_MERGE_MODE": "Continuous"}
    assert load_settings(env).merge_mode is MergeMode.CONTINUOUS
    assert _states(env) == (dg.DefaultScheduleStatus.STOPPED, dg.DefaultSensorStatus.RUNNING)


def test_stopped_automation_starts_neither() -> None:
    env = {"BW_MERGE_MODE": "continuous", "BW_AUTOMATION": "stopped"}
    assert _states(env) == (dg.DefaultScheduleStatus.STOPPED, dg.DefaultSensorStatus.STOPPED)


def test_a_bad_mode_names_the_variable_and_the_choices() -> None:
    with pytest.raises(SettingsError, match=r"BW_MERGE_MODE='always': expected scheduled or continuous"):
        load_settings({"BW_MERGE_MODE": "always"})
