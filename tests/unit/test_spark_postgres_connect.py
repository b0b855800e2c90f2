"""The merge's one-line Postgres connection failures (spark_jobs.connections.postgres_connect): pure."""

from __future__ import annotations

from spark_jobs.connections.postgres_connect import DSN_SETTING, failure_line, tls_hint


def test_a_wrong_ca_names_sslrootcert_on_one_line() -> None:
    libpq = (
        'connection to server at "localhost" (127.0.0.1), port 5432 failed: SSL error:\n'
        "  certificate verify failed\n"
    )
    line = failure_line(Exception(libpq), DSN_SETTING)
    assert "\n" not in line and "BOTTLEDWATER_MERGE_POSTGRES" in line
    assert line.endswith("point sslrootcert at the CA that signed it")


def test_a_wrong_host_names_the_host_and_other_failures_get_no_hint() -> None:
    said = 'server certificate for "localhost" does not match host name "127.0.0.1"'
    assert "connect with the name in the certificate" in tls_hint(said)
    assert tls_hint("Connection refused") == ""
