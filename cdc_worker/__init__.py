"""Bottled Water for Python: change data capture from PostgreSQL into Kafka."""

__version__ = "0.1.0"
