"""The jobs' I/O to the systems outside the lake: Kafka (`kafka_source`, the subscription and bounded
reads; `kafka_client`, the same settings for librdkafka), the schema registry (`registry`), and
Postgres (`postgres_connect`, `postgres_catalog`, `postgres_rows`, with the DSN kept out of the
process list and the logs by `dsn`). The SparkSession and libpq's TLS hints are the worker's too:
`shared_connections`.
"""
