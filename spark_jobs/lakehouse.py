"""The lake's Python API: what a user of the lake imports, in one place (docs/lakehouse.md, "Python API").

The modules of `spark_jobs` move as the code does; these names stay, with their signatures (a test
pins them: tests/unit/test_lakehouse_api.py). Import from here:

    from spark_jobs.lakehouse import build_session, read_consistent

    spark = build_session()
    read = read_consistent(spark, "/lake", ["public.accounts", "public.transfers"])
    read.register_views()
    spark.sql("SELECT sum(balance) FROM accounts").show()

Reading: `read_consistent` (several tables as of one source position; through the lake's changelog
when the warehouse keeps one, with nothing but the warehouse), `ConsistentRead`, `TableRead`,
`NoCommonWatermark`. The session: `build_session`, `SparkSettings`. Merging and rebuilding from
Python: `MergeOptions`, `KafkaSource`, `run_merge`, `run_continuous`, `TableRun`, `rebuild`,
`Rebuilt`. The errors a merge or a rebuild refuses with: `ChangelogRequired`, `TopicRecreated`,
`RebuildRefused`.
"""

from __future__ import annotations

from shared_connections.spark_session import SparkSettings, build_session
from spark_jobs.merge import ChangelogRequired, KafkaSource, TableRun, run_continuous, run_merge
from spark_jobs.merge_options import MergeOptions
from spark_jobs.reading.consistent import NoCommonWatermark, read_consistent
from spark_jobs.reading.result import ConsistentRead, TableRead
from spark_jobs.rebuild import RebuildRefused, Rebuilt, rebuild
from spark_jobs.rules.topic_identity import TopicRecreated

__all__ = [
    "ChangelogRequired",
    "ConsistentRead",
    "KafkaSource",
    "MergeOptions",
    "NoCommonWatermark",
    "RebuildRefused",
    "Rebuilt",
    "SparkSettings",
    "TableRead",
    "TableRun",
    "TopicRecreated",
    "build_session",
    "read_consistent",
    "rebuild",
    "run_continuous",
    "run_merge",
]
