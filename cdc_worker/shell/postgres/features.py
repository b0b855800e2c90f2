"""What the server's major version lets the worker do beyond the common ground, decided once at
start-up and said in one line each: stored generated columns in the publication (Postgres 18+) and
a failover slot (17+, shell/postgres/failover.py). The worker passes its options in as plain values,
so this module knows nothing of the configuration table.
"""

from __future__ import annotations

from dataclasses import dataclass

import psycopg2.extensions

from cdc_worker.shell.postgres import failover
from cdc_worker.shell.postgres.catalog import ServerFacts

GENERATED_COLUMNS_LINE = (
    "stored generated columns are published (Postgres 18+: publish_generated_columns = stored; "
    "--no-generated-columns leaves them out)"
)


@dataclass(frozen=True)
class ServerFeatures:
    generated_columns: bool  # the publications publish stored generated columns, the snapshot reads them
    failover: failover.FailoverChoice | None  # None when resuming: the slot exists as it was created

    @property
    def failover_slot(self) -> bool:
        return self.failover is not None and self.failover.enabled

    @property
    def problems(self) -> list[str]:
        problem = self.failover.problem if self.failover is not None else None
        return [problem] if problem else []

    def lines(self) -> list[str]:
        """The start-up lines (info), without the warning."""
        said = [GENERATED_COLUMNS_LINE] if self.generated_columns else []
        if self.failover is not None and self.failover.problem is None:
            said.append(self.failover.line)
        return said

    @property
    def warnings(self) -> list[str]:
        warning = self.failover.warning if self.failover is not None else None
        return [warning] if warning else []


def server_features(
    conn: psycopg2.extensions.connection,
    facts: ServerFacts,
    *,
    no_generated_columns: bool,
    failover_setting: str,
    creating_slot: bool,
) -> ServerFeatures:
    choice = None
    if creating_slot and facts.in_recovery:
        choice = failover.standby_choice(failover_setting)
    elif creating_slot:
        choice = failover.choose_failover(failover_setting, failover.failover_facts(conn))
    generated = facts.publishes_generated_columns and not no_generated_columns
    return ServerFeatures(generated, choice)
