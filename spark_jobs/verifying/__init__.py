"""Verify's parts: a mirror against its Postgres table once (`compare`), and the keys that differ
settled at one source position while the source is written to (`settle`). It stands with the jobs,
above the read side whose consistent reads it compares."""
