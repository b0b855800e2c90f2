"""The worker's start-up: which codec and producer run, and every check before anything changes.

Each check says what to change in one line; all problems are reported together (`StartupCheckFailed`),
so that one start shows everything wrong with the configuration, the server, the tables, Kafka, the
registry and the spool directory, and nothing (slot, publication, topic) has been created yet.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import psycopg2.extensions
from confluent_kafka.schema_registry import SchemaRegistryClient

from cdc_worker.config import WorkerConfig
from cdc_worker.core.encoding.native import NATIVE_AVAILABLE, codec_description
from cdc_worker.core.kafka_transactions import Delivery
from cdc_worker.options import OutputFormat
from cdc_worker.shell.kafka_publisher import KafkaPublisher, KafkaUnavailable, TopicSpec
from cdc_worker.shell.kafka_settings import producer_settings
from cdc_worker.shell.kafka_transactions import KafkaTransactions
from cdc_worker.shell.metrics import WorkerMetrics
from cdc_worker.shell.postgres import catalog as postgres
from cdc_worker.shell.postgres import ddl_trigger, failover, partitions, slot, standby, subsets
from cdc_worker.shell.postgres.catalog import CatalogTable, StartupCheckFailed
from cdc_worker.shell.postgres.features import ServerFeatures, server_features
from cdc_worker.shell.postgres.partitions import PartitionMode
from cdc_worker.shell.postgres.slot import wait_for_slot_release
from cdc_worker.shell.stream.early_streams import PooledProducer, start_pool
from cdc_worker.shell.stream.spooling import check_spool_dir
from kafka_contract.redaction import redact_url
from kafka_contract.topics import NamingError, control_topic_name, topic_name, transactional_id

log = logging.getLogger(__name__)

REGISTRY_TIMEOUT_S = 10.0
# A reachable cluster answers a metadata request in milliseconds, TLS and SASL included.
KAFKA_CHECK_TIMEOUT_S = 5.0


def choose_codec(config: WorkerConfig) -> bool:
    """Whether rows go through the native codec; says which codec runs in one line."""
    codec = config.codec
    if codec == "python":
        log.info("row codec: python (--codec python)")
        return False
    if not NATIVE_AVAILABLE:
        if codec == "native":
            raise StartupCheckFailed(
                [
                    f"--codec native, but {codec_description()}: install the Rust toolchain (rustup) "
                    "and reinstall (pip install -e .), or use --codec auto"
                ]
            )
        log.warning("row codec: %s; rows are encoded in Python, several times slower", codec_description())
        return False
    log.info("row codec: %s", codec_description())
    return True


def open_publisher(publisher: KafkaPublisher, config: WorkerConfig, *, native_codec: bool) -> bool:
    """Build the Kafka clients; whether the native codec's rows go through the native producer,
    said in one start-up line."""
    wanted = native_codec and config.producer != "confluent"
    publisher.open(native_producer=wanted)
    native = publisher.native is not None
    if not native_codec or config.producer == "confluent":
        log.info(
            "producer: confluent-kafka (%s)",
            "--producer confluent" if native_codec else "python codec",
        )
    elif native:
        log.info("%s", publisher.producer_line)
    elif config.producer == "native":
        raise StartupCheckFailed(
            [f"--producer native, but {publisher.producer_line}: use --producer auto or confluent"]
        )
    else:
        log.warning("%s", publisher.producer_line)
    return native


def check_registry(config: WorkerConfig) -> list[str]:
    if config.output_format is not OutputFormat.AVRO:
        return []
    try:
        SchemaRegistryClient({"url": config.schema_registry, "timeout": REGISTRY_TIMEOUT_S}).get_subjects()
    except Exception as exc:  # httpx, SchemaRegistryError: any failure means "not usable"
        return [
            f"cannot reach the schema registry at {redact_url(config.schema_registry)} "
            f"({type(exc).__name__}: {exc}): check -r/--schema-registry, or use -f json"
        ]
    return []


def topic_specs(config: WorkerConfig, tables: list[CatalogTable]) -> list[TopicSpec]:
    specs = [TopicSpec(topic_name(t.schema, config.topic_prefix), t.schema.is_keyed) for t in tables]
    specs.append(TopicSpec(control_topic_name(config.topic_prefix), True))
    return specs


def _leaves_named(
    conn: psycopg2.extensions.connection, config: WorkerConfig, tables: list[CatalogTable]
) -> list[str]:
    """With `--partitions root`, a glob of --tables that names leaf partitions whose root is not
    selected: said in one line each, as such a leaf is not captured on its own."""
    if config.partitions is not PartitionMode.ROOT or not config.tables:
        return []
    selected = {t.schema.oid for t in tables}
    leaf_mode = postgres.load_tables(
        conn, config.tables, config.exclude_tables, partitions=PartitionMode.LEAF
    )
    named = [t for t in leaf_mode if t.is_partition]
    roots = partitions.roots_of(conn, [t.schema.oid for t in named])
    return [
        f"--tables matches partition {t.qualified_name}, which --partitions root captures under its root "
        "only: select its root, or pass --partitions leaf"
        for t in named
        if roots.get(t.schema.oid) not in selected
    ]


@dataclass
class Startup:
    """What the checks found, for the phases that follow."""

    facts: postgres.ServerFacts
    tables: list[CatalogTable]
    plan: slot.PublicationPlan
    existing: slot.SlotInfo | None
    resume: bool
    features: ServerFeatures

    @property
    def on_standby(self) -> bool:
        """Capturing from a hot standby (16+), where nothing can be written: shell/postgres/standby.py."""
        return standby.is_capturing_standby(self.facts)


def check_startup(
    conn: psycopg2.extensions.connection, config: WorkerConfig, publisher: KafkaPublisher
) -> Startup:
    """Every start-up check, all problems at once (`StartupCheckFailed`), and what they found."""
    facts = postgres.server_facts(conn)
    existing = slot.slot_info(conn, config.slot)
    if existing is not None and existing.active_pid is not None:
        existing = wait_for_slot_release(conn, config.slot)
    state = slot.snapshot_state(conn, config.publication_name, config.slot)
    # On a standby the slot gets its name only once its snapshot is complete (standby.py).
    on_standby = standby.is_capturing_standby(facts)
    resume = existing is not None and (on_standby or state != slot.SNAPSHOT_PENDING)
    problems = postgres.check_server(
        facts, creating_slot=not resume, replacing_slot=existing is not None and not resume
    )
    problems += standby.check_standby(facts)
    if existing is not None:
        problems += slot.check_slot_usable(existing, facts.database)
    else:
        lost = failover.missing_slot_problem(config.slot, state, slot.SNAPSHOT_DONE)
        problems += [lost] if lost else []
    features = server_features(
        conn,
        facts,
        no_generated_columns=config.no_generated_columns,
        failover_setting=config.failover_slot,
        creating_slot=not resume,
    )
    problems += features.problems
    tables = postgres.load_tables(
        conn,
        config.tables,
        config.exclude_tables,
        generated=features.generated_columns,
        partitions=config.partitions,
    )
    for line in _leaves_named(conn, config, tables):
        log.warning("%s", line)
    problems += postgres.check_tables(
        tables,
        allow_unkeyed=config.allow_unkeyed,
        role=facts.role,
        filters_given=bool(config.tables or config.exclude_tables),
    )
    resumed_publications = [
        n for n in (config.publication_name,) if resume and slot.publication_state(conn, n).exists
    ]
    tables, selection_problems = subsets.apply(
        conn,
        tables,
        subsets.Selection(config.columns, config.exclude_columns, config.row_filter),
        server_version_num=facts.server_version_num,
        on_standby=on_standby,
        held_by=resumed_publications + [n + slot.INSERTS_SUFFIX for n in resumed_publications],
        slot=config.slot,
    )
    problems += selection_problems
    via_root = config.partitions is PartitionMode.ROOT
    plan = slot.plan_publications(
        conn, config.publication_name, tables, generated_columns=features.generated_columns, via_root=via_root
    )
    if resume and plan.main.exists:
        switch = partitions.switch_problem(
            slot=config.slot,
            publication=plan.main.name,
            recorded_via_root=plan.main.via_root,
            mode=config.partitions,
            partitioned=any(t.partitioned or t.is_partition for t in tables),
        )
        problems += [switch] if switch else []
    if on_standby:
        problems += standby.publication_problems(conn, plan)
    else:
        problems += slot.check_publications(
            plan, role=facts.role, database=facts.database, can_create=facts.can_create_publication
        )
    try:
        topic_specs(config, tables)
    except NamingError as exc:  # a table whose topic name Kafka would refuse
        problems.append(str(exc))
    try:
        publisher.existing_topics(timeout=KAFKA_CHECK_TIMEOUT_S)
    except KafkaUnavailable as exc:
        problems.append(str(exc))
    problems += check_registry(config)
    problems += check_spool_dir(
        stream_in_progress=not config.no_stream_in_progress, directory=config.spool_dir
    )
    if config.capture_ddl and on_standby and not ddl_trigger.is_installed(conn):
        problems.append(
            "--capture-ddl: the DDL event trigger is not installed, and a standby cannot install it: run "
            "`bottledwater -d <DSN of the primary, as a superuser> ddl install` once"
        )
    elif config.capture_ddl:
        problems += ddl_trigger.check_capture(conn, facts.server_version_num)
    if problems:
        raise StartupCheckFailed(problems)
    for line in features.lines():
        log.info("%s", line)
    for warning in features.warnings:
        log.warning("%s", warning)
    return Startup(facts, tables, plan, existing, resume, features)


def serve_metrics(metrics: WorkerMetrics, port: int) -> int:
    """The metrics endpoint served on `port`; the port it took (0 picks one)."""
    try:
        served = metrics.serve(port)
    except OSError as exc:
        raise StartupCheckFailed(
            [f"cannot serve metrics on port {port} ({exc}): pass another --metrics-port"]
        ) from exc
    log.info("metrics on port %d", served)
    return served


def open_streamed_producers(publisher: KafkaPublisher, config: WorkerConfig) -> list[PooledProducer]:
    """Under exactly-once with the native producer and in-progress streaming: the producers that
    produce large transactions while they run (`early_streams`), their ids fenced now."""
    if (
        config.delivery != Delivery.EXACTLY_ONCE
        or config.no_stream_in_progress
        or publisher.native is None
        or not config.streamed_producers
    ):
        return []
    settings = producer_settings(publisher.broker, publisher.kafka_config, publisher.client_id)
    tid = transactional_id(config.slot, config.topic_prefix)
    return start_pool(settings, tid, control_topic_name(config.topic_prefix), config.streamed_producers)


def open_transactions(publisher: KafkaPublisher, config: WorkerConfig) -> KafkaTransactions | None:
    """Under `--delivery exactly-once`, the stream's transactions started: that fences any worker
    still streaming the slot (its next commit fails) and aborts what a killed one left open. Kafka
    unreachable, or refusing transactions, is one line."""
    if config.delivery != Delivery.EXACTLY_ONCE:
        return None
    publisher.existing_topics(timeout=KAFKA_CHECK_TIMEOUT_S)  # reachable, in one line if not
    return publisher.open_transactions(
        transactional_id(config.slot, config.topic_prefix), control_topic_name(config.topic_prefix)
    )
