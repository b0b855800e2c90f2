"""PySpark jobs of the lakehouse half (docs/lakehouse.md): each a `main()` for spark-submit and plain
functions for Dagster and tests.

The jobs stand at the top: `merge` (Kafka changelogs -> Delta mirrors), `maintenance`
(OPTIMIZE/VACUUM), `quality` (checks returning `CheckResult`), `verify` (Postgres vs Delta,
differing keys), `consistent_read` (several mirrors at one source position); their options in one
table, `options`. Their parts, in layers (docs/architecture.md draws them):

- `merging`: the merge itself, one query's batches and one table's slice of them;
- `decoding`: Kafka records -> typed rows with Spark's built-in expressions;
- `lake`: the lake's state as Delta holds it (tables, marks, fingerprints);
- `connections`: the SparkSession, Kafka, the schema registry and Postgres;
- `rules`: the pure rules the others apply (layout, names, watermark, changes, key range, row hash).

A job run as a script (`spark-submit spark_jobs/merge.py`) puts this folder first on sys.path, so no
name at this level may be a standard library's or a dependency's (hence `connections`, not `io`).
"""
