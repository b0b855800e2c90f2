"""The Dagster code location: assembles resources, assets, checks, jobs, sensors and schedules.

Only assembly happens here; every body lives in `cdc_worker` or `spark_jobs`.
"""

from __future__ import annotations

import dagster as dg

defs = dg.Definitions(assets=[], jobs=[], sensors=[], schedules=[])
