"""Logging for the worker: plain text or one JSON object per line, passwords always redacted.

Every record passes through `RedactingFilter`, so a message or exception that quotes a connection
string (psycopg2 and librdkafka errors sometimes do) cannot leak a password into the logs.
Structured context goes in `extra=` (`table`, `lsn`, `topic`...) and becomes JSON fields.
"""

from __future__ import annotations

import enum
import json
import logging
import sys
from datetime import UTC, datetime
from typing import TextIO

from kafka_contract.redaction import RedactingFilter

# Attributes every LogRecord has; anything else was passed in `extra=` and is worth printing.
_STANDARD_ATTRIBUTES = frozenset(
    logging.LogRecord("", 0, "", 0, "", (), None).__dict__.keys() | {"message", "asctime", "taskName"}
)
QUIET_LOGGERS = ("httpx", "httpx2", "httpcore")
TEXT_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"


class LogFormat(enum.StrEnum):
    TEXT = "text"
    JSON = "json"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD_ATTRIBUTES:
                entry[key] = value if isinstance(value, str | int | float | bool | None) else str(value)
        if record.exc_text:
            entry["exception"] = record.exc_text
        return json.dumps(entry, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """The usual text line, with `extra=` fields appended as key=value."""

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        extras = [f"{k}={v}" for k, v in record.__dict__.items() if k not in _STANDARD_ATTRIBUTES]
        return f"{line} ({', '.join(extras)})" if extras else line


def configure_logging(log_format: LogFormat, level: str, stream: TextIO | None = None) -> None:
    """Replace the root logger's handlers with one redacting handler on `stream` (stderr)."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.addFilter(RedactingFilter())
    handler.setFormatter(JsonFormatter() if log_format is LogFormat.JSON else TextFormatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    # The registry client logs every HTTP request at INFO; that is debugging detail here.
    for chatty in QUIET_LOGGERS:
        logging.getLogger(chatty).setLevel(max(logging.WARNING, root.level))
