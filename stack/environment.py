"""The variables a process needs to use the stack: the product's, the tests' and Dagster's."""

from __future__ import annotations

from stack import dagster_home
from stack.config import StackConfig


def env_values(cfg: StackConfig) -> dict[str, str]:
    """What `bw-stack env` exports: the addresses the product and the tests read."""
    return {
        "BOTTLEDWATER_POSTGRES": cfg.postgres_url(),
        "BOTTLEDWATER_BROKER": cfg.kafka_bootstrap,
        "BOTTLEDWATER_SCHEMA_REGISTRY": cfg.registry_url,
        "BW_SPARK_JARS": ",".join(str(p) for p in cfg.spark_jars()),
        "DAGSTER_HOME": str(cfg.dagster_home),
        **dagster_home.env_values(cfg),
    }
