"""Which Delta table features the merge's tables are created with (`--mirror-features`).

`default`: column mapping (any Postgres column name) and deletion vectors (a MERGE's cost follows its
changes), Delta protocol reader 3 / writer 7. `portable`: neither, protocol reader 1 / writer 2, so
that every Delta reader reads the tables, delta-rs' `DeltaTable.to_pyarrow_*`/`to_pandas` and polars
included (docs/lakehouse.md, "Which engines read the mirrors"); a MERGE then copies the rows of the
files it touches. A table keeps the features it was created with: the setting only chooses those of
the tables created after it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Literal

MirrorFeatures = Literal["default", "portable"]
DEFAULT: MirrorFeatures = "default"
PORTABLE: MirrorFeatures = "portable"
CHOICES: tuple[MirrorFeatures, ...] = (DEFAULT, PORTABLE)

COLUMN_MAPPING_MODE = "delta.columnMapping.mode"
DELETION_VECTORS = "delta.enableDeletionVectors"
# Delta's own check on column names without column mapping (DELTA_INVALID_CHARACTERS_IN_COLUMN_NAMES).
INVALID_NAME_CHARACTERS = " ,;{}()\n\t="


def creation_properties(features: MirrorFeatures) -> dict[str, str]:
    """The Delta properties a new table gets for `features` (the merge's own properties aside).
    Portable tables say `false`/`none` explicitly, so that a session default
    (`spark.databricks.delta.properties.defaults.*`) cannot turn either feature on."""
    if features == PORTABLE:
        return {
            COLUMN_MAPPING_MODE: "none",
            DELETION_VECTORS: "false",
            "delta.minReaderVersion": "1",
            "delta.minWriterVersion": "2",
        }
    return {
        COLUMN_MAPPING_MODE: "name",
        "delta.minReaderVersion": "2",
        "delta.minWriterVersion": "5",
        # A MERGE marks the rows it updates or deletes instead of copying the rest of their files:
        # the batch's cost follows its changes, not the size of the files they touch
        # (docs/lakehouse.md, "Deletion vectors"). Needs readers with the deletionVectors feature.
        DELETION_VECTORS: "true",
    }


def of_table(properties: Mapping[str, str]) -> MirrorFeatures:
    """The setting a table was created with, from its properties: column mapping is what a
    `default` table always has (those created before deletion vectors too) and a portable one never."""
    mode = properties.get(COLUMN_MAPPING_MODE, "none")
    return PORTABLE if mode == "none" else DEFAULT


def parse(value: str | None) -> MirrorFeatures | None:
    """A setting as a flag or variable gives it (any case, blanks ignored); None when unset.
    Raises ValueError naming the choices."""
    if value is None or not value.strip():
        return None
    text = value.strip().lower()
    for choice in CHOICES:
        if text == choice:
            return choice
    raise ValueError(f"{value!r}: expected one of {', '.join(CHOICES)}")


def invalid_names(names: Iterable[str]) -> list[str]:
    """The column names a table without column mapping cannot hold."""
    return [name for name in names if any(ch in INVALID_NAME_CHARACTERS for ch in name)]


def invalid_names_message(path: str, names: Iterable[str]) -> str:
    """One line: the columns a portable table cannot hold, and the two ways out."""
    shown = ", ".join(repr(n) for n in names)
    return (
        f"{path}: column(s) {shown} hold one of {INVALID_NAME_CHARACTERS!r}, which a Delta table "
        "without column mapping cannot: merge this table with --mirror-features default, or rename "
        "the column(s) in Postgres"
    )


def kept_message(path: str, created: MirrorFeatures, wanted: MirrorFeatures) -> str:
    """One line: a table created with another setting keeps it, and how to change it."""
    return (
        f"{path} was created with --mirror-features {created} and keeps it (asked: {wanted}): "
        f"to change it, rebuild the mirror (python -m spark_jobs.rebuild --table <schema.table> "
        f"--mirror-features {wanted})"
    )
