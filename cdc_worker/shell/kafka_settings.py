"""The settings of the worker's Kafka clients: the producers' (with the delivery guarantees the
acknowledgement relies on), the admin client's, and librdkafka's own table of them (`--config-help`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

log = logging.getLogger(__name__)

# Settings that make delivery reports mean "durable and in order"; -C may override them, at the
# user's own risk, which the worker logs.
GUARANTEE_SETTINGS = {"enable.idempotence": "true", "acks": "all"}
DEFAULT_PRODUCER_SETTINGS = {
    "partitioner": "murmur2_random",
    "compression.codec": "lz4",
    "linger.ms": "20",
    # librdkafka's default buffers up to 1 GB; the worker's memory must stay bounded (a 2M-row
    # transaction streams through, it is never held), and 64 MB keeps batches large enough.
    "queue.buffering.max.kbytes": "65536",
}


def producer_settings(broker: str, overrides: Mapping[str, str], client_id: str) -> dict[str, str]:
    settings = {"bootstrap.servers": broker, "client.id": client_id}
    settings.update(DEFAULT_PRODUCER_SETTINGS)
    settings.update(GUARANTEE_SETTINGS)
    settings.update(overrides)
    weakened = {
        k: overrides[k]
        for k in GUARANTEE_SETTINGS
        if k in overrides and overrides[k] != GUARANTEE_SETTINGS[k]
    }
    if weakened:
        log.warning(
            "-C overrides %s: deliveries may be lost or reordered and acknowledged LSNs no longer "
            "imply durability in Kafka",
            weakened,
        )
    return settings


def admin_settings(broker: str, overrides: Mapping[str, str]) -> dict[str, str | int | float | bool]:
    """The admin client is a librdkafka producer handle too, so -C (security, SASL) applies as is."""
    return {**overrides, "bootstrap.servers": broker}


def count_brokers(broker: str, kafka_config: Mapping[str, str], timeout: float = 10.0) -> int | None:
    """How many brokers the cluster's metadata lists, or None when it does not answer in time."""
    try:
        metadata = AdminClient(admin_settings(broker, kafka_config)).list_topics(timeout=timeout)
    except KafkaException:
        return None
    return len(metadata.brokers) or None


def print_librdkafka_properties() -> bool:
    """Print librdkafka's table of configuration properties to stdout, as Bottled Water's
    `--config-help` did; False when the bundled librdkafka cannot be found."""
    import ctypes
    import glob
    import os
    import sys

    import confluent_kafka

    package_dir = os.path.dirname(confluent_kafka.__file__)
    candidates = glob.glob(os.path.join(package_dir, os.pardir, "confluent_kafka.libs", "librdkafka*.so*"))
    if not candidates:
        return False
    library = ctypes.CDLL(candidates[0])
    libc = ctypes.CDLL(None)
    libc.fdopen.restype = ctypes.c_void_p
    libc.fdopen.argtypes = [ctypes.c_int, ctypes.c_char_p]
    libc.fflush.argtypes = [ctypes.c_void_p]
    libc.fclose.argtypes = [ctypes.c_void_p]
    library.rd_kafka_conf_properties_show.argtypes = [ctypes.c_void_p]
    sys.stdout.flush()
    # A FILE* of its own on a duplicate of stdout, closed afterwards, so stdout itself stays open.
    handle = libc.fdopen(os.dup(sys.stdout.fileno()), b"w")
    library.rd_kafka_conf_properties_show(handle)
    libc.fclose(handle)
    return True
