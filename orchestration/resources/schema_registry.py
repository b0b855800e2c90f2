"""The Confluent-compatible schema registry that holds the topics' Avro schemas."""

from __future__ import annotations

import dagster as dg
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError
from pydantic import Field

HTTP_NOT_FOUND = 404
REQUEST_TIMEOUT_S = 10  # a registry that does not answer fails the step instead of hanging it


class SchemaRegistryResource(dg.ConfigurableResource):
    """None as `url` means JSON output: no registry involved."""

    url: str | None = Field(default=None, description="Registry base URL, e.g. .../apis/ccompat/v7 (secret).")

    def client(self) -> SchemaRegistryClient:
        if not self.url:
            raise ValueError("no schema registry configured (BOTTLEDWATER_SCHEMA_REGISTRY) for Avro output")
        return SchemaRegistryClient({"url": self.url, "timeout": REQUEST_TIMEOUT_S})

    def latest_schema_id(self, subject: str) -> int | None:
        """The id of the newest schema under `subject`; None when nothing is registered yet."""
        try:
            schema_id = self.client().get_latest_version(subject).schema_id
        except SchemaRegistryError as exc:
            if exc.http_status_code == HTTP_NOT_FOUND:
                return None
            raise
        return None if schema_id is None else int(schema_id)
