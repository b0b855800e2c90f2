"""Where the Delta tables live: one per source table at `<root>/<schema>/<table>`
(docs/lakehouse.md, "Table layout")."""

from __future__ import annotations

import dagster as dg
from pydantic import Field

from spark_jobs.rules import layout, mirror_features
from spark_jobs.rules.mirror_features import MirrorFeatures


class DeltaWarehouseResource(dg.ConfigurableResource):
    """A local path or any URI Spark can write Delta to (s3a://, abfss://, gs://)."""

    root: str = Field(description="Warehouse root path or URI.")
    checkpoint_root: str | None = Field(
        default=None, description="Streaming checkpoints of the merge; default: <root>/_checkpoints."
    )
    changelog: bool = Field(
        default=False,
        description="Keep the lake's changelog: every merge batch's records of every table in one Delta "
        'commit, before the mirrors (merge --changelog; docs/lakehouse.md, "The lake\'s changelog").',
    )
    mirror_budget_s: float | None = Field(
        default=None,
        description="With the changelog: the seconds a merge batch spends starting mirrors' merges, the "
        "others merged behind the changelog (merge --mirror-budget); None: every mirror every batch.",
    )
    mirror_features: str = Field(
        default="default",
        description="Delta table features of the mirrors created from now on (merge --mirror-features): "
        "default (column mapping, deletion vectors) or portable (every Delta reader, delta-rs included).",
    )

    def table_path(self, schema: str, table: str) -> str:
        """`schema` and `table` as the merge names them: the safe names of the table's topic."""
        return layout.TableLocation("", schema, table).path(self.root)

    def features(self) -> MirrorFeatures:
        """`mirror_features` checked (a Dagster config field cannot be a Literal): raises ValueError
        naming the choices."""
        return mirror_features.parse(self.mirror_features) or mirror_features.DEFAULT

    def checkpoints(self) -> str:
        return (self.checkpoint_root or f"{self.root.rstrip('/')}/_checkpoints").rstrip("/")
