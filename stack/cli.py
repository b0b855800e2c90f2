"""`bw-stack`: install, start, inspect and stop the local stack of real services (no Docker)."""

from __future__ import annotations

import argparse
import shlex
import shutil
import subprocess
import sys
from collections.abc import Sequence

from stack import dagster_home, postgres_versions
from stack import install as installer
from stack.config import PROJECT_ROOT, StackConfig
from stack.environment import env_values
from stack.errors import StackError
from stack.services import Postgres, Service, all_services

POSTGRES_UP_TIMEOUT_S = 60.0
SERVICES_UP_TIMEOUT_S = 180.0
LOG_TAIL_LINES = 100


def cmd_install(cfg: StackConfig, _: argparse.Namespace) -> None:
    installer.install(cfg)


def cmd_up(cfg: StackConfig, args: argparse.Namespace) -> None:
    services = all_services(cfg)
    postgres, others = services[0], services[1:]
    # The registry keeps its schemas in Postgres, so Postgres must answer first.
    if postgres.start():
        installer.say("starting postgres")
    postgres.wait_healthy(POSTGRES_UP_TIMEOUT_S)
    dagster_home.write_instance(cfg)  # Dagster's instance storage lives on this Postgres
    for service in others:
        if service.start():
            installer.say(f"starting {service.name}")
    for service in others:
        service.wait_healthy(SERVICES_UP_TIMEOUT_S)
    installer.say("stack is up and healthy")
    _print_status(services)
    if getattr(args, "spark_cluster", False):
        cmd_spark_cluster(cfg, argparse.Namespace(action="up"))
    if getattr(args, "kafka_brokers", 1) == 3:
        cmd_kafka_cluster(cfg, argparse.Namespace(action="up", prefix=None))


def cmd_spark_cluster(cfg: StackConfig, args: argparse.Namespace) -> None:
    from stack import spark_cluster

    if args.action == "up":
        installer.say(f"spark cluster up: --master {spark_cluster.up(cfg)}")
    else:
        spark_cluster.down(cfg)
        installer.say("spark cluster down")


def cmd_kafka_cluster(cfg: StackConfig, args: argparse.Namespace) -> None:
    from stack import kafka_cluster

    if args.action == "up":
        installer.say(f"kafka cluster up (SASL_SSL, 3 nodes): {kafka_cluster.up(cfg)}")
    elif args.action == "down":
        kafka_cluster.down(cfg)
        installer.say("kafka cluster down")
    elif args.action == "grant":
        if not args.prefix:
            raise StackError("kafka-cluster grant needs --prefix (the worker's -p/--topic-prefix)")
        kafka_cluster.grant_pipeline(cfg, args.prefix)
        installer.say(f"granted {kafka_cluster.WORKER} and {kafka_cluster.MERGE} the topics {args.prefix}.*")
    else:
        print("\n".join(f"export {k}={shlex.quote(v)}" for k, v in kafka_cluster.environment(cfg).items()))


def cmd_down(cfg: StackConfig, _: argparse.Namespace) -> None:
    from stack import demo, kafka_cluster, spark_cluster

    demo.stop_pipeline(cfg)
    postgres_versions.stop_all(cfg)
    if kafka_cluster.running(cfg):
        installer.say("stopping the Kafka cluster")
        kafka_cluster.down(cfg)
    if any(service.running() for service in spark_cluster.cluster_services(cfg)):
        installer.say("stopping the Spark cluster")
        spark_cluster.down(cfg)
    for service in reversed(all_services(cfg)):
        if service.pid() is not None:
            installer.say(f"stopping {service.name}")
            service.stop()
    installer.say("stack is down")


def cmd_status(cfg: StackConfig, _: argparse.Namespace) -> None:
    services = all_services(cfg)
    _print_status(services)
    if not all(s.pid() is not None and s.healthy() for s in services):
        raise SystemExit(1)


def _print_status(services: Sequence[Service]) -> None:
    print(f"{'service':<10} {'address':<45} {'pid':>8}  healthy  log")
    for s in services:
        pid = s.pid()
        healthy = pid is not None and s.healthy()
        print(f"{s.name:<10} {s.address:<45} {pid or '-':>8}  {'yes' if healthy else 'no ':<7}  {s.log_file}")


def env_lines(cfg: StackConfig) -> list[str]:
    return [f"export {k}={shlex.quote(v)}" for k, v in env_values(cfg).items()]


def cmd_env(cfg: StackConfig, _: argparse.Namespace) -> None:
    print("\n".join(env_lines(cfg)))


def cmd_logs(cfg: StackConfig, args: argparse.Namespace) -> None:
    log = cfg.log_file(args.service)
    if not log.exists():
        raise StackError(f"no log yet for {args.service} at {log}: has it been started (`bw-stack up`)?")
    tail = ["tail", "-n", str(args.lines), *(["-F"] if args.follow else []), str(log)]
    subprocess.run(tail, check=False)


def cmd_reset(cfg: StackConfig, args: argparse.Namespace) -> None:
    cmd_down(cfg, args)
    Postgres(cfg).wipe()
    for path in (
        cfg.home / "data",
        cfg.run_dir,
        cfg.log_dir,
        cfg.dagster_home,
        cfg.home / "kafka" / "server.properties",
    ):
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
    installer.say("data wiped (installed software kept); `bw-stack up` starts afresh")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bw-stack",
        description="The local stack of real services for development, tests and the demo: PostgreSQL 15 "
        "(wal_level=logical), Kafka 4 in KRaft mode and Apicurio Registry (Confluent-compatible API), plus "
        "the jars Spark needs for Kafka and Delta. Everything lives under $BW_STACK_HOME "
        f"(default {PROJECT_ROOT / '.stack'}).",
        epilog="Ports: BW_STACK_PG_PORT (55432), BW_STACK_KAFKA_PORT (9092), BW_STACK_KAFKA_CONTROLLER_PORT "
        "(9093), BW_STACK_REGISTRY_PORT (8081). Typical use: bw-stack install && bw-stack up && "
        'eval "$(bw-stack env)".',
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser(
        "install",
        help="install PostgreSQL (apt-get) and resolve Kafka, Spark jars and Apicurio "
        "from Maven Central; cached, a second run downloads nothing",
    ).set_defaults(func=cmd_install)
    up = sub.add_parser(
        "up", help="start every service and wait until each answers a real request; idempotent"
    )
    up.add_argument(
        "--spark-cluster", action="store_true", help="also start a Spark standalone master and worker"
    )
    up.add_argument(
        "--kafka-brokers", type=int, choices=[1, 3], default=1,
        help="3: also start the secured three-node cluster (as `bw-stack kafka-cluster up`)",
    )  # fmt: skip
    up.set_defaults(func=cmd_up)
    kafka = sub.add_parser(
        "kafka-cluster",
        help="a three-node KRaft cluster on loopback, SASL_SSL (SCRAM-SHA-512) with ACLs, RF 3, "
        "min.insync.replicas 2 (BW_STACK_KAFKA_CLUSTER_PORT, 29092); `grant --prefix P` lets the "
        "worker and the merge use the topics P.*; `env` prints its addresses and files",
    )
    kafka.add_argument("action", choices=["up", "down", "grant", "env"])
    kafka.add_argument("--prefix", help="grant: the pipeline's topic prefix")
    kafka.set_defaults(func=cmd_kafka_cluster)
    cluster = sub.add_parser(
        "spark-cluster",
        help="a Spark standalone master and one worker on loopback (spark://127.0.0.1:7077, "
        "BW_STACK_SPARK_MASTER_PORT), from pyspark's own jars; `down` stops it too",
    )
    cluster.add_argument("action", choices=["up", "down"])
    cluster.set_defaults(func=cmd_spark_cluster)
    sub.add_parser(
        "down", help="stop every service (SIGTERM, wait, then SIGKILL); leaves no process behind"
    ).set_defaults(func=cmd_down)
    sub.add_parser(
        "status", help="address, pid and health of each service; exit 1 unless all are healthy"
    ).set_defaults(func=cmd_status)
    sub.add_parser(
        "env", help='print export lines for the stack\'s addresses: eval "$(bw-stack env)"'
    ).set_defaults(func=cmd_env)
    logs = sub.add_parser("logs", help="show a service's log")
    logs.add_argument("service", choices=[s.name for s in all_services(StackConfig.from_env())])
    logs.add_argument("-n", "--lines", type=int, default=LOG_TAIL_LINES, help="lines to show (default 100)")
    logs.add_argument("-f", "--follow", action="store_true", help="keep following the log")
    logs.set_defaults(func=cmd_logs)
    sub.add_parser(
        "reset", help="stop everything and wipe the data (installed software is kept)"
    ).set_defaults(func=cmd_reset)
    postgres_versions.add_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        args.func(StackConfig.from_env(), args)
    except StackError as exc:
        print(f"bw-stack: error: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
    except KeyboardInterrupt:
        raise SystemExit(130) from None


if __name__ == "__main__":
    main()
