"""The consistent read's command: several Delta mirrors read at one source position, printed with
its lag and each table's row count (the read itself is `spark_jobs.reading`; docs/lakehouse.md).

    python -m spark_jobs.consistent_read --warehouse /tmp/lake public.accounts public.transfers
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from datetime import datetime

from spark_jobs import option_parser
from spark_jobs.errors import ConfigurationError
from spark_jobs.job_main import exit_on_error
from spark_jobs.lake import changelog
from spark_jobs.merge_options import options_from_args
from spark_jobs.reading import views
from spark_jobs.reading.consistent import NoCommonWatermark, read_consistent
from spark_jobs.reading.result import ConsistentRead, TableRead, summary

# The read's names stay importable from here, for code written before they moved to reading/.
__all__ = ["ConsistentRead", "NoCommonWatermark", "TableRead", "main", "read_consistent", "summary"]

DESCRIPTION = (
    "Read Delta mirrors as of one source position (the newest all reached, or one given) and print it, "
    "its lag and each table's row count."
)


def build_parser() -> argparse.ArgumentParser:
    """The shared options of every Spark job (the warehouse, the worker's format, registry and topic
    prefix, the Spark options, each with its environment variable), then the read's own."""
    parser = option_parser.build_parser("consistent_read", DESCRIPTION)
    parser.add_argument("tables", nargs="+", help="schema.table (safe names), e.g. public.accounts")
    parser.add_argument(
        "--at-lsn", type=int, help="read as of this commit LSN (or the newest position before)"
    )
    parser.add_argument(
        "--at-time", type=datetime.fromisoformat, help="read as of this time (ISO 8601, with zone)"
    )
    parser.add_argument("--no-history", action="store_true", help="read the mirrors only")
    parser.add_argument(
        "--no-changelog",
        action="store_true",
        help="read at the mirrors' common position, not at the changelog's newest (mirror + tail)",
    )
    parser.add_argument(
        "--sql",
        help="a query over the tables as views at the read's position (public.accounts is `accounts`, "
        f"sales.orders `sales_orders`); its first {views.PRINTED_ROWS} rows are printed",
    )
    return parser


@exit_on_error
def main(argv: Sequence[str] | None = None) -> int:
    from shared_connections.spark_session import build_session

    args = build_parser().parse_args(argv)
    spark = build_session(option_parser.spark_settings(args, "bottledwater-consistent-read"))
    tail_from = None
    if not args.no_changelog and changelog.exists(spark, args.warehouse):
        tail_from = options_from_args(args, changelog.recorded_decoding(spark, args.warehouse))
        if tail_from.output_format == "avro" and not tail_from.schema_registry:
            raise ConfigurationError(
                f"{args.warehouse} keeps a changelog of Avro records and records no registry: give "
                "--schema-registry (or set BOTTLEDWATER_SCHEMA_REGISTRY) to read its tail (or "
                "--no-changelog to read the mirrors' common position)"
            )
    read = read_consistent(
        spark,
        args.warehouse,
        args.tables,
        at_lsn=args.at_lsn,
        at_time=args.at_time,
        use_history=not args.no_history,
        tail_from=tail_from,
        through_changelog=not args.no_changelog,
    )
    out = summary(read)
    out["rows"] = {name: table.frame.count() for name, table in read.tables.items()}
    if args.sql:
        read.register_views()
        out["sql"] = views.query_rows(spark, args.sql)
    print(json.dumps(out, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
