"""The Delta side of a merge batch: create a mirror, add new columns, MERGE with the LSN guard.

Every table is created with the key, the source table and the topic in its properties, so the
maintenance and quality jobs need no other catalog, and with the table features `--mirror-features`
chooses (`rules.mirror_features`): by default column mapping mode `name`, so any Postgres column name
(spaces, dots, `;`) is a legal Delta column name, and deletion vectors; portable tables have neither.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from spark_jobs.errors import DataError
from spark_jobs.lake import local_log
from spark_jobs.rules import mirror_features
from spark_jobs.rules.mirror_features import PORTABLE, MirrorFeatures
from spark_jobs.rules.names import delta_path, quote

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import DataType, StructType

log = logging.getLogger(__name__)

TXN_APP_ID_CONF = "spark.databricks.delta.write.txnAppId"
TXN_VERSION_CONF = "spark.databricks.delta.write.txnVersion"
MERGE_DELETION_VECTORS_CONF = "spark.databricks.delta.merge.deletionVectors.persistent"
# Below this size a MERGE rewrites the files it touches instead of writing deletion vectors: the
# vectors' own Spark jobs cost about a second here (19 jobs instead of 12 for a one-row MERGE into a
# 100-row mirror), more than copying a few MiB (docs/lakehouse.md, "Small tables are merged by copy").
SMALL_TABLE_BYTES = 8 << 20
DELETION_VECTORS = mirror_features.DELETION_VECTORS
# Delta keeps the (appId, version) of idempotent writes this long; a replay is a restart, so a week
# is ample, and it stops the per-batch app ids from piling up in the table state.
TXN_RETENTION = "interval 7 days"
TXN_RETENTION_PROPERTY = "delta.setTransactionRetentionDuration"
_PROPERTY_VALUE = re.compile(r"[0-9/]+")


TYPE_WIDENING = "delta.enableTypeWidening"


class SchemaEvolutionError(DataError):
    """A source column changed type in a way a Delta column cannot follow."""


class PortableNameError(SchemaEvolutionError):
    """A column name a table without column mapping (`--mirror-features portable`) cannot hold."""


@dataclass(frozen=True)
class Txn:
    """Delta's idempotent-write marker: a commit with an (app id, version) already seen is skipped."""

    app_id: str
    version: int


def table_exists(spark: SparkSession, path: str) -> bool:
    """Whether `path` holds a Delta table: a local table's commit files (`local_log`), else Delta."""
    from delta.tables import DeltaTable

    if local_log.commit_versions(path):
        return True
    return bool(DeltaTable.isDeltaTable(spark, path))


def read_table(spark: SparkSession, path: str) -> DataFrame | None:
    """The table at `path` as a DataFrame, None when `path` holds none: the one way the jobs read a
    table that may not be there yet (tombstones, a DDL log, a changelog)."""
    if not table_exists(spark, path):
        return None
    return spark.read.format("delta").load(path)


def table_properties(spark: SparkSession, path: str) -> dict[str, str]:
    """The table's properties: a local table's newest metadata in its commit files (`local_log`, no
    JVM), else its newest snapshot's (`DeltaLog.update`: a listing of `_delta_log` and the log
    replay Delta caches per table), about 30x cheaper than `detail()`, which also sizes every file
    with a Spark job (the merge reads them for every table of every batch). `detail()` where the
    internal API is not there (another Delta version), and for a path that holds no table (its
    error names the path)."""
    from delta.tables import DeltaTable
    from py4j.protocol import Py4JError

    metadata = local_log.newest_metadata(path)
    if metadata is not None:
        return {str(k): str(v) for k, v in (metadata.get("configuration") or {}).items()}
    jvm: Any = spark._jvm
    try:
        snapshot = _newest_snapshot(spark, path)
        if int(snapshot.version()) >= 0:
            configuration = snapshot.metadata().configuration()
            return dict(jvm.scala.jdk.javaapi.CollectionConverters.asJava(configuration))
    except Py4JError:
        log.debug("DeltaLog.update is not callable here: table properties through detail()")
    row = DeltaTable.forPath(spark, path).detail().select("properties").head()
    return dict(row[0]) if row is not None and row[0] else {}


def column_names_at(spark: SparkSession, path: str, version: int) -> list[str]:
    """The table's column names as of `version`: a local table's from its log files (`local_log`, no
    JVM), else from the version's schema as Delta resolves it."""
    local = local_log.column_names_at(path, version)
    if local is not None:
        return local
    return list(spark.read.format("delta").option("versionAsOf", version).load(path).columns)


def _newest_snapshot(spark: SparkSession, path: str) -> Any:
    """The table's newest Delta snapshot (JVM), through `DeltaLog.update`: a listing of `_delta_log`
    and the log replay Delta caches per table, no Spark job. Raises Py4JError where the internal API
    is not there (another Delta version)."""
    jvm: Any = spark._jvm
    log_ = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, path)
    return log_.update(False, jvm.scala.Option.empty(), jvm.scala.Option.empty())


def commit_metadata(spark: SparkSession, path: str, limit: int | None = None) -> list[tuple[int, str]]:
    """(version, user metadata) of a table's commits that carry some, oldest first (among the newest
    `limit`, if given): its commit files on a local file system (`local_log`), else Delta's history;
    none when `path` holds no table."""
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    local = local_log.commits_with_metadata(path, limit)
    if local is not None:
        return local
    if newest_version(spark, path) < 0:
        return []
    rows = (
        DeltaTable.forPath(spark, path)
        .history(limit)
        .where(F.col("userMetadata").isNotNull())
        .select("version", "userMetadata")
        .collect()
    )
    return sorted((int(row["version"]), str(row["userMetadata"])) for row in rows)


def newest_version(spark: SparkSession, path: str) -> int:
    """The table's newest version, -1 when `path` holds no table (a local table's newest commit file,
    else Delta's snapshot, no Spark job; `DeltaTable.history(1)` where the internal API is not
    there)."""
    from delta.tables import DeltaTable
    from py4j.protocol import Py4JError

    local = local_log.commit_versions(path)
    if local:
        return local[-1]
    try:
        return int(_newest_snapshot(spark, path).version())
    except Py4JError:
        if not table_exists(spark, path):
            return -1
        row = DeltaTable.forPath(spark, path).history(1).select("version").head()
        return -1 if row is None else int(row[0])


def size_bytes(spark: SparkSession, path: str) -> int | None:
    """The table's size as its newest version's checksum file records it (no Spark job); None when
    there is no checksum (another Delta version, or a table written without one)."""
    from py4j.protocol import Py4JError

    try:
        checksum = _newest_snapshot(spark, path).checksumOpt()
        return int(checksum.get().tableSizeBytes()) if checksum.isDefined() else None
    except Py4JError:
        log.debug("the checksum of %s is not readable here", path)
        return None


class deletion_vector_writes:  # a context manager, like `idempotent`
    """Whether the MERGEs inside write deletion vectors (on a table that has them enabled) or copy
    the rows of the files they touch: vectors for a table of `SMALL_TABLE_BYTES` or more (or of
    unknown size), copies below. Always restored after, since the session may be shared."""

    def __init__(self, spark: SparkSession, path: str) -> None:
        self.spark = spark
        size = size_bytes(spark, path)
        self.enabled = size is None or size >= SMALL_TABLE_BYTES
        self._before: str | None = None

    def __enter__(self) -> None:
        self._before = self.spark.conf.get(MERGE_DELETION_VECTORS_CONF, None)
        self.spark.conf.set(MERGE_DELETION_VECTORS_CONF, str(self.enabled).lower())

    def __exit__(self, *_: object) -> None:
        if self._before is None:
            self.spark.conf.unset(MERGE_DELETION_VECTORS_CONF)
        else:
            self.spark.conf.set(MERGE_DELETION_VECTORS_CONF, self._before)


def create_table(
    spark: SparkSession,
    path: str,
    schema: StructType,
    properties: Mapping[str, str],
    features: MirrorFeatures = mirror_features.DEFAULT,
) -> None:
    """Create the table if `path` holds none, with the table features of `features` (`properties`
    win, so a caller may still say `delta.enableDeletionVectors`). A portable table refuses, in one
    line, column names only column mapping can hold (`PortableNameError`)."""
    from delta.tables import DeltaTable

    if table_exists(spark, path):
        return
    if features == mirror_features.PORTABLE:
        invalid = mirror_features.invalid_names(schema.fieldNames())
        if invalid:
            raise PortableNameError(mirror_features.invalid_names_message(path, invalid))
    created = {
        **mirror_features.creation_properties(features),
        TXN_RETENTION_PROPERTY: TXN_RETENTION,
        **properties,
    }
    builder = DeltaTable.createIfNotExists(spark).location(path).addColumns(schema)
    for key, value in created.items():
        builder = builder.property(key, value)
    builder.execute()


def add_missing_columns(
    spark: SparkSession,
    path: str,
    wanted: Sequence[tuple[str, DataType]],
    properties: Mapping[str, str] | None = None,
) -> list[str]:
    """ALTER TABLE ADD COLUMNS for source columns the table lacks; widen a column whose source type
    grew (int -> bigint, real -> double precision, a wider numeric) with Delta's type widening;
    refuse other type changes. Returns the names of the columns added. `properties`: the table's,
    when the caller read them already (None: read here if the schema changes)."""
    current = {f.name: f.dataType for f in spark.read.format("delta").load(path).schema.fields}
    missing = [(name, data_type) for name, data_type in wanted if name not in current]
    changing = bool(missing) or any(n in current and current[n] != t for n, t in wanted)
    # The properties are read only when the schema changes: nothing more per batch otherwise.
    if changing and properties is None:
        properties = table_properties(spark, path)
    portable = changing and mirror_features.of_table(properties or {}) == PORTABLE
    if portable and missing:
        invalid = mirror_features.invalid_names(name for name, _ in missing)
        if invalid:
            raise PortableNameError(mirror_features.invalid_names_message(path, invalid))
    widened = []
    for name, data_type in wanted:
        if name not in current or fits(data_type, current[name]):
            continue
        if not fits(current[name], data_type):
            raise SchemaEvolutionError(
                f"column {name!r} of {path} is {current[name].simpleString()} in Delta but "
                f"{data_type.simpleString()} in the source: only widening type changes are followed; "
                "this one needs the Delta table rebuilt (drop it and its checkpoint, then re-snapshot)"
            )
        widened.append((name, data_type))
    if widened and portable:
        _rewrite_widened(spark, path, widened, current)
    elif widened:
        # Old files keep their narrower type and are read as the wider one (Delta 4.0+ readers).
        spark.sql(f"ALTER TABLE {delta_path(path)} SET TBLPROPERTIES ('{TYPE_WIDENING}' = 'true')")
        for name, data_type in widened:
            spark.sql(
                f"ALTER TABLE {delta_path(path)} ALTER COLUMN {quote(name)} TYPE {data_type.simpleString()}"
            )
            log.info("%s: column %s widened from %s to %s", path, name, current[name].simpleString(),
                     data_type.simpleString())  # fmt: skip
    if missing:
        spec = ", ".join(f"{quote(n)} {t.simpleString()}" for n, t in missing)
        spark.sql(f"ALTER TABLE {delta_path(path)} ADD COLUMNS ({spec})")
    return [name for name, _ in missing]


def _rewrite_widened(
    spark: SparkSession, path: str, widened: Sequence[tuple[str, DataType]], current: Mapping[str, DataType]
) -> None:
    """Widen columns of a portable table by rewriting it: Delta's type widening is a reader table
    feature (`typeWidening`) that delta-rs and polars refuse, which portable tables exist to avoid.
    Every file is copied once; the table keeps its properties and history (an overwrite commit)."""
    from pyspark.sql import functions as F

    frame = spark.read.format("delta").load(path)
    new_types = dict(widened)
    frame = frame.select(
        *[
            F.col(quote(name)).cast(new_types[name]).alias(name) if name in new_types else F.col(quote(name))
            for name in frame.columns
        ]
    )
    frame.write.format("delta").mode("overwrite").option("overwriteSchema", "true").save(path)
    log.info(
        "%s: portable table rewritten to widen %s (no type widening feature)",
        path,
        ", ".join(f"{n} {current[n].simpleString()} -> {t.simpleString()}" for n, t in widened),
    )


def fits(source: DataType, target: DataType) -> bool:
    """Whether values of `source` fit a `target` column unchanged (equal, or `target` is wider in a
    way Delta's type widening supports)."""
    from pyspark.sql.types import (
        ByteType,
        DecimalType,
        DoubleType,
        FloatType,
        IntegerType,
        LongType,
        ShortType,
    )

    if source == target:
        return True
    integral = (ByteType, ShortType, IntegerType, LongType)
    if isinstance(source, integral) and isinstance(target, integral):
        return integral.index(type(source)) < integral.index(type(target))
    if isinstance(source, FloatType) and isinstance(target, DoubleType):
        return True
    if isinstance(source, DecimalType) and isinstance(target, DecimalType):
        return (
            target.scale >= source.scale
            and target.precision - target.scale >= source.precision - source.scale
        )
    return False


def set_property(spark: SparkSession, path: str, key: str, value: str) -> None:
    """Only for the merge's own numeric properties (the value is checked, not escaped)."""
    if not _PROPERTY_VALUE.fullmatch(value) or not re.fullmatch(r"[a-zA-Z.]+", key):
        raise ValueError(f"refusing to write table property {key!r}={value!r}")
    spark.sql(f"ALTER TABLE {delta_path(path)} SET TBLPROPERTIES ('{key}' = '{value}')")


class idempotent:  # a context manager; reads as a clause: `with idempotent(spark, txn):`
    """Sets Delta's txnAppId/txnVersion for the commits inside, and always unsets them: a leftover
    version would make the next, unrelated commit of the session look like a replay and vanish."""

    def __init__(self, spark: SparkSession, txn: Txn) -> None:
        self.spark, self.txn = spark, txn

    def __enter__(self) -> None:
        self.spark.conf.set(TXN_APP_ID_CONF, self.txn.app_id)
        self.spark.conf.set(TXN_VERSION_CONF, str(self.txn.version))

    def __exit__(self, *_: object) -> None:
        self.spark.conf.unset(TXN_APP_ID_CONF)
        self.spark.conf.unset(TXN_VERSION_CONF)
