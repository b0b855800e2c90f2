"""The merge's Postgres DSN (for JSON topics' types), kept out of the process list and the logs.

A DSN given as `-d` shows, password and all, to anyone who can run `ps`; the environment
(`BOTTLEDWATER_MERGE_POSTGRES`) or a file (`--postgres-file`) does not. `-d` keeps working, with a
warning naming the safer ways. The merge installs the shared `RedactingFilter`
(`kafka_contract.redaction`) on its log handlers so no line it prints carries a password. (Not
named `secrets`, the standard library's module, which it would shadow at the top of spark_jobs/.)
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

from kafka_contract.redaction import RedactingFilter
from spark_jobs.errors import ConfigurationError

MERGE_DSN_ENV = "BOTTLEDWATER_MERGE_POSTGRES"
CLI_WARNING = (
    "the Postgres DSN given with -d/--postgres shows in the process list (ps): set "
    f"{MERGE_DSN_ENV} or pass --postgres-file FILE instead"
)


def merge_dsn(
    flag_value: str | None, dsn_file: str | None, environ: Mapping[str, str]
) -> tuple[str | None, str | None]:
    """The DSN the merge types JSON columns with, and a warning to log (or None).

    `flag_value` is what the parser holds, which is the environment's value unless `-d` was given;
    `-d` wins, then `--postgres-file`, then the environment."""
    from_env = environ.get(MERGE_DSN_ENV) or None
    if flag_value is not None and flag_value != from_env:
        return flag_value, CLI_WARNING
    if dsn_file is not None:
        return read_dsn_file(dsn_file), None
    return from_env, None


def read_dsn_file(path: str) -> str:
    """The first non-blank line of `path`; a missing or empty file is a one-line error."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigurationError(
            f"--postgres-file {path}: cannot read it ({exc.strerror}); give a readable file holding "
            "the DSN on its first line"
        ) from None
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    raise ConfigurationError(f"--postgres-file {path}: the file is empty; write the DSN on its first line")


def redact_logs() -> None:
    """Every handler of the root logger redacts what it prints."""
    for handler in logging.getLogger().handlers:
        handler.addFilter(RedactingFilter())
