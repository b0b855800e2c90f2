"""The native (Rust) extension as Python sees it: whether it loaded, what its classes take and
return (`RawPlan`, `NativeProducer`), and the start-up lines that say which codec and producer run.

The extension is optional: without a Rust toolchain at install it is not built, `EXTENSION` is None
and the worker keeps the Python path. `BOTTLEDWATER_CODEC=python` keeps it from loading at all.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from typing import Protocol, cast

from cdc_worker.core.model import Op
from kafka_contract.redaction import redact_values

# A snapshot row: (key, value); the key is None for an unkeyed table.
CopyRow = tuple[bytes | None, bytes]
# A change: (op, key, value, unchanged TOAST column names). key None: unkeyed table; value None: a
# tombstone (delete, or the old key of an update that changed the key).
EncodedChange = tuple[Op, bytes | None, bytes | None, tuple[str, ...]]

_EXTENSION = "cdc_worker.core.encoding._native_codec"


class RawPlan(Protocol):
    """The extension's plan of one relation version (`native/src/`): batches in, items out, and
    where it stopped at an item it declines."""

    def encode_copy(
        self, data: bytes, start: int = 0
    ) -> tuple[list[CopyRow], tuple[int, int, int, int, str] | None]: ...

    def encode_changes(
        self, payloads: list[bytes], start: int = 0, in_stream: bool = False
    ) -> tuple[list[EncodedChange | None], tuple[int, str] | None]: ...

    def encode_spool_records(
        self, payloads: list[bytes], start: int = 0
    ) -> tuple[list[bytes], tuple[int, str] | None]: ...


# A message librdkafka refused when the native producer was handed it: (index in the call, key +
# value bytes, librdkafka's reason, whether it is over message.max.bytes).
Refused = tuple[int, int, str, bool]
CopyStop = tuple[int, int, int, int, str]
# What `Producer.produce_changes` did: (events numbered, stop, messages per op (c, u, d), their
# key and value bytes, refused messages).
ChangesProduced = tuple[int, tuple[int, str] | None, tuple[int, int, int], int, list[Refused]]
# A streamed transaction's records (`core.changes.spool.SpoolChunk`) by relation: (topic, batch).
SpoolTargets = dict[int, tuple[str, int]]
# What `Producer.produce_spooled` did: (position after the records taken, records taken, messages
# produced as (relation, inserts, updates, deletes, key and value bytes), refused messages as
# (relation, key + value bytes, reason, over message.max.bytes)).
SpooledProduced = tuple[int, int, list[tuple[int, int, int, int, int]], list[tuple[int, int, str, bool]]]
# One message `spooled_messages` makes: (topic, key, value, headers, batch).
SpooledMessage = tuple[str, bytes | None, bytes | None, list[tuple[str, bytes]], int]


# A transactional call's failure: (librdkafka's code name, its description, fatal, requires abort,
# retriable), as confluent-kafka's KafkaError says them.
TxnError = tuple[str, str, bool, bool, bool]


class TransactionCalls(Protocol):
    """A producer's transactional calls (one built with `transactional.id`), each None or the
    failure as `TxnError`: the native producer's own, or confluent-kafka's through
    `shell.kafka_transactions.ConfluentCalls`."""

    def init_transactions(self, timeout: float) -> TxnError | None: ...

    def begin_transaction(self) -> TxnError | None: ...

    def commit_transaction(self, timeout: float) -> TxnError | None: ...

    def abort_transaction(self, timeout: float) -> TxnError | None: ...

    def send_position(
        self, topic: str, partition: int, offset: int, group_id: str, timeout: float
    ) -> TxnError | None: ...


class NativeProducer(TransactionCalls, Protocol):
    """The extension's librdkafka producer (`native/src/producer.rs`), with its transactional calls."""

    def produce_copy(
        self,
        plan: RawPlan,
        data: bytes,
        start: int,
        *,
        topic: str,
        headers: list[tuple[str, bytes]],
        batch: int,
    ) -> tuple[int, CopyStop | None, list[Refused]]: ...

    def produce_changes(
        self,
        plan: RawPlan,
        payloads: list[bytes],
        start: int,
        *,
        topic: str,
        lsn: bytes,
        xid: bytes,
        commit_ts: bytes,
        first_seq: int,
        batch: int,
        stop_on_refusal: bool,
    ) -> ChangesProduced: ...

    def produce_spooled(
        self,
        records: list[bytes] | bytes,
        start: int,
        *,
        targets: SpoolTargets,
        lsn: bytes,
        xid: bytes,
        commit_ts: bytes,
        first_seq: int,
        stop_on_refusal: bool,
    ) -> SpooledProduced: ...

    def produce(
        self, topic: str, key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes]], batch: int
    ) -> tuple[int, str, bool] | None: ...

    def take_reports(self) -> tuple[list[tuple[int, int]], list[tuple[int, str, str, int]]]: ...

    def in_flight(self) -> int: ...

    def flush(self, timeout: float) -> int: ...


class Extension(Protocol):
    __version__: str
    librdkafka_version: str

    def Producer(self, settings: list[tuple[str, str]]) -> NativeProducer: ...  # the extension's class

    def spooled_messages(  # what `Producer.produce_spooled` would produce, for the tests
        self,
        records: list[bytes] | bytes,
        start: int,
        *,
        targets: SpoolTargets,
        lsn: bytes,
        xid: bytes,
        commit_ts: bytes,
        first_seq: int,
    ) -> tuple[int, int, list[SpooledMessage]]: ...

    def Plan(  # the extension's class, called with keywords only
        self,
        *,
        relation: str,
        relation_oid: int,
        columns: list[tuple[str, str, bytes, bool]],
        key_indexes: list[int],
        output_format: str,
        key_prefix: bytes,
        value_prefix: bytes,
        ops: tuple[Op, Op, Op],
    ) -> RawPlan: ...


# The worker's `--codec` environment variable: `python` keeps the extension from loading at all, so
# that the Python path can be run (and tested) on a machine where the extension is built.
CODEC_ENV = "BOTTLEDWATER_CODEC"


def _load() -> tuple[Extension | None, str]:
    if os.environ.get(CODEC_ENV) == "python":
        return None, f"turned off by {CODEC_ENV}=python"
    try:
        return cast(Extension, importlib.import_module(_EXTENSION)), ""
    except ImportError as exc:
        return None, str(exc)


# The loaded extension module, None when it is not built or turned off (`_IMPORT_ERROR` says why).
EXTENSION, _IMPORT_ERROR = _load()
NATIVE_AVAILABLE: bool = EXTENSION is not None


def codec_description() -> str:
    """Which row codec runs, for `bottledwater --version` and the worker's start-up line."""
    if EXTENSION is None:
        return f"python codec (native codec not loaded: {_IMPORT_ERROR})"
    return f"native (Rust) codec {EXTENSION.__version__}"


def producer_description() -> str:
    """Which producer the native codec can use, for `bottledwater --version`."""
    if EXTENSION is None:
        return "producer confluent-kafka"
    return f"producer native (librdkafka {EXTENSION.librdkafka_version}, linked in) or confluent-kafka"


class NativeProducerUnavailable(RuntimeError):
    """The native producer cannot be built: no extension, or a setting its librdkafka lacks."""


def build_native_producer(settings: Mapping[str, str]) -> NativeProducer:
    """A librdkafka producer in the extension with exactly these settings (those confluent-kafka's
    Producer takes); raises `NativeProducerUnavailable` with the reason when it cannot be built."""
    if EXTENSION is None:
        raise NativeProducerUnavailable(f"native codec not loaded: {_IMPORT_ERROR}")
    lacking = native_build_lacks(settings)
    if lacking is not None:
        raise NativeProducerUnavailable(lacking)
    try:
        return EXTENSION.Producer([(str(k), str(v)) for k, v in settings.items()])
    except ValueError as exc:
        # librdkafka quotes a refused setting's value, which may be a secret.
        raise NativeProducerUnavailable(redact_values(str(exc), settings)) from None


def native_build_lacks(settings: Mapping[str, str]) -> str | None:
    """What the native librdkafka cannot do that `settings` ask for, in a few words, or None.

    It is built with OpenSSL (TLS, SASL PLAIN, SCRAM-SHA-256/512 and OAUTHBEARER with a static or
    unsecured token) and zstd, but without Cyrus SASL (GSSAPI/Kerberos) or libcurl (OAUTHBEARER's
    `oidc` method, which fetches tokens over HTTPS): confluent-kafka's librdkafka serves those."""
    mechanism = str(settings.get("sasl.mechanisms", settings.get("sasl.mechanism", ""))).upper()
    if mechanism == "GSSAPI":
        return "sasl.mechanisms=GSSAPI (Kerberos) needs Cyrus SASL, which its librdkafka is built without"
    if str(settings.get("sasl.oauthbearer.method", "")).lower() == "oidc":
        return "sasl.oauthbearer.method=oidc needs libcurl, which its librdkafka is built without"
    return None
