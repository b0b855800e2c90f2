"""The stack's Dagster instance: `$DAGSTER_HOME/dagster.yaml` with storage on the stack's Postgres.

The repository's `dagster.yaml` holds the settings every run of Dagster shares and no storage, so
that a plain `dagster dev` keeps SQLite. `bw-stack up` writes the stack's instance file from it,
adding a `storage:` section for dagster-postgres that reads its URL from `BW_DAGSTER_POSTGRES_URL`
(printed by `bw-stack env`), and creates the `dagster` database it points at.
"""

from __future__ import annotations

import re
from pathlib import Path

from stack.config import PROJECT_ROOT, StackConfig
from stack.errors import StackError
from stack.services import Postgres

DAGSTER_DATABASE = "dagster"
POSTGRES_URL_ENV = "BW_DAGSTER_POSTGRES_URL"
BASE_INSTANCE_FILE = PROJECT_ROOT / "dagster.yaml"
_TOP_LEVEL_STORAGE = re.compile(
    r"^(storage|run_storage|event_log_storage|schedule_storage)\s*:", re.MULTILINE
)
# SQLAlchemy 2.1 maps a bare postgresql:// to psycopg 3, which the project does not install (the
# worker needs psycopg2's replication API), so the URL names its driver.
SQLALCHEMY_DRIVER = "postgresql+psycopg2"

STORAGE_SECTION = f"""
# Added by bw-stack: runs, events and schedules on the stack's Postgres (dagster-postgres).
storage:
  postgres:
    postgres_url:
      env: {POSTGRES_URL_ENV}
"""


def instance_yaml(base: str) -> str:
    """The stack's instance file: a header, the shared settings unchanged, and the storage section."""
    if _TOP_LEVEL_STORAGE.search(base):
        raise StackError(
            f"{BASE_INSTANCE_FILE} sets a storage itself; the stack adds its own: remove it from there"
        )
    header = (
        f"# Written by `bw-stack up` from {BASE_INSTANCE_FILE}; edit that file, not this one.\n"
        f'# Needs {POSTGRES_URL_ENV} (`eval "$(bw-stack env)"`).\n\n'
    )
    return header + base.rstrip("\n") + "\n" + STORAGE_SECTION


def env_values(cfg: StackConfig) -> dict[str, str]:
    url = cfg.postgres_url(DAGSTER_DATABASE)
    return {POSTGRES_URL_ENV: SQLALCHEMY_DRIVER + url[url.index("://") :]}


def write_instance(cfg: StackConfig, base_file: Path = BASE_INSTANCE_FILE) -> Path:
    """Create the `dagster` database if needed and (re)write $DAGSTER_HOME/dagster.yaml."""
    Postgres(cfg).ensure_database(DAGSTER_DATABASE)
    cfg.dagster_home.mkdir(parents=True, exist_ok=True)
    target = cfg.dagster_home / "dagster.yaml"
    target.write_text(instance_yaml(base_file.read_text()))
    return target
