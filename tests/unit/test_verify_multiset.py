"""`verify`'s rules for a table without a key: rows compared as multisets, both ways, duplicates
counted; a mirror whose topic carried updates refused in one line; how the report prints both."""

from __future__ import annotations

from spark_jobs import option_parser, verify
from spark_jobs.rules.multiset import RowCount, compare, unreconcilable_reason


def test_equal_multisets_need_every_row_as_often_on_both_sides() -> None:
    diff = compare([], shown=5)
    assert diff.equal and (diff.missing_rows, diff.extra_rows) == ([], [])
    # The join hands over only the rows whose counts differ; equal counts are no difference either.
    assert compare([RowCount("a", 2, 2)], shown=5).equal


def test_surplus_is_counted_per_occurrence_in_both_directions() -> None:
    diff = compare(
        [
            RowCount('{"path": "/"}', 1, 3),  # Postgres holds it twice more
            RowCount('{"path": "/a"}', 0, 1),
            RowCount('{"path": "/b"}', 2, 1),  # a duplicate in Delta that Postgres lacks
            RowCount('{"path": "/c"}', 4, 0),
        ],
        shown=5,
    )
    assert (diff.missing_in_delta, diff.extra_in_delta) == (3, 5)
    assert diff.missing_rows == ['{"path": "/"} ×2', '{"path": "/a"}']
    assert diff.extra_rows == ['{"path": "/b"}', '{"path": "/c"} ×4']
    assert not diff.equal


def test_only_shown_rows_are_kept_but_all_are_counted() -> None:
    diff = compare([RowCount(str(i), 0, 2) for i in range(10)], shown=3)
    assert diff.missing_in_delta == 20
    assert (diff.missing_rows, diff.missing_shown) == (["0 ×2", "1 ×2", "2 ×2"], 6)


def test_an_insert_only_mirror_can_be_compared() -> None:
    assert unreconcilable_reason({}) is None  # an empty mirror
    assert unreconcilable_reason({"r": 3, "c": 10}) is None


def test_a_mirror_whose_topic_carried_updates_cannot_be_compared() -> None:
    reason = unreconcilable_reason({"r": 3, "c": 10, "u": 2})
    assert reason is not None
    assert "2 update event(s)" in reason and "primary key" in reason and "\n" not in reason
    # An op this code does not know is not taken for an insert.
    unknown = unreconcilable_reason({"c": 1, "x": 1})
    assert unknown is not None and "1 'x' event(s)" in unknown


def test_the_report_of_a_table_that_cannot_be_verified_is_one_line() -> None:
    reason = unreconcilable_reason({"c": 1, "u": 1})
    diff = verify.TableDiff("/lake/public/v", "public.v", 2, keyless=True, unreconcilable=reason)
    assert not diff.equal
    text = verify.report(diff)
    assert text.startswith("public.v (/lake/public/v): CANNOT VERIFY: no key") and "\n" not in text


def test_the_report_of_a_keyless_table_names_rows_and_why_they_may_differ() -> None:
    equal = verify.TableDiff("/l/v", "public.v", 3, 3, keyless=True, counts=dict.fromkeys(verify.KINDS, 0))
    assert verify.report(equal).endswith("(no key: compared as multisets of rows): equal")
    counts = {**dict.fromkeys(verify.KINDS, 0), "extra_in_delta": 2}
    diff = verify.TableDiff("/l/v", "public.v", 4, 2, extra_in_delta=['{"p": "/"} ×2'], counts=counts)
    diff.keyless, diff.shown_counts = True, {"extra_in_delta": 2, "missing_in_delta": 0}
    lines = verify.report(diff).splitlines()
    assert lines[0].endswith(": DIFFERENT")
    assert lines[1] == '  extra_in_delta (2): {"p": "/"} ×2'
    assert "deletes of this table are never published" in lines[2]
    # Occurrences beyond the shown rows are counted as such, not as distinct rows.
    diff.counts["extra_in_delta"] = 5
    assert verify.report(diff).splitlines()[1].endswith("×2 … and 3 more")


def test_verify_help_describes_verify() -> None:
    text = " ".join(option_parser.build_parser("verify", verify.DESCRIPTION, {}).format_help().split())
    assert "Compare every Delta mirror under --warehouse with its Postgres table" in text
    assert "without a key" in text and "Exit status 0 when every table is equal, 1 when" in text
    # On a live source the keys in flight settle: how long is an option, its default in the help.
    assert "--settle-seconds S" in text and "default 60.0" in text
    # The DSN's help is verify's own, not the quality job's.
    assert "quality" not in text and "drift" not in text
