"""One Dagster resource per external system; each is configured here and talks to its system only
through the product's own modules (`cdc_worker`, `spark_jobs`) or the system's client library."""

from orchestration.resources.alerting import AlertingResource
from orchestration.resources.kafka import KafkaResource
from orchestration.resources.postgres import PostgresResource
from orchestration.resources.schema_registry import SchemaRegistryResource
from orchestration.resources.spark import SparkResource
from orchestration.resources.warehouse import DeltaWarehouseResource

__all__ = [
    "AlertingResource",
    "DeltaWarehouseResource",
    "KafkaResource",
    "PostgresResource",
    "SchemaRegistryResource",
    "SparkResource",
]
