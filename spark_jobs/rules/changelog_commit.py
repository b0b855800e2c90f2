"""What one commit of the lake's changelog proves, and reading it back (pure, no Spark).

The changelog (`spark_jobs.lake.changelog`, docs/lakehouse.md "The changelog") is one Delta table
that every batch of the merge query appends all its records to, every table topic's and the control
topic's, in one commit. That commit's user metadata is a `ChangelogCommit`: the batch, its end
offsets, and the position it proves for every table the query reads: the newest progress event
whose offset bounds the batch's end offsets reach on every one of the query's topics (the same proof
as a table's watermark, `rules.watermark`, taken for all tables at once). Once that commit is
written, every transaction committed at or before `watermark` is in the lake.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from spark_jobs.rules.watermark import METADATA_KEY, NO_POSITION, Offsets, Progress, epoch_micros

CHANGELOG_KEY = "changelog"


@dataclass(frozen=True)
class Decoding:
    """How the changelog's records are decoded, as the merge that wrote them was told: the worker's
    format (`avro` or `json`), its schema registry (without credentials: `public_url`) and its topic
    prefix. Recorded with every commit so that a reader needs nothing but the warehouse."""

    output_format: str
    schema_registry: str | None = None
    topic_prefix: str | None = None

    def fields(self) -> dict[str, str | None]:
        return {"format": self.output_format, "registry": self.schema_registry, "prefix": self.topic_prefix}


def parse_decoding(fields: object) -> Decoding | None:
    """A commit's recorded `Decoding` (None: a commit written before it was recorded)."""
    if not isinstance(fields, dict) or not isinstance(fields.get("format"), str):
        return None
    registry, prefix = fields.get("registry"), fields.get("prefix")
    return Decoding(
        fields["format"], None if registry is None else str(registry), None if prefix is None else str(prefix)
    )


@dataclass(frozen=True)
class ChangelogCommit:
    """One changelog commit: the merge query's `batch` (of the query `query`), the highest offset it
    read per topic partition (`ends`), and the position it proves (`watermark`: every transaction
    committed at or before it is in the changelog; `at`: when the worker took the offsets that proved
    it, epoch microseconds, None if unknown). A watermark never goes back from one commit to the next.
    `topic_ids`: Kafka's id of every topic the query has read (`rules.topic_identity`): the changelog's
    offsets are those topics', never a topic's recreated under the same name. `decoding`: how its
    records are decoded."""

    query: str
    batch: int
    ends: dict[tuple[str, int], int]
    watermark: int = NO_POSITION
    at: int | None = None
    topic_ids: Mapping[str, str] = field(default_factory=dict)
    decoding: Decoding | None = None

    def metadata(self) -> str:
        """The commit's user metadata (JSON; DESCRIBE HISTORY shows it)."""
        ends: dict[str, dict[str, int]] = {}
        for (topic, partition), offset in sorted(self.ends.items()):
            ends.setdefault(topic, {})[str(partition)] = offset
        fields = {
            "query": self.query,
            "batch": self.batch,
            "ends": ends,
            "watermark": self.watermark,
            "at": self.at,
        }
        if self.topic_ids:
            fields["topic_ids"] = dict(sorted(self.topic_ids.items()))
        if self.decoding is not None:
            fields["decoding"] = self.decoding.fields()
        return json.dumps({METADATA_KEY: {CHANGELOG_KEY: fields}}, sort_keys=True)

    def proving(self, proven: Progress | None) -> ChangelogCommit:
        """This commit with the position `proven` proves, when it is newer than the one it holds (a
        later proof of the same position moves `at` on)."""
        if proven is None or proven.lsn < self.watermark:
            return self
        at = None if proven.at is None else epoch_micros(proven.at)
        if proven.lsn == self.watermark and (at is None or (self.at is not None and self.at >= at)):
            return self
        return replace(self, watermark=proven.lsn, at=at)


def parse_changelog_commit(text: str | None) -> ChangelogCommit | None:
    """A changelog commit back from its user metadata (None: not one of ours)."""
    try:
        parsed = json.loads(text) if text and text.startswith("{") else None
    except ValueError:
        return None
    inner = parsed.get(METADATA_KEY) if isinstance(parsed, dict) else None
    fields = inner.get(CHANGELOG_KEY) if isinstance(inner, dict) else None
    if not isinstance(fields, dict) or "batch" not in fields:
        return None
    ends = {
        (str(topic), int(partition)): int(offset)
        for topic, partitions in (fields.get("ends") or {}).items()
        for partition, offset in partitions.items()
    }
    at = fields.get("at")
    topic_ids = fields.get("topic_ids") or {}
    return ChangelogCommit(
        str(fields.get("query", "")),
        int(fields["batch"]),
        ends,
        int(fields.get("watermark", NO_POSITION)),
        None if at is None else int(at),
        {str(topic): str(topic_id) for topic, topic_id in topic_ids.items()},
        parse_decoding(fields.get("decoding")),
    )


def newest_commit(commits: Iterable[ChangelogCommit | None]) -> ChangelogCommit | None:
    """The commit with the newest watermark (ties: the latest proof), None of none."""
    found = [c for c in commits if c is not None]
    return max(found, key=lambda c: (c.watermark, -1 if c.at is None else c.at), default=None)


def query_topics(ends: Offsets) -> set[str]:
    """The topics a batch read (its end offsets' topics): the ones a changelog proof must cover."""
    return {topic for topic, _ in ends}
