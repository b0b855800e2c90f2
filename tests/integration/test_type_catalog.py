"""Type catalog against a real Postgres and the real schema registry.

Each family's table is created and filled in a fresh database, and its rows are read back the way
the worker receives them: through a `pgoutput` slot (the SQL decoding functions run the same output
functions as a walsender, under this session's settings, which are the worker's), decoded by
`PgOutputDecoder` and `ChangeAssembler` into `ChangeEvent`s. (`SELECT col::text` would not do: the
casts to text of bool, bpchar, inet and cidr differ from their output functions.) Each event is
encoded with both serializers and every value compared with what Postgres computes for it (see
`type_catalog`). Avro schemas are registered with the stack's registry, and messages are decoded
with the schema their framing names.
"""

from __future__ import annotations

import io
import json
import math
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from decimal import Decimal
from typing import Any

import fastavro
import psycopg2
import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from psycopg2 import sql

from cdc_worker.core.changes.assembler import ChangeAssembler
from cdc_worker.core.encoding.avro_serializer import AvroEventSerializer
from cdc_worker.core.encoding.json_serializer import JsonEventSerializer
from cdc_worker.core.encoding.serializers import EncodedMessage
from cdc_worker.core.model import ChangeEvent, TypeInfo
from cdc_worker.core.pgoutput.decoder import PgOutputDecoder
from cdc_worker.core.pgtypes.mapping import UnrepresentableValue, resolve_type
from cdc_worker.core.pgtypes.oids import PgArrayType, PgType
from kafka_contract.topics import safe_name, topic_name
from tests.integration.conftest import unique_name
from tests.integration.type_catalog import CATALOG, SETUP, UNREPRESENTABLE_ARRAYS, CatalogTable, col

pytestmark = pytest.mark.integration

# The worker's session settings, under which pgoutput's output functions write the text.
WORKER_SESSION = {
    "TimeZone": "UTC",
    "DateStyle": "ISO",
    "IntervalStyle": "postgres",
    "bytea_output": "hex",
    "lc_monetary": "C",
    "extra_float_digits": "3",
}
# The oracle writes intervals the ISO-8601 way, which is what the JSON contract promises.
ORACLE_SESSION = {**WORKER_SESSION, "IntervalStyle": "iso_8601"}
FIRST_USER_OID = 16384  # FirstNormalObjectId: every type below it is builtin
TEMPORAL_LOGICAL_TYPES = ("date", "time-micros", "timestamp-micros", "local-timestamp-micros")
PUBLICATION = "bw_catalog"

EXPECTED_TRANSFORMS: dict[str, Callable[[Any], Any]] = {
    "": lambda value: value,
    "bytes": lambda value: None if value is None else bytes(value),
    "uuid": lambda value: None if value is None else uuid.UUID(value),
    "int": lambda value: None if value is None else int(value),
}


def connect(dsn: str, settings: dict[str, str]) -> Any:
    options = " ".join(f"-c {name}={value}" for name, value in settings.items())
    conn = psycopg2.connect(dsn, options=options)
    conn.autocommit = True
    return conn


def normalize(value: Any) -> Any:
    """Make equal values compare equal: NaN by spelling, Decimal with its exponent, containers deeply."""
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, memoryview):
        return bytes(value)
    if isinstance(value, list):
        return [normalize(item) for item in value]
    if isinstance(value, dict):
        return {key: normalize(item) for key, item in value.items()}
    return value


def qualified(table: CatalogTable) -> sql.Composed:
    return sql.SQL("{}.{}").format(sql.Identifier(table.schema), sql.Identifier(table.name))


def create(conn: Any, table: CatalogTable) -> None:
    columns = [sql.SQL("id int PRIMARY KEY")]
    columns += [sql.SQL("{} {}").format(sql.Identifier(c.name), sql.SQL(c.sql_type)) for c in table.columns]
    with conn.cursor() as cur:
        cur.execute(sql.SQL("CREATE TABLE {} ({})").format(qualified(table), sql.SQL(", ").join(columns)))


def insert(conn: Any, table: CatalogTable) -> None:
    rows = [
        sql.SQL("({})").format(
            sql.SQL(", ").join([sql.Literal(row + 1), *(sql.SQL(c.values[row]) for c in table.columns)])
        )
        for row in range(table.rows)
    ]
    with conn.cursor() as cur:
        cur.execute(sql.SQL("INSERT INTO {} VALUES {}").format(qualified(table), sql.SQL(", ").join(rows)))


def pgoutput_events(conn: Any, slot: str, *, consume: bool = True) -> list[ChangeEvent]:
    """The slot's pending changes, decoded as the worker decodes them (protocol 1, text values)."""
    function = "pg_logical_slot_get_binary_changes" if consume else "pg_logical_slot_peek_binary_changes"
    query = sql.SQL("SELECT data FROM {}(%s, NULL, NULL, 'proto_version', '1', 'publication_names', %s)")
    with conn.cursor() as cur:
        cur.execute(query.format(sql.Identifier(function)), (slot, PUBLICATION))
        messages = [bytes(data) for (data,) in cur.fetchall()]
    decoder, assembler = PgOutputDecoder(1), ChangeAssembler()
    return [e for m in messages for e in assembler.feed(decoder.decode(m)) if isinstance(e, ChangeEvent)]


@contextmanager
def catalog_slot(dsn: str, tables: tuple[CatalogTable, ...]) -> Iterator[tuple[Any, str]]:
    """A database holding `tables` and a pgoutput slot that saw their rows inserted; dropped after."""
    conn = connect(dsn, WORKER_SESSION)
    slot = unique_name("catalog_slot")
    with conn.cursor() as cur:
        for statement in SETUP:
            cur.execute(statement)
        for table in tables:
            create(conn, table)
        cur.execute(sql.SQL("CREATE PUBLICATION {} FOR ALL TABLES").format(sql.Identifier(PUBLICATION)))
        cur.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    try:
        for table in tables:
            insert(conn, table)
        yield conn, slot
    finally:
        with conn.cursor() as cur:
            cur.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
        conn.close()


def load_type_infos(conn: Any) -> dict[int, TypeInfo]:
    """Every non-builtin type, as the shell loads them from pg_type (arrays: typcategory 'A')."""
    with conn.cursor() as cur:
        cur.execute(
            "SELECT t.oid, n.nspname, t.typname, t.typtype, "
            "CASE WHEN t.typcategory = 'A' THEN t.typelem ELSE 0 END, t.typbasetype, t.typtypmod "
            "FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace WHERE t.oid >= %s",
            (FIRST_USER_OID,),
        )
        return {
            int(oid): TypeInfo(int(oid), namespace, name, kind, int(element), int(base), base_typmod)
            for oid, namespace, name, kind, element, base, base_typmod in cur
        }


def select_by_id(conn: Any, table: CatalogTable, expressions: list[str]) -> dict[str, tuple[Any, ...]]:
    """Each row's `expressions` ({c}: the column), keyed by the id's text."""
    columns = [
        sql.SQL(e).format(c=sql.Identifier(c.name)) for e, c in zip(expressions, table.columns, strict=True)
    ]
    query = sql.SQL("SELECT id::text, {} FROM {}").format(sql.SQL(", ").join(columns), qualified(table))
    with conn.cursor() as cur:
        cur.execute(query)
        return {row[0]: row for row in cur.fetchall()}


def without_temporal_logical_types(schema: Any) -> Any:
    """The same schema with dates and times left as their raw int/long (sentinels, BC dates)."""
    if isinstance(schema, list):
        return [without_temporal_logical_types(branch) for branch in schema]
    if not isinstance(schema, dict):
        return schema
    bare = {k: without_temporal_logical_types(v) for k, v in schema.items()}
    if bare.get("logicalType") in TEMPORAL_LOGICAL_TYPES:
        del bare["logicalType"]
    return bare


def decode_avro(client: SchemaRegistryClient, framed: bytes, raw_fields: set[str]) -> dict[str, Any]:
    """The record under the schema the framing names; `raw_fields` are read without temporal logical types."""
    assert framed[0] == 0
    schema = json.loads(client.get_schema(int.from_bytes(framed[1:5], "big")).schema_str)
    for field in schema["fields"]:
        if field["name"] in raw_fields:
            field["type"] = without_temporal_logical_types(field["type"])
    record: dict[str, Any] = fastavro.schemaless_reader(io.BytesIO(framed[5:]), fastavro.parse_schema(schema))
    return record


@pytest.fixture
def registry(registry_url: str) -> Iterator[tuple[SchemaRegistryClient, str]]:
    """The stack's registry and a random topic prefix; the prefix's subjects are deleted afterwards."""
    client = SchemaRegistryClient({"url": registry_url})
    prefix = unique_name("catalog")
    yield client, prefix
    for subject in client.get_subjects():
        if subject.startswith(prefix):
            client.delete_subject(subject)
            client.delete_subject(subject, permanent=True)


@pytest.mark.parametrize("table", CATALOG, ids=[t.name[:20] for t in CATALOG])
def test_type_family(table: CatalogTable, fresh_db: str, registry: tuple[SchemaRegistryClient, str]) -> None:
    client, prefix = registry
    with catalog_slot(fresh_db, (table,)) as (worker, slot):
        events = pgoutput_events(worker, slot)
        infos = load_type_infos(worker)
        oracle = connect(fresh_db, ORACLE_SESSION)
        expected_avro = select_by_id(oracle, table, [c.avro for c in table.columns])
        expected_json = select_by_id(oracle, table, [c.json for c in table.columns])
        oracle.close()
    assert len(events) == table.rows
    avro = AvroEventSerializer(client, infos, topic_prefix=prefix)
    json_serializer = JsonEventSerializer(infos, topic_prefix=prefix)
    for event in events:
        texts = event.row or ()
        avro_message, json_message = avro(event), json_serializer(event)
        assert isinstance(avro_message, EncodedMessage) and isinstance(json_message, EncodedMessage)
        assert avro_message.topic == json_message.topic == topic_name(event.table, prefix)
        raw_fields = {safe_name(c.name) for c in table.columns if not c.logical}
        record = decode_avro(client, avro_message.value or b"", raw_fields)
        json_record = json.loads(json_message.value or b"")
        assert list(record) == ["id", *(safe_name(c.name) for c in table.columns)]
        assert list(json_record) == ["id", *(c.name for c in table.columns)]
        avro_row, json_row = expected_avro[str(texts[0])], expected_json[str(texts[0])]
        for index, column in enumerate(table.columns, start=1):
            where = f"{table.name}.{column.name} id={texts[0]} text={texts[index]!r}"
            actual = record[safe_name(column.name)]
            expected = EXPECTED_TRANSFORMS[column.transform](avro_row[index])
            assert normalize(actual) == normalize(expected), f"Avro {where}"
            assert normalize(json_record[column.name]) == normalize(json_row[index]), f"JSON {where}"


@pytest.mark.parametrize(
    "zone", ["Asia/Kathmandu", "America/St_Johns", "Europe/Amsterdam", "Pacific/Chatham"]
)
def test_timestamptz_in_any_session_zone_is_the_same_instant(zone: str, fresh_db: str) -> None:
    """pgoutput writes timestamptz in the session's zone; every zone must give the same UTC value."""
    (temporal,) = [t for t in CATALOG if t.name == "temporal"]
    with catalog_slot(fresh_db, (temporal,)) as (worker, slot):
        zoned = connect(fresh_db, {**WORKER_SESSION, "TimeZone": zone})
        zoned_events = pgoutput_events(zoned, slot, consume=False)
        zoned.close()
        utc_events = pgoutput_events(worker, slot)
    tz_index = [c.name for c in utc_events[0].table.columns].index("tz")
    pairs = [
        ((u.row or ())[tz_index], (z.row or ())[tz_index])
        for u, z in zip(utc_events, zoned_events, strict=True)
    ]
    assert any(utc_text != zoned_text for utc_text, zoned_text in pairs)  # offsets were exercised
    column = resolve_type(PgType.TIMESTAMPTZ, -1, {})
    for utc_text, zoned_text in pairs:
        assert isinstance(utc_text, str) and isinstance(zoned_text, str)
        assert column.avro_value(zoned_text) == column.avro_value(utc_text), zoned_text
        assert column.json_text(zoned_text) == column.json_text(utc_text), zoned_text


def test_unrepresentable_values_are_data_errors(
    fresh_db: str, registry: tuple[SchemaRegistryClient, str]
) -> None:
    odd = CatalogTable("odd", (
        col("a", "int4[]", *UNREPRESENTABLE_ARRAYS, "'{1}'"),
        col("n", "numeric(10,2)", "1", "1", "'NaN'"),
    ))  # fmt: skip
    with catalog_slot(fresh_db, (odd,)) as (worker, slot):
        events = pgoutput_events(worker, slot)
    avro = AvroEventSerializer(registry[0], {}, topic_prefix=registry[1])
    for event in events[: len(UNREPRESENTABLE_ARRAYS)]:
        for serialize in (avro, JsonEventSerializer({})):
            with pytest.raises(UnrepresentableValue, match=r"public\.odd, column a \(int4\[\]\)"):
                serialize(event)
    with pytest.raises(UnrepresentableValue, match=r"column n \(numeric\(10,2\)\).*NaN"):
        avro(events[-1])


def test_builtin_oids_match_the_catalog(pg_dsn: str) -> None:
    conn = connect(pg_dsn, WORKER_SESSION)
    with conn.cursor() as cur:
        cur.execute(
            "SELECT oid, typname, typarray FROM pg_type WHERE oid = ANY(%s)", ([int(t) for t in PgType],)
        )
        catalog = {PgType(oid): (typname, typarray) for oid, typname, typarray in cur.fetchall()}
    conn.close()
    assert catalog == {t: (t.name.lower(), PgArrayType[t.name].value) for t in PgType}


def test_add_column_is_backward_compatible_in_the_registry(
    fresh_db: str, registry: tuple[SchemaRegistryClient, str]
) -> None:
    client, prefix = registry
    avro = AvroEventSerializer(client, {}, topic_prefix=prefix)
    with catalog_slot(fresh_db, (CatalogTable("evolving", (col("name", "text", "'before'"),)),)) as (
        conn,
        slot,
    ):
        (old_event,) = pgoutput_events(conn, slot)
        old_message = avro(old_event)
        assert old_message is not None and old_message.value is not None and old_message.key is not None
        subject = f"{topic_name(old_event.table, prefix)}-value"
        client.set_compatibility(subject, "BACKWARD")
        with conn.cursor() as cur:
            cur.execute("ALTER TABLE evolving ADD COLUMN amount numeric(8,3), ADD COLUMN tags text[]")
            cur.execute("INSERT INTO evolving VALUES (2, 'after', 1.5, '{a,NULL}')")
        (new_event,) = pgoutput_events(conn, slot)
    new_message = avro(new_event)  # registers version 2, which the registry checks under BACKWARD
    assert new_message is not None and new_message.value is not None and new_message.key is not None
    new_schema = client.get_schema(int.from_bytes(new_message.value[1:5], "big"))
    assert client.get_latest_version(subject).version == 2
    assert client.test_compatibility(subject, new_schema, version=1)
    # The check can fail: changing a column's type incompatibly is refused by the same endpoint.
    broken = json.loads(new_schema.schema_str)
    broken["fields"][1]["type"] = ["null", "long"]
    assert not client.test_compatibility(subject, Schema(json.dumps(broken), "AVRO"), version=1)
    # A reader with the new schema reads the old message: the added columns are null.
    old_schema = client.get_schema(int.from_bytes(old_message.value[1:5], "big"))
    record = fastavro.schemaless_reader(
        io.BytesIO(old_message.value[5:]),
        fastavro.parse_schema(json.loads(old_schema.schema_str)),
        fastavro.parse_schema(json.loads(new_schema.schema_str)),
    )
    assert record == {"id": 1, "name": "before", "amount": None, "tags": None}
    assert old_message.key[:5] == new_message.key[:5]  # the key schema did not change: same id
