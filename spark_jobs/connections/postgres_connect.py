"""The merge's connections to Postgres (its catalog lookups for JSON topics' types, the verify
job's rows): libpq's, so `sslmode=verify-full`, `sslrootcert` and SCRAM in the DSN work as they do
for the worker; a connection that fails says so in one line naming the setting to fix.

The merge checks its DSN once before its query starts (`check`): a wrong CA or host name then stops
it at once, in one line, instead of failing every table's first batch. The TLS hints are the
worker's (cdc_worker.shell.postgres.catalog), repeated here: spark_jobs never imports the worker.
"""

from __future__ import annotations

from typing import Any

import psycopg2
import psycopg2.extensions

CONNECT_TIMEOUT_S = 10
DSN_SETTING = "the merge's Postgres DSN (BOTTLEDWATER_MERGE_POSTGRES, --postgres-file or -d)"

# libpq's words for the two TLS failures a user fixes in the DSN, and the setting each one names.
_TLS_HINTS = (
    (
        "certificate verify failed",
        ": the server's certificate is not signed by the CA in sslrootcert (the DSN's sslrootcert, "
        "by default ~/.postgresql/root.crt): point sslrootcert at the CA that signed it",
    ),
    (
        "does not match host name",
        ": the DSN's host is not a name the server's certificate carries (sslmode=verify-full "
        "checks it): connect with the name in the certificate",
    ),
)


class PostgresUnreachable(psycopg2.OperationalError):  # type: ignore[misc]  # psycopg2 has no stubs
    """A connection libpq refused; the message is one line and names the fix. Still a
    psycopg2.OperationalError, so callers that handle libpq's errors handle it too."""


def tls_hint(message: str) -> str:
    """What to change when `message` is a TLS failure libpq reports, else nothing. Pure."""
    return next((hint for words, hint in _TLS_HINTS if words in message), "")


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
