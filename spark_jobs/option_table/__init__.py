"""Every option of the Spark jobs, in one table (`OPTIONS`): flag, environment variable, type,
default, doc and the jobs that take it, in rooms by the jobs they serve; the terms of an entry and
the defaults are `spark_jobs.options`. The order is the CLIs' help order."""

from __future__ import annotations

from spark_jobs.option_table import inputs, merge_job, other_jobs, spark
from spark_jobs.options import JobOption

OPTIONS: tuple[JobOption, ...] = (*inputs.OPTIONS, *merge_job.OPTIONS, *other_jobs.OPTIONS, *spark.OPTIONS)
