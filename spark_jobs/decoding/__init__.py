"""Kafka records -> typed rows with Spark's built-in expressions (`from_avro`, `from_json`, SQL
functions), in the JVM with no Python per record: per format (`spark_decode`), the record's envelope
of headers, partition, offset and Confluent frame (`spark_envelope`), the lake's value conventions
(`spark_values`), and the Avro and Postgres types mapped to Spark's (`spark_types`).
"""
