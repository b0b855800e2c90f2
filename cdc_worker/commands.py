"""The worker's maintenance subcommands: `slot status|drop`, `topics [delete]`, `rebuild` and
`resnapshot` (`cdc_worker.cli` parses them and calls these; `ddl_cli` holds `ddl`). Each returns the
process's exit code."""

from __future__ import annotations

import dataclasses
import logging
import sys
from collections.abc import Sequence
from datetime import UTC, datetime

import psycopg2
import psycopg2.extensions

from cdc_worker import ddl_cli
from cdc_worker.config import WorkerConfig
from cdc_worker.core.lsn import format_lsn
from cdc_worker.shell.kafka_settings import count_brokers
from cdc_worker.shell.kafka_topic_specs import replication_for
from cdc_worker.shell.kafka_topics import TopicDeletionFailed, delete_topics
from cdc_worker.shell.postgres import catalog as postgres
from cdc_worker.shell.postgres import ddl_trigger, failover, slot, slot_status, truncate_guard
from cdc_worker.shell.postgres.partitions import PartitionMode, roots_of
from cdc_worker.shell.stream.resnapshot_reader import request_resnapshot
from cdc_worker.worker import EXIT_OK, EXIT_RUNTIME_ERROR, EXIT_STARTUP_ERROR
from kafka_contract.topics import NamingError, control_topic_name, topic_name

log = logging.getLogger("cdc_worker")


def show_slot_status(config: WorkerConfig, standby_dsn: str | None = None) -> int:
    conn = postgres.connect(config.postgres)
    try:
        status = slot_status.read_status(conn, config.slot, config.publication_name)
    finally:
        conn.close()
    if status is not None and standby_dsn:
        standby = postgres.connect(standby_dsn)
        try:
            status = dataclasses.replace(status, on_standby=failover.standby_slot(standby, config.slot))
        finally:
            standby.close()
    if status is None:
        print(
            f"slot {config.slot}: does not exist (the worker creates it, with a snapshot, on its first start)"
        )
        return EXIT_RUNTIME_ERROR
    for line in slot_status.render(status, datetime.now(UTC)):
        print(line)
    return EXIT_OK


def slot_drop(config: WorkerConfig) -> int:
    conn = postgres.connect(config.postgres)
    try:
        dropped = slot.drop_slot(conn, config.slot)
        if slot.publication_state(conn, config.publication_name).exists:
            slot.record_snapshot_state(conn, config.publication_name, config.slot, None)
        if dropped:
            ddl_cli.after_slot_drop(conn)
            _remove_truncate_guards(conn)
    except slot.SlotError as exc:
        print(f"cannot drop: {exc}", file=sys.stderr)
        return EXIT_RUNTIME_ERROR
    finally:
        conn.close()
    if not dropped:
        print(f"slot {config.slot} does not exist; nothing dropped")
        return EXIT_OK
    print(f"dropped slot {config.slot}; the next start takes a new snapshot")
    print(
        f"publication {config.publication_name} is kept (it holds no WAL); DROP PUBLICATION "
        f"{config.publication_name} if no worker needs it"
    )
    return EXIT_OK


def _remove_truncate_guards(conn: psycopg2.extensions.connection) -> None:
    """The partitions' TRUNCATE guards go with the database's last slot: with no worker left to
    publish its deletes, a leaf's TRUNCATE need not cost a DELETE of its rows. While another slot
    remains they stay (which worker captures which root is not written in the database)."""
    remaining = ddl_trigger.other_slots(conn)
    if remaining:
        if truncate_guard.is_present(conn):
            print(f"the partitions' TRUNCATE guards are kept: {remaining} other slot(s) may need them")
        return
    try:
        removed = truncate_guard.uninstall(conn)
    except psycopg2.Error as exc:
        said = exc.diag.message_primary or str(exc).strip()
        function = truncate_guard.FUNCTION_NAME
        print(
            f"the partitions' TRUNCATE guards are left in place ({said}): as the owner of the "
            f"partitioned tables, run DROP FUNCTION <schema>.{function}() CASCADE in each schema"
        )
        return
    if removed:
        print("removed the partitions' TRUNCATE guards: no slot of this database is left")


def list_topics(config: WorkerConfig) -> int:
    conn = postgres.connect(config.postgres)
    try:
        tables = postgres.load_tables(
            conn, config.tables, config.exclude_tables, partitions=config.partitions
        )
    finally:
        conn.close()
    rows = [("table", "topic", "key", "captured")]
    for table in tables:
        try:
            topic = topic_name(table.schema, config.topic_prefix)
        except NamingError as exc:
            topic = f"(impossible: {exc})"
        key = ", ".join(table.schema.key_columns) or (
            "(none: null keys)" if config.allow_unkeyed else "(none: refused without -u)"
        )
        captured = "all changes" if table.has_replica_identity else "inserts and truncates only"
        rows.append((table.qualified_name, topic, key, captured))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False)) + "  " + row[-1])
    brokers = count_brokers(config.broker, config.kafka_config)
    replication = replication_for(brokers, config.topic_config).describe()
    cluster = f"{brokers} broker(s)" if brokers else f"{config.broker} did not answer"
    print(
        f"topics the worker creates: {replication} ({cluster}; "
        "-T replication.factor / min.insync.replicas to change)"
    )
    return EXIT_OK


def pipeline_topics(config: WorkerConfig) -> list[str]:
    """Every topic the worker writes for this configuration: one per selected table, and the control
    topic (TRUNCATE, DDL and re-snapshot events, read by the merge in LSN order with the rest)."""
    conn = postgres.connect(config.postgres)
    try:
        tables = postgres.load_tables(
            conn, config.tables, config.exclude_tables, partitions=config.partitions
        )
    finally:
        conn.close()
    topics = []
    for table in tables:
        try:
            topics.append(topic_name(table.schema, config.topic_prefix))
        except NamingError:
            continue  # a table the worker cannot name has no topic to delete
    return sorted(set(topics)) + [control_topic_name(config.topic_prefix)]


def _confirmed(config: WorkerConfig, confirm: str | None, what: str) -> bool:
    if confirm == config.slot:
        return True
    print(
        f"refusing to {what}: pass --confirm {config.slot} (the slot's name, typed out; got "
        f"{confirm or 'nothing'})",
        file=sys.stderr,
    )
    return False


def delete_pipeline_topics(config: WorkerConfig, confirm: str | None) -> int:
    if not _confirmed(config, confirm, "delete the topics"):
        return EXIT_STARTUP_ERROR
    topics = pipeline_topics(config)
    try:
        result = delete_topics(config.broker, config.kafka_config, topics)
    except TopicDeletionFailed as exc:
        print(f"cannot delete topics: {exc}", file=sys.stderr)
        return EXIT_RUNTIME_ERROR
    for topic in result.deleted:
        print(f"deleted topic {topic}")
    for topic in result.missing:
        print(f"topic {topic} did not exist")
    return EXIT_OK


def rebuild(config: WorkerConfig, confirm: str | None) -> int:
    """Step one of the rebuild after a lost slot (docs/orchestration.md, "Rebuilding after a lost
    slot"): the slot and the topics go, so that the next start snapshots into empty topics and the
    rows deleted while the slot was lost leave no stale copy in Kafka. The Delta tables are reset
    by the reset_delta job; the worker is started again by launching cdc_worker."""
    if not _confirmed(config, confirm, f"rebuild slot {config.slot}"):
        return EXIT_STARTUP_ERROR
    conn = postgres.connect(config.postgres)
    try:
        info = slot.slot_info(conn, config.slot)
        if info is not None and info.active_pid is not None:
            print(
                f"refusing to rebuild: slot {config.slot} is streaming to server process {info.active_pid}. "
                "Stop the worker first (terminate the cdc_worker run in Dagster, or stop the process)",
                file=sys.stderr,
            )
            return EXIT_STARTUP_ERROR
        database = postgres.server_facts(conn).database
        if info is not None and info.database != database:
            print(
                f"refusing to rebuild: slot {config.slot} belongs to database {info.database}; point "
                f"-d/--postgres at that database",
                file=sys.stderr,
            )
            return EXIT_STARTUP_ERROR
        if info is not None:
            slot.drop_slot(conn, config.slot)
            print(
                f"dropped slot {config.slot}{' (it had lost its WAL)' if info.wal_status == 'lost' else ''}"
            )
        else:
            print(f"slot {config.slot} did not exist")
        if slot.publication_state(conn, config.publication_name).exists:
            slot.record_snapshot_state(conn, config.publication_name, config.slot, None)
    except slot.SlotError as exc:
        print(f"cannot rebuild: {exc}", file=sys.stderr)
        return EXIT_RUNTIME_ERROR
    finally:
        conn.close()
    code = delete_pipeline_topics(config, confirm)
    if code != EXIT_OK:
        return code
    print(
        "next: reset the Delta tables (launch the reset_delta job in Dagster with confirm: "
        f"{config.slot}), then start the worker (launch cdc_worker): it takes a new snapshot"
    )
    return EXIT_OK


def _resnapshot_tables(
    conn: psycopg2.extensions.connection, config: WorkerConfig, patterns: Sequence[str]
) -> list[postgres.CatalogTable]:
    """The captured tables `patterns` name; with `--partitions root`, also the leaf partitions of
    captured roots (a partition attached with rows: its rows are read into its root's topic)."""
    selected = {
        t.schema.oid
        for t in postgres.load_tables(
            conn, config.tables, config.exclude_tables, partitions=config.partitions
        )
    }
    named = postgres.load_tables(conn, patterns, partitions=config.partitions)
    if config.partitions is PartitionMode.ROOT:
        leaves = [
            t for t in postgres.load_tables(conn, patterns, partitions=PartitionMode.LEAF) if t.is_partition
        ]
        roots = roots_of(conn, [t.schema.oid for t in leaves])
        named += [t for t in leaves if roots.get(t.schema.oid) in selected]
        selected |= {t.schema.oid for t in leaves if roots.get(t.schema.oid) in selected}
    return [t for t in named if t.schema.oid in selected]


def resnapshot(config: WorkerConfig, patterns: Sequence[str]) -> int:
    conn = postgres.connect(config.postgres)
    try:
        info = slot.slot_info(conn, config.slot)
        if info is None:
            print(
                f"slot {config.slot} does not exist: start the worker, its first snapshot covers every table",
                file=sys.stderr,
            )
            return EXIT_RUNTIME_ERROR
        if not postgres.server_facts(conn).decodes_logical_messages:
            print(f"cannot re-snapshot: {postgres.RESNAPSHOT_NEEDS}", file=sys.stderr)
            return EXIT_STARTUP_ERROR
        chosen = _resnapshot_tables(conn, config, patterns)
        if not chosen:
            print(
                f"no selected table matches {', '.join(patterns)}: see `bottledwater topics`", file=sys.stderr
            )
            return EXIT_STARTUP_ERROR
        unkeyed = [t.qualified_name for t in chosen if not t.schema.is_keyed]
        if unkeyed:
            print(
                f"cannot re-snapshot {', '.join(unkeyed)} while streaming: no primary key or replica "
                "identity index (add one, or drop the slot for a full snapshot)",
                file=sys.stderr,
            )
            return EXIT_STARTUP_ERROR
        request_id, lsn = request_resnapshot(
            conn, config.slot, [(t.schema.namespace, t.schema.name) for t in chosen]
        )
    finally:
        conn.close()
    print(f"requested a re-snapshot of {', '.join(t.qualified_name for t in chosen)} at {format_lsn(lsn)}")
    print(f"  request {request_id}; progress: the worker's log, and snapshot_* events on the control topic")
    if info.active_pid is None:
        print(f"  slot {config.slot} is inactive: the re-snapshot runs when the worker streams again")
    return EXIT_OK


# -- main --------------------------------------------------------------------------------------
