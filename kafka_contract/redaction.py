"""Secrets kept out of every line Bottled Water prints: logs, errors, `--help`'s echo of options.

Pure text functions and the log filter that applies `redact_text` to every record as a last line
of defence: the worker's log handler (`cdc_worker.shell.logs`), the merge's (`spark_jobs.connections.dsn`) and
Dagster's view of the worker's output use this one definition. The worker never logs a connection
string it did not redact first.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from urllib.parse import urlsplit, urlunsplit

REDACTED = "***"
_SECRET_SETTING = re.compile(r"password|secret|jaas|token|user\.info|\.pem$|credentials", re.IGNORECASE)
# Not after `?` or `&`: a URL's query parameter is redacted up to the next `&` only, so the
# parameters that follow it stay readable.
_KV_PASSWORD = re.compile(r"(?<![?&])(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)
# The password part runs to the last `@` before a `/` or a blank: an unencoded `@` in a password
# must not leave its tail behind.
_URL_IN_TEXT = re.compile(r"([a-z][a-z0-9+.-]*://)([^/@\s:]*):([^/\s]*)@", re.IGNORECASE)
# `user:secret@host:5432/db` with the scheme forgotten (a common slip), as typed or quoted back in
# an error (`missing "=" after "user:secret@host..."`): a user name that no URL, path or word
# precedes, a colon, the password.
_USERINFO_WITHOUT_SCHEME = re.compile(r"(?<![\w/.:%+@-])([\w.%+-]*):([^/\s\"']*)@(?=[\w\[])")
# `fs.s3a.secret.key=…`, `AWS_SECRET_ACCESS_KEY=…`, `'fs.s3a.session.token': '…'`, Azure's
# `fs.azure.account.key.<account>=…`: a setting that holds an object store's secret, as a parser or
# an exception may quote it back (a malformed BW_SPARK_CONF entry, say). The key must be one word,
# so that prose ("a secret key: ...") stays.
_KV_SECRET_SETTING = re.compile(
    r"([\w.-]*(?:secret[._-]?(?:access[._-]?)?key|session[._-]?token|account[._-]key)[\w.-]*['\"]?\s*[=:]\s*['\"]?)"
    r"([^\s'\",}]+)",
    re.IGNORECASE,
)
_QUERY_PASSWORD = re.compile(r"([?&]password=)[^&\s\"']*", re.IGNORECASE)
# `user[:password]@host[:port][/dbname][?params]` without `scheme://`: the form that
# `normalize_dsn` completes.
_SCHEMELESS_DSN = re.compile(r"[^\s=/@]+@[^\s=@/]+(/[^\s]*)?")


def redact_url(url: str) -> str:
    """`http://user:secret@host/x` -> `http://user:***@host/x`; other URLs unchanged."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit(parts._replace(netloc=f"{parts.username}:{REDACTED}@{host}"))


def public_url(url: str) -> str:
    """`http://user:secret@host/x` -> `http://host/x`: a URL to record where others read it (the
    lake's changelog records the registry's), without whoever's credentials it carried."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def redact_dsn(dsn: str) -> str:
    """A libpq DSN in any form the worker accepts (URL, key=value, `?password=`, or
    `user:password@host/db` without a scheme) with its password replaced by `***`."""
    return redact_text(dsn)


def normalize_dsn(dsn: str) -> str:
    """`user:password@host:5432/db` (no `postgres://`, which libpq would refuse as a malformed
    key=value string, quoting the password back in its error) -> `postgresql://user:...`; every
    other DSN unchanged."""
    stripped = dsn.strip()
    if _SCHEMELESS_DSN.fullmatch(stripped):
        return f"postgresql://{stripped}"
    return dsn


def redact_text(text: str) -> str:
    """Every password in `text` redacted, whatever the form of the connection string that carries
    it (`scheme://user:password@`, `user:password@host` without a scheme, `?password=`,
    `password=...`), and every object store's secret key or session token quoted as a setting
    (`fs.s3a.secret.key=...`): a last line of defence for log messages and exception texts that may
    quote a connection string or a setting."""
    text = _URL_IN_TEXT.sub(lambda m: f"{m.group(1)}{m.group(2)}:{REDACTED}@", text)
    text = _USERINFO_WITHOUT_SCHEME.sub(lambda m: f"{m.group(1)}:{REDACTED}@", text)
    text = _QUERY_PASSWORD.sub(rf"\g<1>{REDACTED}", text)
    text = _KV_SECRET_SETTING.sub(rf"\g<1>{REDACTED}", text)
    return _KV_PASSWORD.sub(rf"\g<1>{REDACTED}", text)


def redact_settings(settings: Mapping[str, str]) -> dict[str, str]:
    """Kafka / registry settings with every secret-looking value replaced by `***`."""
    return {k: (REDACTED if _SECRET_SETTING.search(k) else v) for k, v in settings.items()}


def redact_values(text: str, settings: Mapping[str, str]) -> str:
    """`text` with the value of every secret-looking setting in `settings` replaced by `***`:
    librdkafka quotes a refused property's value back in its error."""
    for key, value in settings.items():
        if _SECRET_SETTING.search(key) and value:
            text = text.replace(str(value), REDACTED)
    return redact_text(text)


class RedactingFilter(logging.Filter):
    """Renders the message once, redacted, and drops the arguments it was built from."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = redact_text(record.getMessage())
        record.args = None
        if record.exc_info and record.exc_info[1] is not None:
            # Formatting the traceback later would re-read the exception's own (unredacted) text.
            record.exc_text = redact_text(logging.Formatter().formatException(record.exc_info))
            record.exc_info = None
        return True
