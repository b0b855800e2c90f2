"""The merge itself: the one query's `foreachBatch` (`merge_query`), one table's slice of a batch
(`merge_batch`), what a batch holds (`batch_schema`) and how its columns decode (`batch_columns`),
TRUNCATE positions (`truncates`), DDL events (`ddl`), tables parked after a failure (`parked`), the
SCD2 history (`scd2`) and where the query's checkpoint starts (`query_checkpoint`).

The job that runs it is `spark_jobs.merge`.
"""
