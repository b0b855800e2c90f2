"""Where a page's links go: the Dagster UI's own routes and the runbook. Pure: no I/O.

Every link in an alert must open from a chat or a pager, so each is an absolute URL: the UI's address
(`BW_DAGSTER_URL`, which the demo sets from its port) plus a path the UI really serves, and the
runbook's rendered page (`BW_RUNBOOK_URL`) plus a heading anchor of docs/orchestration.md. The paths
are checked against a running webserver in a browser by tests/integration/test_orchestration_ui.py,
and the anchors against the page's headings by tests/unit/test_pages.py.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from urllib.parse import quote

# The code location as workspace.yaml loads it: a `python_module` location is named after its module,
# and a module's `@dg.definitions` becomes the repository `__repository__`.
CODE_LOCATION = "orchestration.definitions"
REPOSITORY = "__repository__"
# The worker's job as orchestration/jobs.py defines it: pages link to its runs.
CDC_WORKER_JOB = "cdc_worker"
# docs/orchestration.md as the forge renders it; set BW_RUNBOOK_URL to your own copy.
DEFAULT_RUNBOOK_URL = "https://github.com/bottledwater/bottledwater-python/blob/main/docs/orchestration.md"


class Runbook(enum.StrEnum):
    """Runbook sections, by the heading text of docs/orchestration.md they link to."""

    SLOT = "Runbook: a lagging or lost slot"
    WORKER_DOWN = "The worker is not running"
    NEEDS_PERSON = "The worker stopped and needs a person"
    REBUILD = "Rebuilding after a lost slot"
    RUN_FAILED = "A run failed"


def heading_anchor(heading: str) -> str:
    """The anchor a forge (GitHub, GitLab, Gitea) gives a Markdown heading: lower case, punctuation
    other than `-` and `_` dropped, spaces to `-`."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@dataclass(frozen=True)
class UiLinks:
    dagster_url: str
    runbook_url: str = DEFAULT_RUNBOOK_URL
    location: str = CODE_LOCATION
    repository: str = REPOSITORY

    def _ui(self, path: str) -> str:
        return f"{self.dagster_url.rstrip('/')}{path}"

    def job(self, job_name: str) -> str:
        """The job's page with its runs; the UI serves jobs under their code location."""
        where = quote(f"{self.repository}@{self.location}", safe="@")
        return self._ui(f"/locations/{where}/jobs/{quote(job_name)}")

    def run(self, run_id: str) -> str:
        return self._ui(f"/runs/{quote(run_id)}")

    def asset(self, *path: str) -> str:
        return self._ui("/assets/" + "/".join(quote(part) for part in path))

    def runbook(self, section: Runbook) -> str:
        return f"{self.runbook_url}#{heading_anchor(section.value)}"
