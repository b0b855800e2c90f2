"""The Spark jobs' errors by kind, so that a job's exit code and whether to retry are decided by type.

- `CONFIGURATION`: the options, or the lake or a server, are not set up for the job (a missing flag,
  a changelog the merge was started without, a table Postgres does not have). Exit 2, as argparse's
  own refusals do: a person must act, and running again as it is fails the same way.
- `INFRASTRUCTURE`: a service failed or cannot be reached (Postgres, the schema registry), or the lake
  has nothing to serve yet. Exit 1: running again later is the remedy.
- `DATA`: the lake's data cannot go on as it is (a topic deleted and created again, a column type
  a Delta column cannot follow). Exit 3: a person must rebuild the table or decide the schema; a
  retry, and a change of options, fail the same way.

The worker's errors (cdc_worker.core.errors) draw the same line between 1 and 2. Each module's own
exceptions derive from `SparkJobError`, and also from `ValueError`, `RuntimeError` or libpq's error
where callers already catch those; `spark_jobs.job_main.exit_on_error` turns one into a job's exit.
Pure: no I/O, and nothing of spark_jobs, so that every layer may import it.
"""

from __future__ import annotations

import enum
from typing import ClassVar


class ErrorKind(enum.Enum):
    CONFIGURATION = "configuration"
    INFRASTRUCTURE = "infrastructure"
    DATA = "data"

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self]


EXIT_OK = 0
EXIT_INFRASTRUCTURE = 1  # also a check that found a difference (verify, quality)
EXIT_CONFIGURATION = 2  # also argparse's refusal of the command line
EXIT_DATA = 3
EXIT_CODES = {
    ErrorKind.INFRASTRUCTURE: EXIT_INFRASTRUCTURE,
    ErrorKind.CONFIGURATION: EXIT_CONFIGURATION,
    ErrorKind.DATA: EXIT_DATA,
}


class SparkJobError(Exception):
    """Base of every error a Spark job raises on purpose; the message is one line naming the fix."""

    kind: ClassVar[ErrorKind] = ErrorKind.INFRASTRUCTURE

    @property
    def exit_code(self) -> int:
        return self.kind.exit_code


class ConfigurationError(SparkJobError, ValueError):
    """Bad options, or a lake or server not set up for the job: exit 2, a person must act."""

    kind = ErrorKind.CONFIGURATION


class InfrastructureError(SparkJobError, RuntimeError):
    """A service failed or is unreachable, or the lake is not ready yet: exit 1, retry later."""

    kind = ErrorKind.INFRASTRUCTURE


class DataError(SparkJobError, RuntimeError):
    """The lake's data cannot go on as it is (a rebuild or a schema decision): exit 3."""

    kind = ErrorKind.DATA
