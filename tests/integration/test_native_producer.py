"""The native producer's failures surface exactly as confluent-kafka's: a snapshot's rows sent to a
topic that does not exist (the stack's broker does not create topics) and a row over `-C
message.max.bytes` are reported to the snapshot with the same reasons and kinds by both producers.
(That both put the same messages in Kafka is tested on the type catalog, test_native_type_catalog.)"""

from __future__ import annotations

import pytest

from cdc_worker.core.encoding import native
from cdc_worker.core.encoding.json_serializer import JsonEventSerializer
from cdc_worker.shell.kafka_publisher import KafkaPublisher
from cdc_worker.shell.postgres.catalog import connect, load_tables
from cdc_worker.shell.snapshot.chunks import Chunk, ChunkReader, SnapshotSpec
from tests.integration.conftest import unique_name
from tests.integration.test_native_type_catalog import EPOCH, RecordedEvents
from tests.integration.worker_harness import execute

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not native.NATIVE_AVAILABLE, reason=native.codec_description()),
]

ROWS = 5


def snapshot_failures(
    dsn: str, bootstrap: str, topic_prefix: str, kafka_config: dict[str, str], *, native_producer: bool
) -> list[tuple[str, str]]:
    """What the snapshot of table `t` reports while publishing into topics nobody created."""
    publisher = KafkaPublisher(bootstrap, {"message.timeout.ms": "5000", **kafka_config})
    publisher.open(native_producer=native_producer)
    assert (publisher.native is not None) == native_producer, publisher.producer_line
    events = RecordedEvents()
    spec = SnapshotSpec("", "", 0x2A000028, EPOCH, native_codec=True, native_producer=native_producer)
    conn = connect(dsn)
    try:
        (table,) = load_tables(conn, ["public.t"])
        reader = ChunkReader(spec, publisher, JsonEventSerializer({}, topic_prefix=topic_prefix), events)
        assert reader.native_plan(table.schema) is not None
        with conn.cursor() as cur:
            reader.read(cur, Chunk(table))
    finally:
        conn.close()
    assert publisher.flush(30) == 0
    assert events.rows == ROWS
    return sorted(events.failures)


@pytest.mark.parametrize(
    ("kafka_config", "expected"),
    [
        ({}, ROWS * [("not delivered to topic", "delivery")]),
        (
            {"message.max.bytes": "1500"},
            [("is over the producer's message.max.bytes (1500)", "message_too_large")],
        ),
    ],
    ids=["unknown-topic", "message-too-large"],
)
def test_native_producer_reports_failures_as_confluent_kafka_does(
    fresh_db: str, kafka_bootstrap: str, kafka_config: dict[str, str], expected: list[tuple[str, str]]
) -> None:
    execute(
        fresh_db,
        "CREATE TABLE t (id int PRIMARY KEY, body text)",
        # ROWS rows, one of them 2 kB
        "INSERT INTO t SELECT i, repeat('x', CASE WHEN i = 3 THEN 2000 ELSE 10 END) "
        "FROM generate_series(1, 5) i",
    )
    prefix = unique_name("absent")
    native_side = snapshot_failures(fresh_db, kafka_bootstrap, prefix, kafka_config, native_producer=True)
    confluent_side = snapshot_failures(fresh_db, kafka_bootstrap, prefix, kafka_config, native_producer=False)
    assert native_side == confluent_side
    # With the size limit, the other rows still meet the absent topic: only the size error counts.
    relevant = [f for f in native_side if f[1] == "message_too_large"] if kafka_config else native_side
    assert [(text in reason, kind) for (reason, kind), (text, _) in zip(relevant, expected, strict=True)] == [
        (True, kind) for _, kind in expected
    ]
