"""The stack's Dagster instance file: the repository's settings plus Postgres storage from an env var."""

from __future__ import annotations

import pytest
import yaml

from stack.config import StackConfig
from stack.dagster_home import BASE_INSTANCE_FILE, POSTGRES_URL_ENV, env_values, instance_yaml
from stack.errors import StackError


def test_the_repository_file_sets_no_storage_so_plain_dagster_dev_keeps_sqlite() -> None:
    base = yaml.safe_load(BASE_INSTANCE_FILE.read_text())
    assert not {"storage", "run_storage", "event_log_storage", "schedule_storage"} & set(base)


def test_the_stack_file_is_the_repository_file_plus_postgres_storage_from_the_environment() -> None:
    base = yaml.safe_load(BASE_INSTANCE_FILE.read_text())
    rendered = yaml.safe_load(instance_yaml(BASE_INSTANCE_FILE.read_text()))
    assert rendered.pop("storage") == {"postgres": {"postgres_url": {"env": POSTGRES_URL_ENV}}}
    assert rendered == base


def test_a_base_file_with_its_own_storage_is_refused() -> None:
    with pytest.raises(StackError, match="storage"):
        instance_yaml("telemetry:\n  enabled: false\nstorage:\n  sqlite:\n    base_dir: x\n")


def test_the_url_names_the_psycopg2_driver_and_the_dagster_database() -> None:
    cfg = StackConfig.from_env()
    assert (
        env_values(cfg)[POSTGRES_URL_ENV] == f"postgresql+psycopg2://postgres@127.0.0.1:{cfg.pg_port}/dagster"
    )
