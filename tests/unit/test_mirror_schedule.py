"""The schedule of mirrors merged behind the changelog (`rules.mirror_schedule`)."""

from __future__ import annotations

from spark_jobs.rules.mirror_schedule import Pending, merge_order, must_merge


def test_the_longest_waiting_mirror_goes_first_then_the_busiest() -> None:
    tables = [
        Pending("quiet", 1),
        Pending("busy", 500),
        Pending("waited_long", 0, waiting_s=240.0),
        Pending("waited_a_bit", 3, waiting_s=12.5),
        Pending("busy_too", 500),
    ]
    assert merge_order(tables) == ["waited_long", "waited_a_bit", "busy", "busy_too", "quiet"]


def test_a_deferred_mirror_is_merged_whatever_the_budget_once_it_waited_the_maximum_lag() -> None:
    assert must_merge(300.0, 300.0)
    assert must_merge(301.0, 300.0)
    assert not must_merge(299.9, 300.0)
    # Nothing deferred: the budget decides.
    assert not must_merge(None, 0.0)
