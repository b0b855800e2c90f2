"""The stack's services: how each one is started, probed and stopped."""

from __future__ import annotations

import base64
import functools
import hashlib
import os
import shutil
import urllib.error
import urllib.request
import uuid
from abc import ABC, abstractmethod
from pathlib import Path

from stack import java, process
from stack.config import INITDB_OPTIONS, POSTGRES_BIN, POSTGRES_OS_USER, StackConfig
from stack.errors import StackError

PROBE_TIMEOUT_S = 3.0
KAFKA_HEAP = "512m"
REGISTRY_HEAP = "384m"


class Service(ABC):
    name: str
    port_env_var: str

    def __init__(self, cfg: StackConfig) -> None:
        self.cfg = cfg

    @property
    def log_file(self) -> Path:
        return self.cfg.log_file(self.name)

    @property
    @abstractmethod
    def port(self) -> int: ...

    @property
    @abstractmethod
    def address(self) -> str: ...

    @abstractmethod
    def pid(self) -> int | None: ...

    @abstractmethod
    def installed(self) -> bool: ...

    @abstractmethod
    def launch(self) -> None:
        """Start the process; return without waiting for it to be healthy."""

    @abstractmethod
    def healthy(self) -> bool:
        """One real request (a query, a metadata request, an HTTP GET), answered in time."""

    def start(self) -> bool:
        """Launch unless already running; True when a process was launched."""
        if self.pid() is not None:
            return False
        if not self.installed():
            raise StackError(f"{self.name} is not installed: run `bw-stack install` first")
        process.refuse_busy_port(self.port, self.name, self.port_env_var)
        self.launch()
        return True

    def wait_healthy(self, timeout_s: float) -> None:
        """Until `healthy()`; fails at once, naming the log, if the process has died."""

        def check() -> bool:
            if self.pid() is None:
                raise StackError(f"{self.name} exited during start-up: see {self.log_file}")
            return self.healthy()

        process.wait_until(check, timeout_s, self.name, self.log_file)

    def stop(self) -> None:
        pid = self.pid()
        if pid is not None:
            process.terminate(pid)


class Postgres(Service):
    name = "postgres"
    port_env_var = "BW_STACK_PG_PORT"

    @property
    def port(self) -> int:
        return self.cfg.pg_port

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @functools.cached_property
    def base(self) -> Path:
        """Where the cluster's files live: the stack's home, unless the postgres OS user cannot
        reach it (a checkout under a private home directory, run as root)."""
        if process.reachable_by(POSTGRES_OS_USER, self.cfg.home):
            return self.cfg.home
        digest = hashlib.sha256(str(self.cfg.home).encode()).hexdigest()[:12]
        return Path("/var/lib/postgresql/bw-stack") / digest

    @property
    def data_dir(self) -> Path:
        return self.base / "data" / "postgres"

    @property
    def socket_dir(self) -> Path:
        return self.base / "run" / "postgres"

    @property
    def log_file(self) -> Path:
        return self.base / "logs" / "postgres.log"

    def wipe(self) -> None:
        for path in (self.data_dir, self.socket_dir, self.log_file):
            if path.is_dir():
                shutil.rmtree(path)
            elif path.exists():
                path.unlink()

    def pid(self) -> int | None:
        return process.read_pid(self.data_dir / "postmaster.pid", "postgres")

    def installed(self) -> bool:
        return (POSTGRES_BIN / "postgres").exists()

    def launch(self) -> None:
        if not (self.data_dir / "PG_VERSION").exists():
            self._init_cluster()
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        self.log_file.touch()
        process.chown_to(POSTGRES_OS_USER, self.log_file.parent, self.log_file)
        result = process.run_as(
            POSTGRES_OS_USER,
            [
                str(POSTGRES_BIN / "pg_ctl"),
                "-D",
                str(self.data_dir),
                "-l",
                str(self.log_file),
                # Wait until it accepts connections, so a pid file exists once this returns.
                "-w",
                "-t",
                "60",
                "start",
            ],
        )
        if result.returncode != 0:
            raise StackError(f"pg_ctl start failed ({process.output_of(result)}): see {self.log_file}")

    def _init_cluster(self) -> None:
        for path in (self.data_dir, self.socket_dir):
            path.mkdir(parents=True, exist_ok=True)
            process.chown_to(POSTGRES_OS_USER, path)
        result = process.run_as(
            POSTGRES_OS_USER,
            [str(POSTGRES_BIN / "initdb"), "-D", str(self.data_dir), *INITDB_OPTIONS],
        )
        if result.returncode != 0:
            raise StackError(f"initdb failed ({process.output_of(result)})")
        settings = {
            "port": str(self.port),
            "listen_addresses": "'127.0.0.1'",
            "unix_socket_directories": f"'{self.socket_dir}'",
            "wal_level": "logical",
            "max_replication_slots": "20",
            "max_wal_senders": "20",
            "max_connections": "200",
            "shared_buffers": "256MB",
            "timezone": "'UTC'",
            "log_timezone": "'UTC'",
        }
        with (self.data_dir / "postgresql.conf").open("a") as conf:
            conf.write("\n# bw-stack\n" + "".join(f"{k} = {v}\n" for k, v in settings.items()))

    def healthy(self) -> bool:
        import psycopg2

        try:
            with (
                psycopg2.connect(self.cfg.postgres_dsn, connect_timeout=int(PROBE_TIMEOUT_S)) as conn,
                conn.cursor() as cur,
            ):
                cur.execute("SELECT 1")
                return bool(cur.fetchone() == (1,))
        except psycopg2.Error:
            return False

    def stop(self) -> None:
        if self.pid() is None:
            return
        process.run_as(
            POSTGRES_OS_USER,
            [
                str(POSTGRES_BIN / "pg_ctl"),
                "-D",
                str(self.data_dir),
                "-m",
                "fast",
                "-w",
                "-t",
                "60",
                "stop",
            ],
        )
        super().stop()

    def ensure_database(self, name: str) -> None:
        import psycopg2
        from psycopg2 import sql

        conn = psycopg2.connect(self.cfg.postgres_dsn)
        try:
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
                if cur.fetchone() is None:
                    cur.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        finally:
            conn.close()


class Kafka(Service):
    name = "kafka"
    port_env_var = "BW_STACK_KAFKA_PORT"

    @property
    def port(self) -> int:
        return self.cfg.kafka_port

    @property
    def address(self) -> str:
        return self.cfg.kafka_bootstrap

    @property
    def config_file(self) -> Path:
        return self.cfg.home / "kafka" / "server.properties"

    def pid(self) -> int | None:
        return process.read_pid(self.cfg.pid_file(self.name), "kafka.Kafka")

    def installed(self) -> bool:
        return any(self.cfg.kafka_libs.glob("kafka_2.13-*.jar"))

    def _java(self, main: str, *args: str) -> list[str]:
        return [
            _java_binary(java.KAFKA_MIN_JAVA),
            f"-Xmx{KAFKA_HEAP}",
            f"-Xms{KAFKA_HEAP}",
            "-XX:+UseG1GC",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.cfg.home / 'kafka' / 'log4j2.properties'}",
            "-cp",
            f"{self.cfg.kafka_libs}/*",
            main,
            *args,
        ]

    def launch(self) -> None:
        self._write_config()
        if not (self.cfg.kafka_data / "meta.properties").exists():
            cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
            format_args = ["format", "-t", cluster_id, "-c", str(self.config_file)]
            # The retry skips a directory the failed attempt did format (StorageTool refuses one
            # that is "already formatted", on stderr, which is why that failure used to show nothing).
            process.run_retrying_once(
                None,
                self._java("kafka.tools.StorageTool", *format_args),
                "formatting Kafka's storage",
                retry_cmd=self._java("kafka.tools.StorageTool", *format_args, "--ignore-formatted"),
            )
        process.spawn(
            self._java("kafka.Kafka", str(self.config_file)), self.log_file, self.cfg.pid_file(self.name)
        )

    def _write_config(self) -> None:
        self.config_file.parent.mkdir(parents=True, exist_ok=True)
        controller = self.cfg.kafka_controller_port
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@127.0.0.1:{controller}",
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{controller}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.cfg.kafka_data),
            "num.partitions": "1",
            "offsets.topic.replication.factor": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            # The worker creates its topics itself with the settings they need (compaction for keyed
            # tables); an auto-created topic would silently get the wrong ones.
            "auto.create.topics.enable": "false",
            "log.cleaner.backoff.ms": "1000",
        }
        self.config_file.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        (self.cfg.home / "kafka" / "log4j2.properties").write_text(
            "rootLogger.level = INFO\nrootLogger.appenderRef.stdout.ref = STDOUT\n"
            "appender.stdout.type = Console\nappender.stdout.name = STDOUT\n"
            "appender.stdout.layout.type = PatternLayout\n"
            "appender.stdout.layout.pattern = [%d] %p %m (%c)%n\n"
            "logger.kafka.name = kafka\nlogger.kafka.level = WARN\n"
            "logger.state.name = state.change.logger\nlogger.state.level = WARN\n"
        )

    def healthy(self) -> bool:
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.address, "log_level": 0})
        try:
            metadata = admin.list_topics(timeout=PROBE_TIMEOUT_S)
        except Exception:
            return False
        return bool(metadata.brokers)


class Registry(Service):
    name = "registry"
    port_env_var = "BW_STACK_REGISTRY_PORT"
    database = "apicurio"

    def __init__(self, cfg: StackConfig, postgres: Postgres) -> None:
        super().__init__(cfg)
        self.postgres = postgres

    @property
    def port(self) -> int:
        return self.cfg.registry_port

    @property
    def address(self) -> str:
        return self.cfg.registry_url

    def pid(self) -> int | None:
        return process.read_pid(self.cfg.pid_file(self.name), "quarkus-run.jar")

    def installed(self) -> bool:
        return (self.cfg.registry_dir / "quarkus-run.jar").exists()

    def launch(self) -> None:
        process.refuse_busy_port(
            self.cfg.registry_management_port,
            "the registry's management interface",
            "BW_STACK_REGISTRY_MANAGEMENT_PORT",
        )
        # Storage on the stack's Postgres, so schema ids survive a restart of the registry.
        self.postgres.ensure_database(self.database)
        env = {
            **os.environ,
            "QUARKUS_HTTP_HOST": "127.0.0.1",
            "QUARKUS_HTTP_PORT": str(self.port),
            # Quarkus' health/metrics interface; loopback only, and its own port so that two
            # stacks (or another Quarkus app) on one machine do not collide on 9000.
            "QUARKUS_MANAGEMENT_HOST": "127.0.0.1",
            "QUARKUS_MANAGEMENT_PORT": str(self.cfg.registry_management_port),
            "APICURIO_STORAGE_KIND": "sql",
            "APICURIO_STORAGE_SQL_KIND": "postgresql",
            "APICURIO_DATASOURCE_URL": f"jdbc:postgresql://127.0.0.1:{self.cfg.pg_port}/{self.database}",
            "APICURIO_DATASOURCE_USERNAME": "postgres",
            "APICURIO_DATASOURCE_PASSWORD": "postgres",
            "APICURIO_DATASOURCE_JDBC_INITIAL_SIZE": "2",
            "APICURIO_DATASOURCE_JDBC_MIN_SIZE": "2",
            "APICURIO_DATASOURCE_JDBC_MAX_SIZE": "10",
        }
        cmd = [
            _java_binary(java.REGISTRY_MIN_JAVA),
            f"-Xmx{REGISTRY_HEAP}",
            "-XX:+UseSerialGC",
            "-Djava.awt.headless=true",
            "-jar",
            str(self.cfg.registry_dir / "quarkus-run.jar"),
        ]
        process.spawn(cmd, self.log_file, self.cfg.pid_file(self.name), env=env, cwd=self.cfg.registry_dir)

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.address}/subjects", timeout=PROBE_TIMEOUT_S) as resp:
                return bool(resp.status == 200)
        except (urllib.error.URLError, OSError):
            return False


def _java_binary(min_version: int) -> str:
    found = java.find_java(min_version)
    if found is None:
        raise StackError(f"no Java {min_version}+ found: run `bw-stack install`, or set BW_STACK_JAVA")
    return found


def all_services(cfg: StackConfig) -> list[Service]:
    """In start order; `down` stops them in reverse."""
    postgres = Postgres(cfg)
    return [postgres, Kafka(cfg), Registry(cfg, postgres)]
