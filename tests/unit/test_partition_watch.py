"""The stream's look for partitions attached to its roots (`Relations.check_partitions`): a root
that cannot be guarded is named once and rests before the next try; a failed look is said and the
stream goes on; a lost connection is the reconnecting stream's."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import psycopg2
import psycopg2.errors
import pytest

from cdc_worker.shell.postgres import truncate_guard
from cdc_worker.shell.stream.relations import Relations

ROOT = 16500


def watching() -> Relations:
    unused = cast(Any, None)
    relations = Relations(
        catalog=unused, assembler=unused, type_infos={}, publisher=unused, topic_prefix=None,
        publications=["bw"], watch_partitions=True,
    )  # fmt: skip
    return relations


def look(relations: Relations) -> None:
    relations._checked = float("-inf")  # the interval has passed
    relations.check_partitions()


def test_a_root_that_cannot_be_guarded_is_named_once_and_rests(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    skipped: list[frozenset[int]] = []

    def guard_new_leaves(
        conn: object, publications: Sequence[str], *, skip: frozenset[int], announce: bool
    ) -> dict[int, list[str]]:
        skipped.append(skip)
        return {} if ROOT in skip else {ROOT: ["cannot guard the partitions of public.events"]}

    monkeypatch.setattr(truncate_guard, "guard_new_leaves", guard_new_leaves)
    relations = watching()
    look(relations)
    look(relations)
    assert skipped == [frozenset(), frozenset({ROOT})], "tried again only after a rest"
    assert caplog.text.count("cannot guard the partitions of public.events") == 1


def test_a_failed_look_is_said_and_the_stream_goes_on(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def refused(*args: object, **kwargs: object) -> dict[int, list[str]]:
        raise psycopg2.errors.InsufficientPrivilege("permission denied for view pg_publication_tables")

    monkeypatch.setattr(truncate_guard, "guard_new_leaves", refused)
    look(watching())
    assert "cannot look for partitions attached to the captured tables (permission denied" in caplog.text


def test_a_lost_connection_is_left_to_the_reconnecting_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    def lost(*args: object, **kwargs: object) -> dict[int, list[str]]:
        raise psycopg2.OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(truncate_guard, "guard_new_leaves", lost)
    with pytest.raises(psycopg2.OperationalError):
        look(watching())
