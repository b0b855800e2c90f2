"""Secrets kept out of every line the worker prints: logs, errors, `--help`'s echo of options.

Pure text functions; the log handler (`shell.logs`) applies `redact_text` to every record as a
last line of defence, and the worker never logs a connection string it did not redact first.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from urllib.parse import urlsplit, urlunsplit

REDACTED = "***"
_SECRET_SETTING = re.compile(r"password|secret|jaas|token|user\.info|\.pem$|credentials", re.IGNORECASE)
_KV_PASSWORD = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)
_URL_IN_TEXT = re.compile(r"([a-z][a-z0-9+.-]*://)([^/@\s:]*):([^/@\s]*)@", re.IGNORECASE)


def redact_url(url: str) -> str:
    """`http://user:secret@host/x` -> `http://user:***@host/x`; other URLs unchanged."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit(parts._replace(netloc=f"{parts.username}:{REDACTED}@{host}"))


def redact_dsn(dsn: str) -> str:
    """A libpq DSN (URL or key=value form) with its password replaced by `***`."""
    return redact_text(dsn)


def redact_text(text: str) -> str:
    """Every `password=...` and `scheme://user:password@` in `text` redacted: a last line of defence
    for log messages and exception texts that may quote a connection string."""
    text = _URL_IN_TEXT.sub(lambda m: f"{m.group(1)}{m.group(2)}:{REDACTED}@", text)
    text = re.sub(r"([?&]password=)[^&\s]*", rf"\g<1>{REDACTED}", text, flags=re.IGNORECASE)
    return _KV_PASSWORD.sub(rf"\g<1>{REDACTED}", text)


def redact_settings(settings: Mapping[str, str]) -> dict[str, str]:
    """Kafka / registry settings with every secret-looking value replaced by `***`."""
    return {k: (REDACTED if _SECRET_SETTING.search(k) else v) for k, v in settings.items()}
