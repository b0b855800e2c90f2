"""The commands a session's py4j client sends to the JVM, counted on the unit tier's real JVM: what
the jobs build again costs a round trip each."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@contextmanager
def round_trips(spark: SparkSession) -> Iterator[list[str]]:
    """The commands the session's py4j client sends meanwhile, but py4j's releases of objects Python
    dropped (sent from its own thread whenever the garbage is collected)."""
    client: Any = spark.sparkContext._gateway._gateway_client  # type: ignore[union-attr]
    sent: list[str] = []
    original = client.send_command

    def counting(command: str, *args: Any, **kwargs: Any) -> Any:
        if not command.startswith("m\n"):
            sent.append(command)
        return original(command, *args, **kwargs)

    client.send_command = counting
    try:
        yield sent
    finally:
        del client.send_command
