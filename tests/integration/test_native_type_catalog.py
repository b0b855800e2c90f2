"""The native codec against the Python reference on every type family of the catalog, with bytes
Postgres itself wrote: each family's rows as its COPY TEXT output (the snapshot's input) and as the
pgoutput messages of their inserts (the stream's input), encoded both ways with the stack's real
registry, compared byte for byte. Postgres's own output is canonical, so the native side declines
none of it."""

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
from tests.integration.conftest import unique_name
from tests.integration.test_type_catalog import PUBLICATION, catalog_slot, load_type_infos, qualified
from tests.integration.type_catalog import CATALOG, CatalogTable

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
