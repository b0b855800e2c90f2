"""The worker's pure shell pieces: options (flags, environment, defaults), redaction, the CLI's
help, table globs, snapshot ranges, topic settings. No services."""

from __future__ import annotations

import logging
from io import StringIO
from pathlib import Path

import pytest

from cdc_worker.cli import build_parser
from cdc_worker.config import ConfigError, config_from_values, resolve_values
from cdc_worker.core.ack import FailurePolicy
from cdc_worker.core.model import TableSchema
from cdc_worker.options import OPTIONS, OutputFormat
from cdc_worker.shell.kafka_publisher import TopicSpec, new_topic
from cdc_worker.shell.kafka_settings import producer_settings
from cdc_worker.shell.logs import LogFormat, configure_logging
from cdc_worker.shell.postgres.catalog import CatalogTable, table_matches
from cdc_worker.shell.snapshot.chunks import plan_chunks
from cdc_worker.shell.stream.heartbeat import status_interval_for
from kafka_contract.redaction import redact_dsn, redact_settings, redact_text, redact_url

DSN = "postgresql://u@h/db"


def parse(argv: list[str], environ: dict[str, str] | None = None) -> dict[str, object]:
    args = vars(build_parser().parse_args(argv))
    args.pop("command", None)
    args.pop("action", None)
    return resolve_values(args, environ or {})


def test_bottled_water_defaults() -> None:
    config = config_from_values(parse(["-d", DSN]))
    assert (config.slot, config.broker, config.schema_registry) == (
        "bottledwater",
        "localhost:9092",
        "http://localhost:8081",
    )
    assert config.output_format is OutputFormat.AVRO and config.on_error is FailurePolicy.EXIT
    assert not config.allow_unkeyed and not config.skip_snapshot and config.topic_prefix is None
    assert config.publication_name == "bottledwater" and config.snapshot_workers >= 1
    assert config.status_interval == 10.0 and config.log_format is LogFormat.TEXT


def test_every_bottled_water_short_flag_keeps_its_meaning() -> None:
    argv = ["-d", DSN, "-s", "s1", "-b", "k:1", "-r", "http://r", "-f", "json", "-u", "-p", "pre"]
    argv += ["-e", "log", "-x", "-C", "a=1", "-C", "b=x=y", "-T", "partitions=3"]
    config = config_from_values(parse(argv))
    assert (config.slot, config.broker, config.schema_registry, config.topic_prefix) == (
        "s1",
        "k:1",
        "http://r",
        "pre",
    )
    assert config.output_format is OutputFormat.JSON and config.on_error is FailurePolicy.LOG
    assert config.allow_unkeyed and config.skip_snapshot
    assert config.kafka_config == {"a": "1", "b": "x=y"} and config.topic_config == {"partitions": "3"}


def test_environment_fills_in_and_the_command_line_wins() -> None:
    environ = {
        "BOTTLEDWATER_POSTGRES": DSN,
        "BOTTLEDWATER_SLOT": "from_env",
        "BOTTLEDWATER_ALLOW_UNKEYED": "yes",
        "BOTTLEDWATER_KAFKA_CONFIG": "sasl.jaas.config=a,b;linger.ms=5",
        "BOTTLEDWATER_TABLES": "public.*,sales.orders",
        "BOTTLEDWATER_SNAPSHOT_WORKERS": "3",
    }
    config = config_from_values(parse([], environ))
    assert config.slot == "from_env" and config.allow_unkeyed and config.snapshot_workers == 3
    assert config.kafka_config == {"sasl.jaas.config": "a,b", "linger.ms": "5"}
    assert config.tables == ("public.*", "sales.orders")
    config = config_from_values(parse(["-s", "from_cli", "-C", "x=1", "--tables", "a"], environ))
    assert config.slot == "from_cli" and config.kafka_config == {"x": "1"} and config.tables == ("a",)


def test_options_may_follow_a_subcommand() -> None:
    args = vars(build_parser().parse_args(["-d", DSN, "slot", "status", "-s", "after"]))
    assert (args["command"], args["action"], args["slot"], args["postgres"]) == (
        "slot",
        "status",
        "after",
        DSN,
    )


@pytest.mark.parametrize(
    ("argv", "environ", "message"),
    [
        ([], {}, "-d/--postgres"),
        (["-d", DSN, "-s", "Bad-Slot"], {}, "--slot"),
        (["-d", DSN, "-C", "novalue"], {}, "KEY=VALUE"),
        (["-d", DSN, "--snapshot-workers", "0"], {}, "--snapshot-workers"),
        (["-d", DSN], {"BOTTLEDWATER_SKIP_SNAPSHOT": "maybe"}, "BOTTLEDWATER_SKIP_SNAPSHOT"),
        (["-d", DSN], {"BOTTLEDWATER_ON_ERROR": "ignore"}, "exit, log"),
        (["-d", DSN, "-T", "partitions=many"], {}, "partitions"),
        (["-d", DSN, "--spool-memory-mb", "0"], {}, "--spool-memory-mb 0: give at least 1"),
        (["-d", DSN, "--streamed-producers", "-1"], {}, "--streamed-producers -1: give 0 to 16"),
        (["-d", DSN], {"BOTTLEDWATER_STREAMED_PRODUCERS": "17"}, "--streamed-producers 17: give 0 to 16"),
        (["-d", DSN, "--spool-memory-mb", "-5"], {}, "--spool-memory-mb -5: give at least 1"),
        (
            ["-d", DSN, "--snapshot-engine", "spark"],
            {"BOTTLEDWATER_DELIVERY": "exactly-once"},
            "--snapshot-engine spark publishes outside Kafka transactions",
        ),
    ],
)
def test_bad_values_name_the_option(argv: list[str], environ: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        config_from_values(parse(argv, environ))


def test_help_lists_every_flag_and_environment_variable() -> None:
    text = " ".join(build_parser().format_help().split())
    for spec in OPTIONS:
        for flag in spec.flags:
            assert flag in text, flag
        assert spec.env in text, spec.env
    for extra in ("--config-help", "-h", "slot", "topics"):
        assert extra in text


@pytest.mark.parametrize(
    ("secret", "redacted"),
    [
        ("postgresql://bob:hunter2@db:5432/x", "postgresql://bob:***@db:5432/x"),
        ("host=db user=bob password=hunter2 dbname=x", "host=db user=bob password=*** dbname=x"),
        ("host=db password='hun ter2' dbname=x", "host=db password=*** dbname=x"),
        ("postgresql://db/x?user=bob&password=hunter2", "postgresql://db/x?user=bob&password=***"),
    ],
)
def test_passwords_are_redacted(secret: str, redacted: str) -> None:
    assert redact_dsn(secret) == redacted
    assert "hunter2" not in redact_text(f"could not connect with {secret}")


def test_registry_url_and_kafka_secrets_are_redacted() -> None:
    assert redact_url("https://key:topsecret@registry:8081/x") == "https://key:***@registry:8081/x"
    assert redact_url("http://registry:8081") == "http://registry:8081"
    settings = {"sasl.password": "p", "sasl.jaas.config": "j", "basic.auth.user.info": "u:p", "acks": "all"}
    assert redact_settings(settings) == {
        "sasl.password": "***",
        "sasl.jaas.config": "***",
        "basic.auth.user.info": "***",
        "acks": "all",
    }


def test_logs_never_carry_a_password() -> None:
    stream = StringIO()
    configure_logging(LogFormat.JSON, "info", stream)
    try:
        logging.getLogger("cdc_worker.test").error("connect to %s failed", "postgresql://a:pw123@h/d")
        try:
            raise RuntimeError("password=pw123 refused")
        except RuntimeError:
            logging.getLogger("cdc_worker.test").exception("boom")
    finally:
        logging.getLogger().handlers.clear()
    output = stream.getvalue()
    assert "pw123" not in output and output.count("***") >= 2


def test_table_globs() -> None:
    assert table_matches("public", "users", ["public.*"])
    assert table_matches("sales", "users", ["users"]), "a glob without a dot matches the table in any schema"
    assert not table_matches("sales", "users", ["public.users"])
    assert table_matches("sales", "order_items", ["sales.order_*"])


def _table(oid: int, pages: int) -> CatalogTable:
    return CatalogTable(TableSchema(oid, "public", f"t{oid}", ()), True, True, True, pages, -1)


def test_snapshot_ranges_cover_every_page_and_end_open() -> None:
    chunks = plan_chunks([_table(1, 1000), _table(2, 2500)], pages_per_chunk=1000, workers=1)
    # 3,500 pages for one worker: ranges of 875 pages (about four per worker), the last open-ended.
    assert [(c.table.schema.oid, c.first_page, c.end_page) for c in chunks] == [
        (2, None, 875),
        (2, 875, 1750),
        (2, 1750, None),
        (1, None, 875),
        (1, 875, None),
    ]
    big = plan_chunks([_table(1, 100_000)], pages_per_chunk=8192, workers=2)
    assert {c.end_page - (c.first_page or 0) for c in big[:-1] if c.end_page} == {8192}, "at most 64 MB"


def test_snapshot_ranges_shrink_to_keep_every_worker_busy() -> None:
    chunks = plan_chunks([_table(1, 1024)], pages_per_chunk=8192, workers=2)
    assert [(c.first_page, c.end_page) for c in chunks] == [
        (None, 128), (128, 256), (256, 384), (384, 512), (512, 640), (640, 768), (768, 896), (896, None)
    ]  # fmt: skip
    assert len(plan_chunks([_table(1, 100)], workers=8)) == 1, "never below 128 pages a range"


def test_status_interval_is_capped_by_wal_sender_timeout() -> None:
    assert status_interval_for(10.0, 60_000) == 10.0
    assert status_interval_for(10.0, 20_000) == 5.0
    assert status_interval_for(10.0, 0) == 10.0


def test_topics_are_compacted_only_when_keyed() -> None:
    keyed = new_topic(TopicSpec("a", True), {"partitions": "6", "retention.ms": "100"})
    assert (keyed.num_partitions, keyed.config) == (6, {"retention.ms": "100", "cleanup.policy": "compact"})
    unkeyed = new_topic(TopicSpec("b", False), {"cleanup.policy": "compact"})
    assert unkeyed.config == {"cleanup.policy": "delete"} and unkeyed.num_partitions == -1


def test_producer_keeps_the_delivery_guarantees_by_default() -> None:
    settings = producer_settings("k:1", {"linger.ms": "1"}, "bw")
    assert settings["enable.idempotence"] == "true" and settings["acks"] == "all"
    assert settings["partitioner"] == "murmur2_random" and settings["linger.ms"] == "1"


def test_docs_list_every_option() -> None:
    """Every option is documented once, in docs/worker.md, with its environment variable."""
    docs = (Path(__file__).resolve().parents[2] / "docs" / "worker.md").read_text()
    for spec in OPTIONS:
        row = f"| `{', '.join(spec.flags)}` |"
        assert docs.count(row) == 1 and f"`{spec.env}`" in docs, spec.dest
