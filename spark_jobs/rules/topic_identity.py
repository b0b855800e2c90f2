"""Which incarnation of a topic the lake read (pure, no Kafka, no Spark).

A Kafka topic deleted and created again under the same name starts its offsets over at 0, and the
lake's positions (the merge's checkpoint, the changelog's `(topic, partition, offset)`, a mirror's
tail) are offsets: a record of the new topic would be taken for the old one's record at the same
offset, or skipped as already read. Kafka gives every topic a topic id when it is created (a UUID,
KIP-516), which a recreated topic does not share; the merge records the id of every topic it reads
(its checkpoint's ledger, and every changelog commit) and refuses a topic whose id is not the one it
recorded (docs/lakehouse.md, "A topic recreated under the same name").
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from spark_jobs.errors import DataError

TopicIds = Mapping[str, str]
REBUILD_HINT = (
    "rebuild the lake from the new topics (docs/orchestration.md, 'Rebuilding after a lost slot': the "
    "reset_delta job deletes the mirrors, the changelog and the merge's checkpoint)"
)


@dataclass(frozen=True)
class Recreated:
    """`topic` now has the id `current`; the lake read it as `recorded`."""

    topic: str
    recorded: str
    current: str


class TopicRecreated(DataError):
    """A topic the lake read was deleted and created again: its offsets started over."""

    def __init__(self, changed: list[Recreated]) -> None:
        self.changed = changed
        first = changed[0]
        others = f" (and {len(changed) - 1} more topic(s))" if len(changed) > 1 else ""
        super().__init__(
            f"topic {first.topic}{others} was deleted and created again since the lake read it (Kafka "
            f"topic id {first.current}, the lake read {first.recorded}): its offsets started over, so "
            f"its records cannot continue the lake's; {REBUILD_HINT}"
        )


def recreated(recorded: TopicIds, current: TopicIds) -> list[Recreated]:
    """The topics whose current id is not the recorded one (a topic missing on either side is not
    recreated: a new topic, or one deleted and not yet back)."""
    return [
        Recreated(topic, recorded[topic], now)
        for topic, now in sorted(current.items())
        if topic in recorded and recorded[topic] != now
    ]


def check(recorded: TopicIds, current: TopicIds) -> dict[str, str]:
    """The ids to record from now on (the recorded ones and the new topics'); raises
    `TopicRecreated` when a topic is not the one recorded."""
    changed = recreated(recorded, current)
    if changed:
        raise TopicRecreated(changed)
    return {**current, **recorded}


def ledger_text(ids: TopicIds) -> str:
    """The ledger file's text (JSON, one object of topic -> id)."""
    return json.dumps({"topic_ids": dict(sorted(ids.items()))}, sort_keys=True)


def parse_ledger(text: str) -> dict[str, str]:
    """The ids a ledger file records; a file that is not one of ours is refused in one line."""
    try:
        parsed = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"the merge's topic ledger is not JSON ({exc}): delete it to record anew") from None
    ids = parsed.get("topic_ids") if isinstance(parsed, dict) else None
    if not isinstance(ids, dict):
        raise ValueError("the merge's topic ledger holds no 'topic_ids' object: delete it to record anew")
    return {str(topic): str(topic_id) for topic, topic_id in ids.items()}
