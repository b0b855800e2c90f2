"""A TLS failure at connection names the DSN setting to change, in the same one line."""

from __future__ import annotations

import psycopg2

from cdc_worker.shell.postgres.catalog import PostgresConnectionLost, tls_hint


def test_a_wrong_ca_names_sslrootcert() -> None:
    error = psycopg2.OperationalError(
        'connection to server at "db" (10.0.0.5), port 5432 failed: SSL error: certificate verify failed\n'
    )
    message = str(PostgresConnectionLost.from_error(error))
    assert "\n" not in message and "certificate verify failed" in message and "sslrootcert" in message


def test_a_host_the_certificate_does_not_carry_names_the_host() -> None:
    said = 'server certificate for "db.internal" does not match host name "10.0.0.5"'
    assert "DSN's host" in tls_hint(said)


def test_other_failures_get_no_hint() -> None:
    assert tls_hint('connection to server at "db", port 5432 failed: Connection refused') == ""
