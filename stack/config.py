"""Where the local stack lives and how it is addressed. Pure: no I/O here."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
MAVEN_DIR = Path(__file__).resolve().parent / "maven"

KAFKA_VERSION = "4.1.1"
APICURIO_ARTIFACT = "io.apicurio:apicurio-registry-app:3.3.3:tar.gz:all"
MAVEN_CENTRAL = "https://repo.maven.apache.org/maven2/"
POSTGRES_BIN = Path("/usr/lib/postgresql/15/bin")
# The postgres user runs the cluster when bw-stack runs as root: initdb refuses root.
POSTGRES_OS_USER = "postgres"
# How every cluster of the stack is initialised (Debian's 15 and the other majors alike): the
# `postgres` superuser, trust on loopback (a development stack), UTF-8 with a locale every machine has.
INITDB_OPTIONS = ("-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C.UTF-8")


def _port(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


@dataclass(frozen=True)
class StackConfig:
    home: Path
    pg_port: int
    kafka_port: int
    kafka_controller_port: int
    registry_port: int
    registry_management_port: int
    dagster_port: int

    @classmethod
    def from_env(cls) -> StackConfig:
        home = Path(os.environ.get("BW_STACK_HOME", PROJECT_ROOT / ".stack")).resolve()
        return cls(
            home=home,
            pg_port=_port("BW_STACK_PG_PORT", 55432),
            kafka_port=_port("BW_STACK_KAFKA_PORT", 9092),
            kafka_controller_port=_port("BW_STACK_KAFKA_CONTROLLER_PORT", 9093),
            registry_port=_port("BW_STACK_REGISTRY_PORT", 8081),
            registry_management_port=_port("BW_STACK_REGISTRY_MANAGEMENT_PORT", 9000),
            dagster_port=_port("BW_STACK_DAGSTER_PORT", 3000),
        )

    # Installed software
    @property
    def kafka_libs(self) -> Path:
        return self.home / "kafka" / "libs"

    @property
    def spark_jars_dir(self) -> Path:
        return self.home / "spark-jars"

    @property
    def registry_dir(self) -> Path:
        return self.home / "registry"

    # Data, logs and pids
    @property
    def kafka_data(self) -> Path:
        return self.home / "data" / "kafka"

    @property
    def run_dir(self) -> Path:
        return self.home / "run"

    @property
    def log_dir(self) -> Path:
        return self.home / "logs"

    @property
    def dagster_home(self) -> Path:
        return self.home / "dagster"

    def log_file(self, service: str) -> Path:
        return self.log_dir / f"{service}.log"

    def pid_file(self, service: str) -> Path:
        return self.run_dir / f"{service}.pid"

    # Addresses
    @property
    def postgres_dsn(self) -> str:
        return f"host=127.0.0.1 port={self.pg_port} user=postgres dbname=postgres"

    def postgres_url(self, dbname: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.pg_port}/{dbname}"

    @property
    def kafka_bootstrap(self) -> str:
        return f"127.0.0.1:{self.kafka_port}"

    @property
    def registry_url(self) -> str:
        return f"http://127.0.0.1:{self.registry_port}/apis/ccompat/v7"

    def spark_jars(self) -> list[Path]:
        if not self.spark_jars_dir.is_dir():
            return []
        return sorted(self.spark_jars_dir.glob("*.jar"))
