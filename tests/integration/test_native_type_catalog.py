"""The native codec against the Python reference on every type family of the catalog, with bytes
Postgres itself wrote: each family's rows as its COPY TEXT output (the snapshot's input) and as the
pgoutput messages of their inserts (the stream's input), encoded both ways with the stack's real
registry, compared byte for byte. Postgres's own output is canonical, so the native side declines
none of it. The snapshot's rows are also published through the native producer and through
confluent-kafka, and what Kafka holds is compared message by message."""

from __future__ import annotations

import io
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from psycopg2 import sql

from cdc_worker.core.changes.assembler import ChangeAssembler
from cdc_worker.core.changes.native_changes import NativeChangePath
from cdc_worker.core.encoding import native
from cdc_worker.core.encoding.avro_serializer import AvroEventSerializer
from cdc_worker.core.encoding.json_serializer import JsonEventSerializer
from cdc_worker.core.model import ChangeEvent, Op, TableSchema, TypeInfo
from cdc_worker.core.pgoutput.decoder import PgOutputDecoder
from cdc_worker.core.pgtypes.copy_text import parse_copy_text_line
from cdc_worker.shell.kafka_publisher import KafkaPublisher, TopicSpec
from cdc_worker.shell.postgres.catalog import load_tables
from cdc_worker.shell.snapshot.chunks import Chunk, ChunkReader, SnapshotSpec
from tests.integration.conftest import unique_name
from tests.integration.test_type_catalog import PUBLICATION, catalog_slot, load_type_infos, qualified
from tests.integration.type_catalog import CATALOG, CatalogTable
from tests.integration.worker_harness import Record, TopicReader, delete_topics_with_prefix

pytestmark = pytest.mark.integration

Serializer = AvroEventSerializer | JsonEventSerializer
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@pytest.fixture
def registry(registry_url: str) -> Iterator[tuple[SchemaRegistryClient, str]]:
    """The stack's registry and a random topic prefix; the prefix's subjects are deleted afterwards."""
    client = SchemaRegistryClient({"url": registry_url})
    prefix = unique_name("native")
    yield client, prefix
    for subject in client.get_subjects():
        if subject.startswith(prefix):
            client.delete_subject(subject)
            client.delete_subject(subject, permanent=True)


def serializer_pairs(
    client: SchemaRegistryClient, prefix: str, infos: dict[int, TypeInfo]
) -> dict[str, tuple[Serializer, Serializer]]:
    """Per format, two independent serializers: the reference's, and the one the native plans use."""
    return {
        "avro": (
            AvroEventSerializer(client, infos, topic_prefix=prefix),
            AvroEventSerializer(client, infos, topic_prefix=prefix),
        ),
        "json": (
            JsonEventSerializer(infos, topic_prefix=prefix),
            JsonEventSerializer(infos, topic_prefix=prefix),
        ),
    }


def slot_payloads(conn: object, slot: str) -> list[bytes]:
    query = sql.SQL(
        "SELECT data FROM pg_logical_slot_get_binary_changes(%s, NULL, NULL, 'proto_version', '1', "
        "'publication_names', %s)"
    )
    with conn.cursor() as cur:  # type: ignore[attr-defined]
        cur.execute(query, (slot, PUBLICATION))
        return [bytes(data) for (data,) in cur.fetchall()]


def copy_output(conn: object, table: CatalogTable) -> bytes:
    out = io.BytesIO()
    with conn.cursor() as cur:  # type: ignore[attr-defined]
        cur.copy_expert(sql.SQL("COPY {} TO STDOUT").format(qualified(table)), out)
    return out.getvalue()


@pytest.mark.skipif(not native.NATIVE_AVAILABLE, reason=native.codec_description())
@pytest.mark.parametrize("table", CATALOG, ids=[t.name[:20] for t in CATALOG])
def test_native_codec_writes_the_references_bytes_for_postgres_own_output(
    table: CatalogTable, fresh_db: str, registry: tuple[SchemaRegistryClient, str]
) -> None:
    with catalog_slot(fresh_db, (table,)) as (conn, slot):
        payloads = slot_payloads(conn, slot)
        copied = copy_output(conn, table)
        infos = load_type_infos(conn)
    for kind, (reference, native_side) in serializer_pairs(*registry, infos).items():
        # The stream: the general path against the native path, message by message.
        decoder, assembler = PgOutputDecoder(1), ChangeAssembler()
        native_decoder, native_assembler = PgOutputDecoder(1), ChangeAssembler()
        path = NativeChangePath(native_decoder, native_assembler, native_side)
        schema: TableSchema | None = None
        taken = 0
        for payload in payloads:
            expected = [
                reference(e) for e in assembler.feed(decoder.decode(payload)) if isinstance(e, ChangeEvent)
            ]
            got = path(payload)
            if got is None:
                list(native_assembler.feed(native_decoder.decode(payload)))
                assert expected == [], f"{kind}: a row change the native path declined"
                continue
            items, schema = got
            taken += 1
            assert [m for m, _ in items] == expected, f"{kind} stream {table.name}"
        assert taken == table.rows and schema is not None
        # The snapshot: COPY TEXT output, the reference's per-row loop against one native call.
        plan = native.native_plan_for(native_side, schema)
        assert plan is not None, f"{table.name} has no native plan"
        rows = []
        for line in copied.splitlines():
            row = parse_copy_text_line(line)
            key = tuple(row[i] for i in schema.key_indexes)
            message = reference(ChangeEvent(Op.READ, schema, key, row, (), 1, 0, 0, EPOCH))
            assert message is not None
            rows.append((message.key, message.value))
        assert plan.encode_copy(copied) == rows, f"{kind} snapshot {table.name}"
        assert plan.declined == 0, f"{kind}: Postgres's own output of {table.name} was declined"


class RecordedEvents:
    """The snapshot's events, kept: what a chunk reader reports while it publishes."""

    def __init__(self) -> None:
        self.failures: list[tuple[str, str]] = []
        self.rows = 0

    def fail(self, reason: str, kind: str) -> None:
        self.failures.append((reason, kind))

    def advance(self, oid: int, rows: int) -> None:
        self.rows += rows

    def chunk_done(self, oid: int) -> None:
        pass

    def stopping(self) -> bool:
        return False


def snapshot_into_kafka(
    conn: object, bootstrap: str, serializer: Serializer, *, native_producer: bool
) -> dict[str, list[Record]]:
    """Every catalog table published by the snapshot's chunk reader (native codec), through the
    native producer or confluent-kafka, into 3-partition topics; returns what Kafka holds per table."""
    tables = load_tables(conn)  # type: ignore[arg-type]
    publisher = KafkaPublisher(bootstrap, topic_config={"partitions": "3"})
    publisher.open(native_producer=native_producer)
    assert (publisher.native is not None) == native_producer, publisher.producer_line
    topics = {t.qualified_name: serializer.topic_for(t.schema) for t in tables}
    publisher.ensure_topics(TopicSpec(topics[t.qualified_name], t.schema.is_keyed) for t in tables)
    spec = SnapshotSpec("", "", 0x16B3748, EPOCH, native_codec=True, native_producer=native_producer)
    events = RecordedEvents()
    reader = ChunkReader(spec, publisher, serializer, events)
    with conn.cursor() as cur:  # type: ignore[attr-defined]
        for table in tables:
            assert reader.native_plan(table.schema) is not None, table.qualified_name
            reader.read(cur, Chunk(table))
    assert publisher.flush(30) == 0
    assert events.failures == []
    reader_ = TopicReader(bootstrap)
    try:
        return {name: reader_.read(topic, min_messages=1) for name, topic in topics.items()}
    finally:
        reader_.close()


@pytest.mark.skipif(not native.NATIVE_AVAILABLE, reason=native.codec_description())
def test_native_producer_puts_in_kafka_what_confluent_kafka_puts(
    fresh_db: str, kafka_bootstrap: str, registry: tuple[SchemaRegistryClient, str]
) -> None:
    client, prefix = registry
    with catalog_slot(fresh_db, CATALOG) as (conn, _slot):
        infos = load_type_infos(conn)
        prefixes = []
        try:
            for kind in ("avro", "json"):
                published = {}
                for native_producer in (True, False):
                    topic_prefix = f"{prefix}_{kind}_{'native' if native_producer else 'confluent'}"
                    prefixes.append(topic_prefix)
                    serializer: Serializer = (
                        AvroEventSerializer(client, infos, topic_prefix=topic_prefix)
                        if kind == "avro"
                        else JsonEventSerializer(infos, topic_prefix=topic_prefix)
                    )
                    published[native_producer] = snapshot_into_kafka(
                        conn, kafka_bootstrap, serializer, native_producer=native_producer
                    )
                assert published[True].keys() == published[False].keys()
                for table, records in published[True].items():
                    theirs = published[False][table]
                    assert len(records) == len(theirs) > 0, f"{kind} {table}"
                    if records[0].key is None:
                        # No key: the partitioner picks a partition at random, so only the set of
                        # messages can be the same.
                        def content(r: Record) -> tuple[bytes | None, dict[str, str]]:
                            return r.value, r.headers

                        assert sorted(map(content, records), key=repr) == sorted(
                            map(content, theirs), key=repr
                        )
                    else:

                        def placed(r: Record) -> tuple[int, int, bytes | None, bytes | None, dict[str, str]]:
                            return r.partition, r.offset, r.key, r.value, r.headers

                        assert list(map(placed, records)) == list(map(placed, theirs)), f"{kind} {table}"
        finally:
            for topic_prefix in prefixes:
                delete_topics_with_prefix(kafka_bootstrap, topic_prefix)
