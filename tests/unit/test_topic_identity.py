"""A topic recreated under its name is told from the one the lake read by Kafka's topic id
(spark_jobs.rules.topic_identity): the ids to record, the refusal and its one line, the ledger's text."""

from __future__ import annotations

import pytest

from spark_jobs.rules import topic_identity
from spark_jobs.rules.topic_identity import Recreated, TopicRecreated

RECORDED = {"bw.people": "id-1", "bw.bottledwater.control": "id-c"}


def test_the_same_topics_and_new_ones_are_recorded() -> None:
    current = {"bw.people": "id-1", "bw.bottledwater.control": "id-c", "bw.orders": "id-2"}
    assert topic_identity.check(RECORDED, current) == current
    # A recorded topic that is gone (deleted, not yet back) keeps its id: its return is checked.
    assert topic_identity.check(RECORDED, {"bw.orders": "id-2"}) == {**RECORDED, "bw.orders": "id-2"}
    assert topic_identity.check({}, current) == current


def test_a_recreated_topic_is_refused_in_one_line_that_names_it_and_the_fix() -> None:
    current = {"bw.people": "id-9", "bw.bottledwater.control": "id-c"}
    assert topic_identity.recreated(RECORDED, current) == [Recreated("bw.people", "id-1", "id-9")]
    with pytest.raises(TopicRecreated) as raised:
        topic_identity.check(RECORDED, current)
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith("topic bw.people was deleted and created again since the lake read it")
    assert "id-9" in message and "id-1" in message and "reset_delta" in message


def test_several_recreated_topics_are_counted() -> None:
    current = {"bw.people": "id-9", "bw.bottledwater.control": "id-d"}
    with pytest.raises(TopicRecreated) as raised:
        topic_identity.check(RECORDED, current)
    assert len(raised.value.changed) == 2
    assert "(and 1 more topic(s))" in str(raised.value)


def test_the_ledger_reads_back_and_a_foreign_file_is_refused() -> None:
    assert topic_identity.parse_ledger(topic_identity.ledger_text(RECORDED)) == RECORDED
    with pytest.raises(ValueError, match="not JSON"):
        topic_identity.parse_ledger("{broken")
    with pytest.raises(ValueError, match="no 'topic_ids' object"):
        topic_identity.parse_ledger('{"other": 1}')
