"""What both halves of Bottled Water use to reach Spark and Postgres: the worker (its Spark snapshot,
its catalog connections) and the lake's jobs import one definition of each, and neither imports the
other (docs/architecture.md).

- `spark_session`: the one way to build a SparkSession with Kafka and Delta, locally, under
  spark-submit or against a cluster (`SparkSettings`, `build_session`);
- `jvm_names`: py4j's JVM names resolved once per process, which `build_session` turns on;
- `libpq_tls`: libpq's TLS failures and the DSN setting each one names (`tls_hint`).

Like `kafka_contract`, it imports nothing of the worker, the jobs, the orchestration or the stack;
executors import it too, so it ships with them (`--py-files`).
"""
