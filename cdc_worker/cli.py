"""`bottledwater`: the command line of the worker.

    bottledwater [options]                run the worker (snapshot on first start, then stream)
    bottledwater [options] slot status    lag, retained and safe WAL, wal_status, publications
    bottledwater [options] slot drop      drop the slot (stop the worker first)
    bottledwater [options] topics         which table goes to which topic, with its key
    bottledwater [options] topics delete --confirm SLOT
                                          delete the tables' topics and the control topic
    bottledwater [options] rebuild --confirm SLOT
                                          after a lost slot: drop the slot and delete the topics,
                                          so that the next start snapshots into fresh topics
    bottledwater [options] resnapshot T.. re-publish the rows of tables T while the worker streams
    bottledwater [options] ddl install|uninstall
                                          put in place or remove the --capture-ddl event trigger

Options are Bottled Water's (same letters, meanings and defaults) plus the new ones, all declared
in `config.OPTIONS`; each also reads its `BOTTLEDWATER_*` environment variable. Exit codes: 0 done
or stopped by SIGTERM/SIGINT, 1 runtime error, 2 bad configuration or a failed startup check.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence
from types import FrameType

import psycopg2
import psycopg2.extensions

from cdc_worker import __version__, ddl_cli
from cdc_worker.commands import (
    delete_pipeline_topics,
    list_topics,
    rebuild,
    resnapshot,
    show_slot_status,
    slot_drop,
)
from cdc_worker.config import ConfigError, config_from_values, resolve_values
from cdc_worker.core.encoding.native import codec_description, producer_description
from cdc_worker.options import OPTIONS, OptionSpec
from cdc_worker.shell.allocator import allocator_in_use, run_on_jemalloc
from cdc_worker.shell.kafka_settings import print_librdkafka_properties
from cdc_worker.shell.logs import configure_logging
from cdc_worker.worker import EXIT_OK, EXIT_RUNTIME_ERROR, EXIT_STARTUP_ERROR, Worker
from kafka_contract.redaction import redact_text

log = logging.getLogger("cdc_worker")

PROG = "bottledwater"
LIBRDKAFKA_DOCS = "https://github.com/confluentinc/librdkafka/blob/master/CONFIGURATION.md"


class _ConfigHelp(argparse.Action):
    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: object) -> None:
        super().__init__(
            option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=str(kwargs.get("help"))
        )

    def __call__(self, parser: argparse.ArgumentParser, *_args: object, **_kwargs: object) -> None:
        if not print_librdkafka_properties():
            print(f"librdkafka's settings are listed at {LIBRDKAFKA_DOCS}")
        parser.exit(EXIT_OK)


def _help_text(spec: OptionSpec) -> str:
    default = spec.default if spec.dest != "snapshot_workers" else "number of CPU cores"
    shown = "" if default in (None, False) else f"; default {default}"
    return f"{spec.help} [env {spec.env}{shown}]"


def _add_options(parser: argparse.ArgumentParser) -> None:
    """Every option, with SUPPRESS defaults: absent options stay absent, so that options given
    before a subcommand are not overwritten by the subcommand's defaults, and so that the
    environment and the defaults are applied once, by `config.resolve_values`."""
    for spec in OPTIONS:
        kwargs: dict[str, object] = {
            "dest": spec.dest,
            "help": _help_text(spec),
            "default": argparse.SUPPRESS,
        }
        if spec.kind == "flag":
            kwargs["action"] = "store_true"
        else:
            kwargs["metavar"] = spec.metavar or spec.dest.upper()
            if spec.kind in ("settings", "globs", "per_table"):
                kwargs["action"] = "append"
            if spec.kind == "choice":
                kwargs["choices"] = spec.choices
                kwargs["metavar"] = "{" + ",".join(spec.choices) + "}"
        parser.add_argument(*spec.flags, **kwargs)  # type: ignore[arg-type]
    parser.add_argument(
        "--config-help", action=_ConfigHelp, help="List librdkafka's settings (for -C) and exit."
    )


def build_parser() -> argparse.ArgumentParser:
    epilog = (
        "Each option also reads the environment variable shown (a flag given here wins). Lists in one "
        "variable: KEY=VALUE settings separated by ';', globs by ','. Exit codes: 0 done or stopped, "
        "1 runtime error, 2 bad configuration or failed startup check."
    )
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Change data capture from PostgreSQL into Kafka (Bottled Water).",
        epilog=epilog,
    )
    parser.add_argument(
        "--version",
        action="version",
        version=f"{PROG} {__version__}, {codec_description()}, {producer_description()}",
    )
    _add_options(parser)
    commands = parser.add_subparsers(dest="command", metavar="{slot,topics,resnapshot,rebuild,ddl}")
    slot_parser = commands.add_parser("slot", help="Look at or drop the replication slot.")
    _add_options(slot_parser)
    slot_parser.add_argument(
        "action", choices=("status", "drop"), help="status: position and lag; drop: drop it"
    )
    slot_parser.add_argument(
        "--standby", metavar="DSN", help="status: also whether a failover slot is sync-ready on this standby"
    )
    topics_parser = commands.add_parser(
        "topics", help="Which table goes to which topic, with its key; or delete those topics."
    )
    _add_options(topics_parser)
    topics_parser.add_argument(
        "action",
        nargs="?",
        choices=("list", "delete"),
        default="list",
        help="list (default); delete: delete every selected table's topic and the control topic",
    )
    topics_parser.add_argument("--confirm", metavar="SLOT", help="delete: the slot's name, typed out")
    rebuild_parser = commands.add_parser(
        "rebuild",
        help="After a lost slot: drop the slot and delete the topics (tables and control), so that the "
        "next start of the worker takes a new snapshot into fresh topics. The worker must be stopped.",
    )
    _add_options(rebuild_parser)
    rebuild_parser.add_argument("--confirm", metavar="SLOT", help="the slot's name, typed out")
    resnapshot_parser = commands.add_parser(
        "resnapshot",
        help="Ask the worker streaming the slot to publish the rows of these tables again, while "
        "it goes on streaming (the request waits in the WAL until the worker reads it).",
    )
    _add_options(resnapshot_parser)
    resnapshot_parser.add_argument(
        "patterns", nargs="+", metavar="TABLE", help="schema.table globs, among the selected tables"
    )
    ddl_cli.add_parser(commands, _add_options)
    return parser


def _install_signal_handlers(stop: threading.Event) -> None:
    def handle(signum: int, _frame: FrameType | None) -> None:
        if stop.is_set():
            # A second signal: the operator does not want to wait for the flush.
            raise SystemExit(EXIT_RUNTIME_ERROR)
        log.info(
            "%s received: stopping after a flush and a final acknowledgement", signal.Signals(signum).name
        )
        stop.set()

    signal.signal(signal.SIGTERM, handle)
    signal.signal(signal.SIGINT, handle)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = vars(parser.parse_args(argv))
    command = args.pop("command", None)
    action = args.pop("action", None)
    standby_dsn = args.pop("standby", None)
    patterns = args.pop("patterns", None) or []
    confirm = args.pop("confirm", None)
    try:
        config = config_from_values(resolve_values(args, os.environ))
    except ConfigError as exc:
        print(f"{PROG}: {redact_text(str(exc))}", file=sys.stderr)
        return EXIT_STARTUP_ERROR
    if command is None and argv is None:
        # The worker as a program (not called in-process with arguments): on jemalloc, once.
        run_on_jemalloc()
    configure_logging(config.log_format, config.log_level)
    try:
        if command == "slot":
            return show_slot_status(config, standby_dsn) if action == "status" else slot_drop(config)
        if command == "topics":
            return delete_pipeline_topics(config, confirm) if action == "delete" else list_topics(config)
        if command == "rebuild":
            return rebuild(config, confirm)
        if command == "resnapshot":
            return resnapshot(config, patterns)
        if command == ddl_cli.COMMAND:
            return ddl_cli.run(config, str(action))
    except psycopg2.OperationalError as exc:
        log.error("cannot connect to Postgres: %s", str(exc).strip())
        return EXIT_STARTUP_ERROR
    log.info("memory allocator: %s", allocator_in_use(os.environ))
    stop = threading.Event()
    _install_signal_handlers(stop)
    return Worker(config, stop).run()


if __name__ == "__main__":
    sys.exit(main())
