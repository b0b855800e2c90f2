"""Which warehouses take one writing application per table at a time (docs/lakehouse.md, "On object
storage")."""

from __future__ import annotations

import pytest

from spark_jobs.rules.object_storage import MULTI_WRITER_S3_LOG_STORE, log_store_keys, single_writer


@pytest.mark.parametrize("path", ["s3a://lake/bw", "S3A://lake/bw", "s3://lake/bw", "s3n://lake/bw"])
def test_s3_with_delta_s_default_log_store_takes_one_writer(path: str) -> None:
    assert single_writer(path, {})
    assert single_writer(path, {"spark.delta.logStore.class": "io.delta.storage.S3SingleDriverLogStore"})


@pytest.mark.parametrize(
    "path",
    [
        "/tmp/lake",
        "file:///tmp/lake",
        "hdfs://nn/lake",
        "gs://lake/bw",
        "abfss://c@acct.dfs.core.windows.net/bw",
    ],
)
def test_file_systems_with_atomic_creation_take_several(path: str) -> None:
    assert not single_writer(path, {})


def test_the_dynamodb_log_store_takes_several_writers_per_scheme_or_for_all() -> None:
    assert not single_writer("s3a://lake/bw", {"spark.delta.logStore.s3a.impl": MULTI_WRITER_S3_LOG_STORE})
    assert not single_writer("s3a://lake/bw", {"spark.delta.logStore.class": MULTI_WRITER_S3_LOG_STORE})
    # Set for another scheme only: s3a's log store is still the single-driver one.
    assert single_writer("s3a://lake/bw", {"spark.delta.logStore.s3.impl": MULTI_WRITER_S3_LOG_STORE})
    # The scheme's own setting wins over the one for every scheme.
    both = {
        "spark.delta.logStore.s3a.impl": "io.delta.storage.S3SingleDriverLogStore",
        "spark.delta.logStore.class": MULTI_WRITER_S3_LOG_STORE,
    }
    assert single_writer("s3a://lake/bw", both)


def test_the_settings_asked_for_are_the_scheme_s_then_every_scheme_s() -> None:
    assert log_store_keys("s3a://lake") == ("spark.delta.logStore.s3a.impl", "spark.delta.logStore.class")
    assert log_store_keys("/tmp/lake") == ()
