"""PySpark jobs of the lakehouse half (docs/lakehouse.md): each a `main()` for spark-submit and plain
functions for Dagster and tests.

Jobs: `merge` (Kafka changelogs -> Delta mirrors), `maintenance` (OPTIMIZE/VACUUM), `quality`
(checks returning `CheckResult`), `verify` (Postgres vs Delta, differing keys); their options in one
table, `options`.
Their parts: `session` (SparkSession), `merge_batch` (one micro-batch), `batch_schema` (what a
batch holds), `spark_decode` (Kafka records -> rows with from_avro/from_json; the record's
envelope and frame in `spark_envelope`, the lake's value conventions in `spark_values`), `decoders` (its
Python reference) and `wire` (value normalisers; the contract itself is
`kafka_contract`'s), `spark_types` (type mapping), `registry` (writer schemas by id), `changes`
(TOAST carry, TRUNCATE, newest per key), `truncates` (TRUNCATE positions, before the mirror too),
`delta_tables` (create, evolve, guarded MERGE), `scd2` (history), `layout` and `names` (paths,
properties, quoted identifiers), `postgres_catalog`, `postgres_rows`, `rowhash`, `fingerprints`
(the Postgres side and the comparable row hashes), `warehouse` (listing the mirrors).
"""
