"""The reference decoder: Kafka records -> typed rows in Python (fastavro in `mapInArrow`), the
executable statement of what each type becomes in the lake. The merge decodes with Spark's built-in
expressions (`spark_jobs.decoding`); tests/integration/test_spark_decode.py holds the two equal on
every type of the catalog. Nothing of the product imports this package."""
