"""verify's settling, without Spark: the keys compared again from both sides' reads at one position,
those that agree dropped; a key's values for a lookup by key taken back from its report text."""

from __future__ import annotations

from decimal import Decimal

from spark_jobs.connections.postgres_catalog import PgColumn
from spark_jobs.connections.postgres_rows import key_lookup_types
from spark_jobs.lake.fingerprints import Comparable
from spark_jobs.verifying import compare, settle


def _pending(keys: list[str]) -> compare.Compared:
    spec = Comparable(["id", "v"], [], [], ("id",), "public", "t")
    diff = compare.TableDiff("/lake/public/t", "public.t", 3, 3)
    diff.counts = {kind: 0 for kind in compare.KINDS}
    diff.counts["different"] = len(keys)
    return compare.Compared(diff, spec, keys)


def test_keys_that_agree_at_one_position_settle_and_the_rest_are_reported_by_kind() -> None:
    pending = _pending(['{"id": 1}', '{"id": 2}', '{"id": 3}', '{"id": 4}', '{"id": 5}'])
    source = {'{"id": 1}': 10, '{"id": 2}': 20, '{"id": 3}': 30}
    lake = {'{"id": 1}': [10], '{"id": 2}': [21], '{"id": 4}': [40], '{"id": 5}': [50, 50]}
    settle.recompare(pending, source, lake, shown=20)
    # 1 agrees; 2 differs; 3 only in Postgres; 4 only in Delta; 5 held twice (and only in Delta).
    assert pending.keys == ['{"id": 2}', '{"id": 3}', '{"id": 4}', '{"id": 5}']
    diff = pending.diff
    assert diff.counts == {"missing_in_delta": 1, "extra_in_delta": 2, "different": 1, compare.DUPLICATE: 1}
    assert (diff.different, diff.missing_in_delta) == (['{"id": 2}'], ['{"id": 3}'])
    assert diff.extra_in_delta == ['{"id": 4}', '{"id": 5}']


def test_a_key_deleted_on_both_sides_meanwhile_agrees() -> None:
    pending = _pending(['{"id": 9}'])
    settle.recompare(pending, {}, {}, shown=20)
    assert pending.keys == [] and pending.diff.equal


def test_keyless_rows_settle_by_their_counts() -> None:
    spec = Comparable(["path"], [], [], (), "public", "views")
    diff = compare.TableDiff("/lake/public/views", "public.views", 2, 3, keyless=True)
    pending = compare.Compared(diff, spec, rows={7: '{"path": "/"}', 8: '{"path": "/a"}'})
    source = {"7": (2, '{"path": "/"}'), "8": (1, '{"path": "/a"}')}
    lake = {"7": (2, '{"path": "/"}')}
    settle.recompare(pending, source, lake, shown=20)
    assert pending.rows == {8: '{"path": "/a"}'}
    assert (diff.counts["missing_in_delta"], diff.missing_in_delta) == (1, ['{"path": "/a"}'])


def test_a_key_is_looked_up_by_value_only_when_its_text_gives_the_value_back() -> None:
    def column(base: str, typmod: tuple[int, int] | None = None, array: bool = False) -> PgColumn:
        return PgColumn("c", base, base, typmod, array, True)

    types = key_lookup_types([column("int8"), column("text"), column("numeric", (10, 2))])
    assert types == [int, str, Decimal]
    assert settle.key_values('{"a": 5, "b": "x", "c": "12.50"}', ["a", "b", "c"], types) == (
        5,
        "x",
        Decimal("12.50"),
    )
    assert settle.key_values('{"a": null, "b": "x", "c": "1"}', ["a", "b", "c"], types) is None
    assert key_lookup_types([column("timestamptz")]) is None
    assert key_lookup_types([column("int4", array=True)]) is None


def test_lsns_print_as_postgres_prints_them() -> None:
    assert settle.format_lsn((0x1A << 32) + 0x2B3C) == "1A/2B3C"
