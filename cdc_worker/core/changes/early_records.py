"""Which spooled records of a streamed transaction may reach Kafka before its commit.

Under exactly-once a streamed transaction's changes are produced while it runs, into a Kafka
transaction of their own that its commit commits (`shell.stream.early_streams`). The native producer
takes the change and skip records (`spool_records`) of relations it has a topic for; a record it
stops at is judged here: a Relation is kept for the commit (the main assembler learns it then, as
it does from the spool); a change of a relation without a topic yet needs one; anything else makes
the transaction wait for its commit after all, published from its spool as before: what it says
needs the commit (a TRUNCATE's or logical message's control event, a change refused under
`--on-error`, a re-snapshot's key texts).
"""

from __future__ import annotations

from typing import NamedTuple

from cdc_worker.core.changes.spool_records import CHANGE, ENCODING_ERROR, FATAL, MESSAGE
from cdc_worker.core.pgoutput.messages import MessageType

_RELATION = MessageType.RELATION.value
_TRUNCATE = MessageType.TRUNCATE.value
_LOGICAL = MessageType.MESSAGE.value
# A change record's head: kind, op, relation OID, key, value and unchanged lengths, key text count.
_KEY_TEXTS = slice(16, 18)


class KeptRelation(NamedTuple):
    """A Relation record: kept for the commit; the topics known so far may have changed."""


class NeedsTopic(NamedTuple):
    """A change of a relation the producer has no topic for yet."""

    relation_oid: int


class WaitForCommit(NamedTuple):
    """Why the transaction must be published at its commit after all."""

    reason: str


Verdict = KeptRelation | NeedsTopic | WaitForCommit


def judge(record: bytes) -> Verdict:
    """The verdict on a record the native producer did not take."""
    kind = record[0] if record else -1
    if kind == CHANGE:
        if int.from_bytes(record[_KEY_TEXTS], "big", signed=True) >= 0:
            return WaitForCommit("its changes carry key texts for a re-snapshot")
        return NeedsTopic(int.from_bytes(record[2:6], "big"))
    if kind == MESSAGE and len(record) > 1:
        inner = record[1]
        if inner == _RELATION:
            return KeptRelation()
        if inner == _TRUNCATE:
            return WaitForCommit("it holds a TRUNCATE, whose control event needs the commit's LSN")
        if inner == _LOGICAL:
            return WaitForCommit("it holds a logical message (a DDL or a signal), handled at the commit")
    if kind == ENCODING_ERROR:
        return WaitForCommit("a change could not be encoded (reported under --on-error at the commit)")
    if kind == FATAL:
        return WaitForCommit("a message could not be assembled (raised at the commit)")
    return WaitForCommit(f"a spool record of kind {record[:1]!r}")
