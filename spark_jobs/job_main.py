"""What every Spark job's `main` shares: its `SparkJobError` becomes one line on stderr and its kind's
exit code (`spark_jobs.errors`), so that a pod's log and a scheduler's retry rule read the same."""

from __future__ import annotations

import functools
import sys
from collections.abc import Sequence
from typing import Protocol

from kafka_contract.redaction import redact_text
from spark_jobs.errors import SparkJobError


class Main(Protocol):
    def __call__(self, argv: Sequence[str] | None = None) -> int: ...


def exit_on_error(main: Main) -> Main:
    """`main`, with its `SparkJobError` printed as its message alone (no traceback: the message names
    the fix, and a traceback would bury it), its passwords redacted (libpq and the clients may quote
    a connection string), and returned as the kind's exit code."""

    @functools.wraps(main)
    def run(argv: Sequence[str] | None = None) -> int:
        try:
            return main(argv)
        except SparkJobError as exc:
            print(redact_text(str(exc)), file=sys.stderr, flush=True)
            return exc.exit_code

    return run
