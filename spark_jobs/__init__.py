"""PySpark jobs of the lakehouse half (docs/lakehouse.md): each a `main()` for spark-submit and plain
functions for Dagster and tests.

The jobs stand at the top: `merge` (Kafka changelogs -> Delta mirrors), `maintenance`
(OPTIMIZE/VACUUM), `quality` (checks returning `CheckResult`), `verify` (Postgres vs Delta,
differing keys), `consistent_read` (several mirrors at one source position), `rebuild` (a mirror
from the changelog). Their parts, in layers (docs/architecture.md draws them):

- `reading`: the read side beside the jobs, several mirrors at one source position (each mirror
  plus its changelog tail, when the lake keeps a changelog) and the read as SQL views;
- `verifying`: verify's parts, a mirror against its Postgres table and the differing keys settled;
- `merging`: the merge itself, one query's batches and one table's slice of them;
- the lake's settings: every option in one table (`option_table`, its terms `options`), the CLIs
  built from it (`option_parser`) and what a merge or a read is given (`merge_options`);
- `decoding`: Kafka records -> typed rows with Spark's built-in expressions;
- `lake`: the lake's state as Delta holds it (tables, marks, fingerprints);
- `connections`: Kafka, the schema registry and Postgres (the SparkSession is built by
  `shared_connections`, which the worker shares);
- `rules`: the pure rules the others apply (layout, names, watermark, changes, key range, row hash).

A job run as a script (`spark-submit spark_jobs/merge.py`) puts this folder first on sys.path, so no
name at this level may be a standard library's or a dependency's (hence `connections`, not `io`).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from collections.abc import Sequence
from types import ModuleType

# Modules that moved when the package took its layers, by their old name. Users import from
# `spark_jobs.lakehouse`; the old modules that held its names (the session, at both its old places,
# and the merge's options) still import, with a DeprecationWarning; every other old name is refused
# with its new one. A name under SHARED_PACKAGE left this package for the one the worker shares.
MOVED_MODULES = {
    "batch_columns": "merging.batch_columns",
    "batch_schema": "merging.batch_schema",
    "changes": "rules.changes",
    "consistent_views": "reading.views",
    "ddl": "merging.ddl",
    "delta_tables": "lake.delta_tables",
    "dsn": "connections.dsn",
    "fingerprints": "lake.fingerprints",
    "kafka_client": "connections.kafka_client",
    "kafka_source": "connections.kafka_source",
    "key_range": "rules.key_range",
    "layout": "rules.layout",
    "merge_batch": "merging.merge_batch",
    "merge_query": "merging.merge_query",
    "merging.changelog_tail": "reading.changelog_tail",
    "names": "rules.names",
    "native_decode": "decoding.spark_decode",
    "native_records": "decoding.spark_envelope",
    "native_values": "decoding.spark_values",
    "parked": "merging.parked",
    "postgres_catalog": "connections.postgres_catalog",
    "postgres_connect": "connections.postgres_connect",
    "postgres_rows": "connections.postgres_rows",
    "query_checkpoint": "merging.query_checkpoint",
    "registry": "connections.registry",
    "rowhash": "rules.rowhash",
    "session": "shared_connections.spark_session",
    "connections.session": "shared_connections.spark_session",
    "connections.jvm_names": "shared_connections.jvm_names",
    "spark_types": "decoding.spark_types",
    "truncates": "merging.truncates",
    "warehouse": "lake.warehouse",
    "watermark": "rules.watermark",
    "watermark_io": "lake.watermark_io",
}
KEPT_MODULES = frozenset({"session", "connections.session", "merge_batch"})
SHARED_PACKAGE = "shared_connections"


def _new_name(moved: str) -> str:
    return moved if moved.partition(".")[0] == SHARED_PACKAGE else f"{__name__}.{moved}"


class _Alias(importlib.abc.Loader):
    """Loads an old name as the module that moved (the same module object, not a copy)."""

    def __init__(self, old: str, new: str) -> None:
        self.old, self.new = old, new

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        warnings.warn(
            f"{self.old} moved: import from spark_jobs.lakehouse (docs/lakehouse.md, 'Python API')",
            DeprecationWarning,
            stacklevel=2,
        )
        return importlib.import_module(self.new)

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the module it names ran when it was imported."""


class _MovedModules(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        package, _, name = fullname.partition(".")
        if package != __name__ or name not in MOVED_MODULES:
            return None
        new = _new_name(MOVED_MODULES[name])
        if name not in KEPT_MODULES:
            raise ModuleNotFoundError(
                f"{fullname} moved to {new}, which is internal: import the lake's names from "
                "spark_jobs.lakehouse (docs/lakehouse.md, 'Python API')",
                name=fullname,
            )
        return importlib.util.spec_from_loader(fullname, _Alias(fullname, new))


if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
    sys.meta_path.append(_MovedModules())
