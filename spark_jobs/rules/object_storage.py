"""Whether a warehouse allows one writing application per Delta table at a time.

Delta commits a version by creating its log file only if it does not exist yet. On S3, Hadoop's
file system gives no atomic way to do that, so Delta's default log store for `s3://`, `s3a://` and
`s3n://` (`S3SingleDriverLogStore`) makes commits exclusive only inside one Spark driver: two
applications committing to one table at once can both write a version, and one commit is lost.
Delta's DynamoDB log store lifts that; local disks, HDFS, GCS and ADLS create files atomically
(docs/lakehouse.md, "On object storage").
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import urlsplit

S3_SCHEMES = frozenset({"s3", "s3a", "s3n"})
# delta-storage-s3-dynamodb's log store: commits made exclusive across applications by DynamoDB.
MULTI_WRITER_S3_LOG_STORE = "io.delta.storage.S3DynamoDBLogStore"
# Delta's settings that choose a log store: per scheme, then for every scheme.
ANY_SCHEME_LOG_STORE = "spark.delta.logStore.class"


def log_store_keys(path: str) -> tuple[str, ...]:
    """The Spark settings that may name the log store of `path`'s scheme, the more specific first."""
    scheme = urlsplit(path).scheme.lower()
    return (f"spark.delta.logStore.{scheme}.impl", ANY_SCHEME_LOG_STORE) if scheme else ()


def single_writer(path: str, conf: Mapping[str, str]) -> bool:
    """True when the tables under `path` take one writing application at a time: on S3 with a log
    store other than the DynamoDB one. `conf`: the session's settings (those of `log_store_keys`
    suffice)."""
    if urlsplit(path).scheme.lower() not in S3_SCHEMES:
        return False
    store = next((conf[k] for k in log_store_keys(path) if conf.get(k)), "")
    return store.strip() != MULTI_WRITER_S3_LOG_STORE
