"""libpq's TLS failures, each with the DSN setting a user changes to fix it: the worker's connections
(cdc_worker.shell.postgres.catalog) and the merge's (spark_jobs.connections.postgres_connect) name
the same fix in the same words.
"""

from __future__ import annotations

# libpq's words for the two TLS failures a user fixes in the DSN, and the setting each one names.
TLS_HINTS = (
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


def tls_hint(message: str) -> str:
    """What to change when `message` is a TLS failure libpq reports, else nothing. Pure."""
    return next((hint for words, hint in TLS_HINTS if words in message), "")
