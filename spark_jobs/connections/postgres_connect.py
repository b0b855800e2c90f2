"""The merge's connections to Postgres (its catalog lookups for JSON topics' types, the verify
job's rows): libpq's, so `sslmode=verify-full`, `sslrootcert` and SCRAM in the DSN work as they do
for the worker; a connection that fails says so in one line naming the setting to fix.

The merge checks its DSN once before its query starts (`check`): a wrong CA or host name then stops
it at once, in one line, instead of failing every table's first batch. The TLS hints are the
worker's too (shared_connections.libpq_tls): spark_jobs never imports the worker.
"""

from __future__ import annotations

from typing import Any

import psycopg2
import psycopg2.extensions

from shared_connections.libpq_tls import tls_hint
from spark_jobs.errors import InfrastructureError

CONNECT_TIMEOUT_S = 10
DSN_SETTING = "the merge's Postgres DSN (BOTTLEDWATER_MERGE_POSTGRES, --postgres-file or -d)"


class PostgresUnreachable(InfrastructureError, psycopg2.OperationalError):  # type: ignore[misc]  # psycopg2 has no stubs
    """A connection libpq refused; the message is one line and names the fix. Still a
    psycopg2.OperationalError, so callers that handle libpq's errors handle it too."""


def failure_line(error: BaseException, setting: str) -> str:
    """`error` (libpq's, often several lines) as one line naming `setting` and the fix. Pure."""
    said = " ".join(str(error).split())
    return f"cannot connect to Postgres with {setting}: {said}{tls_hint(said)}"


def connect(dsn: str, setting: str = DSN_SETTING) -> psycopg2.extensions.connection:
    """A psycopg2 connection to `dsn`; `PostgresUnreachable` in one line when libpq refuses."""
    params: dict[str, Any] = {}
    if "connect_timeout" not in psycopg2.extensions.parse_dsn(dsn):
        params["connect_timeout"] = CONNECT_TIMEOUT_S
    try:
        return psycopg2.connect(dsn, **params)
    except psycopg2.OperationalError as exc:
        raise PostgresUnreachable(failure_line(exc, setting)) from None


def check(dsn: str, setting: str = DSN_SETTING) -> None:
    """Connects once and disconnects: the DSN, its TLS settings and its credentials work."""
    connect(dsn, setting).close()
