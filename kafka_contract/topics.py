"""Bottled Water's safe names: how Postgres identifiers become Kafka topic names and Avro names.

Postgres identifiers may hold any character (`"person.name/surname"`, `"crêpes"`), while Avro names
must match `[A-Za-z_][A-Za-z0-9_]*` and Kafka topic names `[A-Za-z0-9._-]{1,249}`. Bottled Water
solved both with one escape, kept here so that topics and schemas stay compatible with it: every byte
of the UTF-8 name outside `[A-Za-z0-9_]`, and a leading digit, becomes `_xx_` (two lowercase hex
digits). Dots then separate the parts of a topic name and of an Avro namespace.

The escape is not injective (`a.b` and `a_2e_b` both give `a_2e_b`), exactly as in Bottled Water;
`avro_field_names` refuses such a clash inside one table instead of producing a broken schema.
"""

from __future__ import annotations

import re
from typing import Protocol

# Postgres's default schema is left out of topic names, as Bottled Water does.
DEFAULT_SCHEMA = "public"
CONTROL_TOPIC_NAME = "bottledwater.control"
TRANSACTIONAL_ID_PREFIX = "bottledwater-"
# Kafka refuses longer topic names (`Topic.MAX_NAME_LENGTH`).
MAX_TOPIC_NAME_LENGTH = 249

_SAFE_BYTES = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")
_DIGITS = frozenset(b"0123456789")
_LEGAL_TOPIC = re.compile(r"[A-Za-z0-9._-]+")


class SourceTable(Protocol):
    """What naming needs of a Postgres table (the worker's `TableSchema` is one)."""

    @property
    def namespace(self) -> str: ...

    @property
    def name(self) -> str: ...

    @property
    def qualified_name(self) -> str: ...


class NamingError(ValueError):
    """A name that cannot become a topic or Avro name; the message says what to change."""


def safe_name(name: str) -> str:
    """Escape `name` the Bottled Water way: `person.name/surname` -> `person_2e_name_2f_surname`."""
    if not name:
        raise NamingError("an empty name cannot become a topic or Avro name")
    out: list[str] = []
    for position, byte in enumerate(name.encode("utf-8")):
        if byte in _SAFE_BYTES and not (position == 0 and byte in _DIGITS):
            out.append(chr(byte))
        else:
            out.append(f"_{byte:02x}_")
    return "".join(out)


def control_topic_name(prefix: str | None = None) -> str:
    """`[prefix.]bottledwater.control`: where TRUNCATE and other control events go."""
    return _with_prefix(prefix, CONTROL_TOPIC_NAME)


def transactional_id(slot: str, prefix: str | None = None) -> str:
    """A slot's Kafka `transactional.id` under `--delivery exactly-once`,
    `bottledwater-[<prefix>-]<slot>`: one per slot and topic prefix (two Postgres clusters may both
    have a slot `bottledwater`, but not with the same topics). Also the consumer group whose offset
    of the control topic's partition 0 is the position the slot's last Kafka commit made visible."""
    return f"{transactional_ids(prefix)}{slot}"


def snapshot_points_group(tid: str) -> str:
    """For the slot whose transactional id is `tid`: the consumer group whose committed offset of
    partition 0 of a table's topic is the LSN the table's exactly-once snapshot was read at,
    `<tid>-snapshot` (a slot's name has no `-`, so no slot's id is ever this)."""
    return f"{tid}-snapshot"


def snapshot_transactional_id(tid: str, reader: int, *, native: bool = False) -> str:
    """The transactional id of the slot's snapshot reader number `reader`, `<tid>-snapshot-<n>`
    (its native producer's `<tid>-snapshot-<n>-native`)."""
    return f"{snapshot_points_group(tid)}-{reader}{'-native' if native else ''}"


def streamed_transactional_id(tid: str, number: int) -> str:
    """The transactional id of the slot's producer number `number` for large transactions produced
    while they run, `<tid>-streamed-<n>`."""
    return f"{tid}-streamed-{number}"


def transactional_ids(prefix: str | None = None) -> str:
    """What the transactional ids of every slot publishing with `prefix` begin with (an ACL's
    prefixed pattern)."""
    return f"{TRANSACTIONAL_ID_PREFIX}{prefix}-" if prefix else TRANSACTIONAL_ID_PREFIX


def topic_name(table: SourceTable, prefix: str | None = None) -> str:
    """`[prefix.][schema.]table` with safe names, the schema left out for `public`."""
    parts = [] if table.namespace == DEFAULT_SCHEMA else [safe_name(table.namespace)]
    parts.append(safe_name(table.name))
    topic = _with_prefix(prefix, ".".join(parts))
    if topic == control_topic_name(prefix):
        raise NamingError(
            f"table {table.qualified_name} would publish to the control topic {topic!r}; "
            "rename the table or leave it out of the publication"
        )
    if len(topic) > MAX_TOPIC_NAME_LENGTH:
        raise NamingError(
            f"topic name for table {table.qualified_name} is {len(topic)} characters after escaping "
            f"(Kafka allows {MAX_TOPIC_NAME_LENGTH}): use a shorter --topic-prefix or rename the table"
        )
    return topic


def _with_prefix(prefix: str | None, name: str) -> str:
    if not prefix:
        return name
    if not _LEGAL_TOPIC.fullmatch(prefix):
        raise NamingError(
            f"topic prefix {prefix!r} holds characters Kafka refuses in topic names: "
            "use only letters, digits, '.', '_' and '-'"
        )
    return f"{prefix}.{name}"
