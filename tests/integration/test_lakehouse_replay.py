"""Replays change nothing: a batch run again, a checkpoint deleted, an older checkpoint restored."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from delta.tables import DeltaTable
from psycopg2 import sql

from spark_jobs.merging.query_checkpoint import query_checkpoint
from tests.integration.conftest import unique_name
from tests.integration.lakehouse import LakeCase, assert_delta_equals_postgres, assert_same_rows, execute

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


def _everything(lake: LakeCase, name: str) -> DataFrame:
    """Data and metadata columns, materialised (a later read must not see later versions)."""
    rows = lake.spark.read.format("delta").load(lake.path(name))
    return lake.spark.createDataFrame(rows.collect(), rows.schema)


def _data_version(lake: LakeCase, name: str) -> int:
    """The newest version that wrote data. A merge may also commit the table's source watermark
    alone (`SET TBLPROPERTIES`): the worker's progress events move it on even when no change came,
    so a run over nothing new can add such a commit, and must add no other."""
    history = DeltaTable.forPath(lake.spark, lake.path(name)).history()
    data = history.where(history.operation != "SET TBLPROPERTIES").agg({"version": "max"}).head()
    return int(data[0])


def test_replayed_batches_and_reset_checkpoints_change_nothing(lake: LakeCase) -> None:
    name = unique_name("orders")
    table = sql.Identifier(name)
    execute(
        lake.dsn,
        sql.SQL("CREATE TABLE {} (id bigint PRIMARY KEY, item text, qty int)").format(table),
        sql.SQL("INSERT INTO {} SELECT i, 'item ' || i, i FROM generate_series(1, 30) i").format(table),
    )
    checkpoint = Path(query_checkpoint(lake.checkpoints))  # the one merge query's
    with lake.worker("avro", name) as worker:
        worker.wait_caught_up()
        execute(
            lake.dsn,
            sql.SQL("UPDATE {} SET qty = qty * 10 WHERE id <= 10").format(table),
            sql.SQL("DELETE FROM {} WHERE id BETWEEN 11 AND 15").format(table),
            sql.SQL("INSERT INTO {} VALUES (12, 'back again', 1)").format(table),
        )
        worker.wait_caught_up()
        lake.merge(name, max_offsets_per_trigger=40)  # several batches, so that there is a "first" one
        assert_delta_equals_postgres(lake.spark, lake.path(name), lake.dsn, name)
        first = _everything(lake, name)
        version = _data_version(lake, name)

        # 1. The last batch ran, but its commit never reached the checkpoint: Spark runs it again with
        #    the same offsets, and Delta skips the commit it already holds (same txnAppId and version).
        commits = sorted(
            (p for p in (checkpoint / "commits").iterdir() if p.name.isdigit()), key=lambda p: int(p.name)
        )
        commits[-1].unlink()
        (commits[-1].parent / f".{commits[-1].name}.crc").unlink(missing_ok=True)
        lake.merge(name)
        assert _data_version(lake, name) == version
        assert_same_rows(_everything(lake, name), first)

        # 2. The checkpoint is gone: everything is read again from the first offset; the LSN guard makes
        #    every MERGE a no-op (rows, LSNs and ops all unchanged).
        older = lake.tmp / "older-checkpoint"
        shutil.copytree(checkpoint, older)
        shutil.rmtree(checkpoint)
        lake.merge(name)
        assert_same_rows(_everything(lake, name), first)

        # 3. More changes, merged; then an older copy of the checkpoint is put back and the merge
        #    runs again over changes it has already applied, and past them.
        execute(
            lake.dsn,
            sql.SQL("DELETE FROM {} WHERE id = 1").format(table),
            sql.SQL("UPDATE {} SET item = 'changed' WHERE id = 2").format(table),
            sql.SQL("INSERT INTO {} VALUES (100, 'new', 5)").format(table),
        )
        worker.wait_caught_up()
        lake.merge(name)
        assert_delta_equals_postgres(lake.spark, lake.path(name), lake.dsn, name)
        after = _everything(lake, name)
        shutil.rmtree(checkpoint)
        shutil.copytree(older, checkpoint)
        lake.merge(name)
        assert_same_rows(_everything(lake, name), after)
    assert_delta_equals_postgres(lake.spark, lake.path(name), lake.dsn, name)
