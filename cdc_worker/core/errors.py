"""The worker's errors by kind, so that `--on-error`, retries and exit codes are decided by type.

- `DataError`: one change or snapshot row cannot be published as it is (a value with no
  representation, a message over the size limit). `--on-error=log` skips it; `exit` stops without
  acknowledging past it.
- `InfrastructureError`: a service failed or cannot be reached (Kafka, the schema registry,
  Postgres mid-stream). The worker exits 1; a restart (the supervisor's) is the remedy.
- `ConfigurationError`: the options or the servers are not set up for the worker (a missing
  privilege, `wal_level`, an unkeyed table without `-u`). The worker exits 2: it needs a person.

Each module's own exceptions derive from one of these (and from `ValueError` or `RuntimeError`
where callers already catch those).
"""

from __future__ import annotations


class BottledWaterError(Exception):
    """Base of every error the worker raises on purpose; the message says what to do."""


class DataError(BottledWaterError):
    """One change or row cannot be published as it is: handled by `--on-error`."""


class InfrastructureError(BottledWaterError):
    """A service failed or is unreachable: exit 1 and restart."""


class ConfigurationError(BottledWaterError):
    """Bad options or a server not set up for the worker: exit 2, a person must act."""


class RegistryUnavailable(InfrastructureError):
    """The schema registry did not register a schema: unreachable, or it refused the schema
    (its compatibility level)."""
