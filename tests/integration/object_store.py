"""An S3 API on loopback for the lakehouse tests: moto's server (`moto[server]`, a dev extra) in a
process of its own, one bucket, and the s3a settings that reach it.

The tier has one SparkSession (tests/integration/conftest.py), so the settings are put on its
Hadoop configuration at runtime, scoped to the bucket (`fs.s3a.bucket.<bucket>.*`): every other
path the session reads is untouched, and no second JVM is started. They must be set before the
first s3a path of the bucket is touched, since Hadoop caches a file system per bucket with the
settings it was created with.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

START_TIMEOUT_S = 30.0
REGION = "us-east-1"


@dataclass(frozen=True)
class ObjectStore:
    endpoint: str
    bucket: str
    access_key: str
    secret_key: str

    def s3a_settings(self) -> dict[str, str]:
        """The bucket's s3a settings, as a user gives them (`--conf spark.hadoop.<key>=<value>`)."""
        scope = f"fs.s3a.bucket.{self.bucket}"
        return {
            f"{scope}.endpoint": self.endpoint,
            # moto serves buckets under the path, not as host names (as MinIO and Ceph do).
            f"{scope}.path.style.access": "true",
            f"{scope}.connection.ssl.enabled": "false",
            # Named, so that the SDK never looks for a region in ~/.aws or the instance metadata.
            f"{scope}.endpoint.region": REGION,
            f"{scope}.access.key": self.access_key,
            f"{scope}.secret.key": self.secret_key,
        }

    def url(self, *parts: str) -> str:
        return "/".join([f"s3a://{self.bucket}", *parts])

    def keys(self, prefix: str) -> list[str]:
        """Every object key under `prefix`, read through the S3 API itself (not through Hadoop)."""
        client = self._client()
        keys: list[str] = []
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
            keys += [str(o["Key"]) for o in page.get("Contents", [])]
        return keys

    def create_bucket(self) -> None:
        self._client().create_bucket(Bucket=self.bucket)

    def _client(self) -> Any:  # boto3 ships no type hints
        import boto3  # type: ignore[import-untyped]

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name=REGION,
        )


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _wait_serving(endpoint: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"moto's server exited {process.returncode} before serving {endpoint}")
        try:
            with urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1):
                return
        except urllib.error.HTTPError:
            return  # any answer is a server answering
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"moto's server did not answer on {endpoint} within {START_TIMEOUT_S:.0f} s")


@contextmanager
def moto_server() -> Iterator[ObjectStore]:
    """moto's S3 on a free loopback port with one bucket, stopped on exit. The keys are random: the
    secret one is what the tests look for in the logs."""
    port = _free_port()
    endpoint = f"http://127.0.0.1:{port}"
    # Its own process, not a thread of the test's: Spark's py4j calls keep this interpreter busy.
    process = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_serving(endpoint, process)
        store = ObjectStore(
            endpoint, f"bw-lake-{uuid.uuid4().hex[:8]}", f"AKIA{uuid.uuid4().hex[:16].upper()}",
            f"bw-secret-{uuid.uuid4().hex}",
        )  # fmt: skip
        store.create_bucket()
        yield store
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


def configure(spark: SparkSession, store: ObjectStore) -> None:
    """The bucket's settings on the session's Hadoop configuration, which Delta and the streaming
    checkpoints read."""
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    for key, value in store.s3a_settings().items():
        hadoop.set(key, value)
