"""Writer schemas by id from the schema registry (Confluent-compatible API), cached per process.

A schema id never changes meaning in a registry, so the cache never expires; only the driver asks
(once per new id), and the decoders receive the schemas with the batch.
"""

from __future__ import annotations

import json
import threading
from typing import Any

from spark_jobs.errors import InfrastructureError


class SchemaRegistryError(InfrastructureError):
    """The registry could not give a schema the batch needs; the text names id, URL and fix."""


# Per registry URL, shared by every table merged in this process: ids mean the same for all.
_SCHEMAS_BY_URL: dict[str, dict[int, Any]] = {}
_LOCK = threading.Lock()


class WriterSchemas:
    """`get(schema_id)` -> the parsed Avro schema (a dict), fetched once per process and registry."""

    def __init__(self, url: str, config: dict[str, str] | None = None) -> None:
        self.url = url
        self._config = {"url": url, **(config or {})}
        self._client: Any = None
        with _LOCK:
            self._cache = _SCHEMAS_BY_URL.setdefault(url, {})
        self._lock = _LOCK

    def _registry(self) -> Any:
        if self._client is None:
            from confluent_kafka.schema_registry import SchemaRegistryClient

            self._client = SchemaRegistryClient(self._config)
        return self._client

    def get(self, schema_id: int) -> Any:
        with self._lock:
            cached = self._cache.get(schema_id)
            if cached is not None:
                return cached
            try:
                schema = self._registry().get_schema(schema_id)
            except Exception as exc:
                raise SchemaRegistryError(
                    f"schema id {schema_id} could not be fetched from {self.url} ({exc}): "
                    "is --schema-registry the registry the worker writes to?"
                ) from exc
            if schema.schema_type not in (None, "AVRO"):
                raise SchemaRegistryError(
                    f"schema id {schema_id} at {self.url} is {schema.schema_type}, not Avro"
                )
            parsed = json.loads(schema.schema_str)
            self._cache[schema_id] = parsed
            return parsed

    def get_many(self, schema_ids: set[int]) -> dict[int, Any]:
        return {schema_id: self.get(schema_id) for schema_id in sorted(schema_ids)}
