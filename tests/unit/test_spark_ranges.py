"""What the Spark snapshot's tasks share with the driver: the schema ids registered once on the
driver answer every lookup of an executor's serializer, and its bytes are the worker's."""

from __future__ import annotations

import pickle
from datetime import UTC, datetime

import pytest
from confluent_kafka.schema_registry import Schema

from cdc_worker.core.ack import FailurePolicy
from cdc_worker.core.encoding.avro_serializer import AvroEventSerializer
from cdc_worker.core.errors import RegistryUnavailable
from cdc_worker.core.model import ChangeEvent, Column, Op, TableSchema
from cdc_worker.core.pgtypes.oids import PgType
from cdc_worker.shell.postgres.catalog import CatalogTable
from cdc_worker.shell.snapshot.chunks import Chunk, SnapshotSpec
from cdc_worker.shell.snapshot.gone_keys import SeenKeys, gone_keys
from cdc_worker.shell.snapshot.spark_ranges import (
    FakeFailure,
    KnownSchemaIds,
    RangeJob,
    RecordingRegistrar,
    register_schemas,
)

COLUMNS = (Column("id", PgType.INT4, -1), Column("note", PgType.TEXT, -1))
KEYED = TableSchema(16384, "public", "orders", COLUMNS, key_columns=("id",))
UNKEYED = TableSchema(16385, "public", "log", (Column("line", PgType.TEXT, -1),))


class CountingRegistry:
    """A registry that hands out ids in order and counts its calls."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def register_schema(self, subject_name: str, schema: Schema, normalize_schemas: bool = False) -> int:
        self.calls.append(subject_name)
        return 100 + len(self.calls)


def catalog(schema: TableSchema) -> CatalogTable:
    return CatalogTable(schema, schema.is_keyed, selectable=True, owned=True, pages=10, estimated_rows=5)


def test_the_driver_registers_each_subject_once_and_executors_ask_no_registry() -> None:
    registry = CountingRegistry()
    recording = RecordingRegistrar(registry)
    driver = AvroEventSerializer(recording, {}, topic_prefix="p")
    register_schemas(driver, [catalog(KEYED), catalog(UNKEYED)])
    assert registry.calls == ["p.orders-value", "p.orders-key", "p.log-value"]

    spec = SnapshotSpec("dbname=x", "00000003-1", 0x1234, datetime(2026, 1, 1, tzinfo=UTC))
    job = RangeJob(spec, "broker:9092", {}, "avro", {}, "p", recording.ids, FailurePolicy.EXIT)
    executor = pickle.loads(pickle.dumps(job)).serializer()  # as a task receives it
    for schema, row in ((KEYED, ("7", "seven")), (UNKEYED, ("a line",))):
        key = ("7",) if schema.is_keyed else None
        event = ChangeEvent(Op.READ, schema, key, row, (), spec.lsn, 0, 0, spec.snapshot_time)
        assert executor(event) == driver(event)
    assert len(registry.calls) == 3, "the executor's serializer made no registry call"


def test_a_schema_the_driver_did_not_register_fails_the_task_with_the_fix() -> None:
    with pytest.raises(RegistryUnavailable, match=r"subject p\.x-value: .* run the worker again"):
        KnownSchemaIds({}).register_schema("p.x-value", Schema('"string"', "AVRO"))


def test_the_fake_failure_strikes_its_table_on_the_first_attempt_or_on_every_one_or_hangs() -> None:
    chunk = Chunk(catalog(KEYED))
    once = FakeFailure.parse("public.orders")
    always = FakeFailure.parse("public.orders:always")
    assert FakeFailure.parse("") is None and FakeFailure.parse(None) is None
    assert once is not None and always is not None
    assert once.strikes(chunk, 0) and not once.strikes(chunk, 1)
    assert always.strikes(chunk, 0) and always.strikes(chunk, 3)
    hang = FakeFailure.parse("public.orders:hang")
    assert hang is not None and hang.when == "hang" and hang.strikes(chunk, 2)
    assert not FakeFailure("public.other").strikes(chunk, 0)


def test_the_keys_no_range_published_again_are_the_gone_ones_and_a_skipped_row_keeps_them_all() -> None:
    known = {1: {b"a", b"b", b"c", b"d"}, 2: {b"x", b"y"}, 3: {b"q"}}
    first, second, other = SeenKeys(known[1]), SeenKeys(known[1]), SeenKeys(known[2])
    for key in (b"a", b"new"):
        first.discard(key)
    second.discard(b"c")
    other.discard(b"x")
    other.clear()  # a row of table 2 could not be encoded: its key is unknown
    # As the tallies come back from the executors: pickled, without the broadcast keys.
    returned = [pickle.loads(pickle.dumps(t)) for t in (first, second, other)]
    assert all(t.known == frozenset() for t in returned)
    assert returned[0].seen == {b"a"}, "a key the topic did not hold is not tallied"
    tallies = [(1, returned[0]), (1, returned[1]), (2, returned[2])]
    # Table 3's only range published none of its keys (its rows are all gone).
    assert gone_keys(known, tallies) == {1: {b"b", b"d"}, 3: {b"q"}}
    assert gone_keys(known, [(1, SeenKeys(known[1]))])[1] == known[1]
