"""Bottled Water for Python: change data capture from PostgreSQL into Kafka.

The package in layers, each importing only the layers below it (docs/architecture.md):

- top: `cli` (the `bottledwater` command), `config` (every option in one table), `worker` (one run:
  snapshot, stream, exit codes), `startup` (codec and producer choice, every check before a change).
- `shell/`, the I/O: `postgres/` (`catalog`: connections, tables, types, start-up checks; `slot`:
  slots and publications), `kafka_publisher` (topics, the producer, delivery), `snapshot/`
  (`reader` runs it, `chunks` COPYs ctid ranges, `process` in worker processes, `progress`),
  `stream/` (`session` reads pgoutput and dispatches each message kind to its owner: `row_changes`,
  `in_progress` transactions, `relations`, `ddl_events`, `truncates`, `resnapshot` (with
  `resnapshot_reader`) and `acknowledgement`; `heartbeat` keeps status updates going), `metrics`,
  `logs`.
- `core/`, pure (no socket, no thread): `pgoutput/` (`messages`, `decoder`, the fused
  `insert_reader`), `changes/` (`assembler` turns messages into events, built by `events`,
  `streamed` transactions, `fast_insert`), `pgtypes/` (`oids`, `text` and `temporal` parsers,
  `mapping` to Avro/JSON, `copy_text`), `encoding/` (`avro_schema`, `avro_writer` and
  `json_writer` compiled per relation, `serializers`, `avro_serializer`, `json_serializer`, the
  optional `native` codec: `native_extension` loads it, `native_plan` runs a relation's batches),
  `ack` (what may be acknowledged), `lsn`, `incremental` (the re-snapshot state machine), `model`,
  `errors`.

The Kafka contract the worker writes (topic names, `bw.*` headers, framing, control events) is the
`kafka_contract` package, shared with `spark_jobs` and `orchestration`, as is `redaction`. What the
worker and `spark_jobs` both use to reach Spark and Postgres (the SparkSession builder of the Spark
snapshot, libpq's TLS hints) is the `shared_connections` package: the worker imports nothing of
`spark_jobs`, which imports nothing of it.
"""

__version__ = "0.1.0"
