"""The Kafka contract every part of Bottled Water shares (docs/worker.md, "Topics"; docs/types.md).

Pure Python with no heavy dependency (no registry client, no psycopg2, no Spark), so the worker,
the Spark jobs (on executors too) and Dagster import one definition of it:

- `topics`: `[prefix.][schema.]table` topic names, the control topic, Bottled Water's safe names;
- `avro_names`: the Avro record name, namespace and field names of a table's schemas;
- `headers`: the `bw.*` header names, the op codes, and parsing them back (`EventHeaders`);
- `framing`: the Confluent wire format (magic byte, 4-byte schema id) written and read;
- `control`: control-topic events (TRUNCATE, re-snapshot reports): their ops, keys and decoding.
- `redaction`: passwords kept out of every line any part prints (connection strings, settings),
  and the log filter that applies it: not the contract itself, but shared by the same parts.
"""
