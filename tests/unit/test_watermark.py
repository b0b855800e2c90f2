"""The watermark's pure logic (spark_jobs.rules.watermark): proofs from progress events and end offsets,
marks that never go back, and the common position of several tables."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime

from kafka_contract import control
from spark_jobs.rules.watermark import (
    NO_POSITION,
    START,
    IdleMark,
    Mark,
    Progress,
    ProgressLog,
    TableVersions,
    Version,
    applied_position,
    by_table,
    common_watermark,
    idle_metadata,
    newer,
    newest_mark,
    parse_idle,
    parse_mark,
    progress_of,
    readable_at,
    spark_end_offsets,
    table_control_position,
    table_key,
    tail_base,
    warehouse_of,
    with_idle,
)

T, C = "accounts", "bottledwater.control"


def test_a_progress_event_is_proven_once_every_partition_of_the_table_reached_its_bound() -> None:
    event = Progress(100, {(T, 0): 10, (T, 1): 5, (C, 0): 3, ("other", 0): 99})
    assert not event.proven({(T, 0): 10, (T, 1): 4, (C, 0): 3}, (T, C))
    assert not event.proven({(T, 0): 10, (T, 1): 5}, (T, C))  # the control topic not read that far
    # Another table's topic is not this table's concern.
    assert event.proven({(T, 0): 10, (T, 1): 5, (C, 0): 3}, (T, C))
    assert event.proven({(T, 0): 11, (T, 1): 7, (C, 0): 30}, (T, C))


def test_a_partition_with_nothing_below_its_bound_or_not_listed_needs_nothing() -> None:
    # Bound 0: the partition held nothing when the bound was taken; not listed: it did not exist.
    event = Progress(100, {(T, 0): 0, (C, 0): 2})
    assert event.proven({(C, 0): 2}, (T, C))
    assert event.proven({(C, 0): 2, (T, 5): 0}, (T, C))


def test_the_log_proves_the_newest_event_it_can_and_keeps_the_others_for_later_batches() -> None:
    log = ProgressLog()
    log.add([Progress(100, {(T, 0): 10}), Progress(200, {(T, 0): 20}), Progress(300, {(T, 0): 30})])
    assert log.proven({(T, 0): 5}, (T,)) is None
    assert log.proven({(T, 0): 25}, (T,)) == Progress(200, {(T, 0): 20})
    # A partition read out of step (a later batch reaches further) proves more, from the same log.
    assert log.proven({(T, 0): 30}, (T,)) == Progress(300, {(T, 0): 30})
    log.forget_through(200)
    assert len(log) == 1


def test_a_mark_never_goes_back_under_replays_and_restored_checkpoints() -> None:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    mark = START.advanced(proven=Progress(200, {}, at), batch_applied=180)
    assert mark == Mark(200, 180, 1_767_225_600_000_000)
    # A restored older checkpoint replays older batches: less proven, older changes.
    replayed = mark.advanced(proven=Progress(100, {}), batch_applied=90)
    assert replayed == mark
    assert mark.advanced(proven=None, batch_applied=None) == mark
    assert mark.advanced(proven=Progress(300, {}), batch_applied=None) == Mark(300, 180)


def test_a_later_proof_of_the_same_watermark_refreshes_only_when_it_was_proven() -> None:
    """An idle source: the worker proves the same position again, later; the mark keeps its
    positions and takes the later time, never an earlier one, and a position proven further
    always takes its own time."""
    first, later = datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 1, 1, 0, 0, 30, tzinfo=UTC)
    mark = START.advanced(Progress(200, {}, first), batch_applied=180)
    refreshed = mark.advanced(Progress(200, {}, later), batch_applied=None)
    assert refreshed == Mark(200, 180, mark.at + 30_000_000) and refreshed.same_positions(mark)
    assert refreshed.advanced(Progress(200, {}, first), None) == refreshed  # an older repeat
    assert refreshed.advanced(Progress(200, {}), None) == refreshed  # a repeat without a time
    assert refreshed.advanced(Progress(150, {}, later), None) == refreshed  # less proven
    assert Mark(200, 180).advanced(Progress(200, {}, later), None).at == refreshed.at
    moved = refreshed.advanced(Progress(300, {}, first), None)
    assert moved == Mark(300, 180, mark.at) and not moved.same_positions(refreshed)
    # Of two marks of the same positions, the newer is the one proven later.
    assert newest_mark([refreshed, mark]) == refreshed and newer(mark, refreshed) == refreshed


def test_a_version_is_exact_between_its_newest_change_and_its_watermark() -> None:
    mark = Mark(watermark=300, applied=250)
    assert [mark.exact_at(p) for p in (249, 250, 300, 301)] == [False, True, True, False]
    # Changes past the watermark (a batch that read beyond what is proven): exact nowhere.
    assert not any(Mark(200, 250).exact_at(p) for p in range(150, 300, 10))


def test_snapshot_rows_stand_for_the_moment_before_the_consistent_point() -> None:
    assert applied_position(1000, "r") == 999
    assert applied_position(1000, "c") == 1000


def test_truncate_and_ddl_events_of_the_table_count_as_applied() -> None:
    records = [
        {"op": "t", "topic": T, "lsn": 50},
        {"op": "ddl", "topic": T, "lsn": 70},
        {"op": "t", "topic": "other", "lsn": 90},
        {"op": control.PROGRESS, "topic": "", "lsn": 95},
    ]
    assert table_control_position(records, T) == 70
    assert table_control_position(records, "third") is None


def test_marks_round_trip_through_commit_metadata_and_the_property() -> None:
    mark = Mark(300, 250, 17)
    assert parse_mark(mark.metadata()) == mark
    assert parse_mark(mark.property_value()) == Mark(300, 250)
    assert json.loads(mark.metadata()) == {"bottledwater": {"watermark": 300, "applied": 250, "at": 17}}
    assert parse_mark("someone else's note") is None
    assert parse_mark('{"other": 1}') is None
    assert parse_mark(None) is None


def test_progress_events_decode_from_control_records() -> None:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    record = control.progress_record(500, at, {(T, 1): 7, (C, 0): 3})
    event = progress_of(record)
    assert event == Progress(500, {(T, 1): 7, (C, 0): 3}, at)
    assert progress_of({"op": "t", "lsn": 5}) is None


def test_spark_offsets_files_give_the_batch_end_offsets() -> None:
    text = "\n".join(
        [
            "v1",
            json.dumps({"batchWatermarkMs": 0, "batchTimestampMs": 1, "conf": {}}),
            json.dumps({T: {"0": 12, "1": 3}, C: {"0": 40}}),
        ]
    )
    assert spark_end_offsets(text) == {(T, 0): 12, (T, 1): 3, (C, 0): 40}


def tables(*specs: tuple[str, list[tuple[int, int]]]) -> list[TableVersions]:
    return [
        TableVersions(name, [Version(i, Mark(w, a)) for i, (w, a) in enumerate(marks)])
        for name, marks in specs
    ]


def test_the_common_watermark_is_the_newest_position_every_table_is_exact_at() -> None:
    # (watermark, applied) per version: a's last version holds changes past what is proven.
    lake = tables(("a", [(100, 90), (200, 150), (250, 260)]), ("b", [(120, 100), (230, 190)]))
    assert common_watermark(lake) == 200
    assert readable_at(lake[0], 200) == Version(1, Mark(200, 150))
    assert readable_at(lake[1], 200) == Version(1, Mark(230, 190))
    assert readable_at(lake[0], 250) is None
    # a's [150, 200] and b's [220, 230] never meet: the newest position both serve is older.
    lake = tables(("a", [(100, 90), (200, 150), (250, 260)]), ("b", [(120, 100), (230, 220)]))
    assert common_watermark(lake) == 100
    # Time travel: the newest position at or before the one asked for.
    assert common_watermark(lake, at_most=99) is None
    assert common_watermark(lake, at_most=110) == 100


def test_an_idle_table_does_not_hold_the_common_watermark_back() -> None:
    # The idle table's newest version applied nothing since 10 and is proven up to 500.
    lake = tables(("busy", [(480, 470)]), ("idle", [(100, 10), (500, 10)]))
    assert common_watermark(lake) == 480


def test_idle_marks_round_trip_through_commit_metadata_and_are_no_table_mark() -> None:
    marks = [IdleMark("public/quiet", 4, 2, Mark(500, 10, 17)), IdleMark("s/t", 0, None, Mark(500, 3))]
    text = idle_metadata(marks)
    assert parse_idle(text) == marks
    assert parse_mark(text) is None  # a reader of a table's own marks never takes it for one
    assert parse_idle(Mark(1, 1).metadata()) == [] and parse_idle(None) == [] and parse_idle("{bad") == []
    assert table_key("s3a://lake/wh/public/quiet/") == table_key("/tmp/wh/public/quiet") == "public/quiet"


def test_an_idle_tables_marks_extend_its_versions_and_what_its_history_serves() -> None:
    busy = TableVersions("busy", [Version(7, Mark(480, 470))])
    # The idle table's own commits stop at 100; the batches since had nothing of it.
    idle = TableVersions("idle", [Version(2, Mark(100, 10))], history=(50, 100))
    assert common_watermark([busy, idle]) is None  # busy applied 470 > 100: no common position
    extended = with_idle(idle, [IdleMark("public/idle", 2, 1, Mark(500, 10, 9))])
    assert extended.versions[-1] == Version(2, Mark(500, 10, 9)) and extended.history == (50, 500)
    assert common_watermark([busy, extended]) == 480
    assert readable_at(extended, 480) == Version(2, Mark(500, 10, 9))
    # Without a history table of its own, an idle mark extends no history range.
    assert with_idle(TableVersions("m", []), [IdleMark("public/m", 0, None, Mark(9, 1))]).history is None


def test_the_newer_mark_is_the_one_proven_further() -> None:
    assert newer(Mark(100, 90), Mark(120, 10)) == Mark(120, 10)
    assert newer(Mark(100, 90), Mark(100, 95)) == Mark(100, 95)
    assert newer(Mark(100, 90), None) == Mark(100, 90)
    assert newest_mark([Mark(100, 90), Mark(120, 10), Mark(120, 5)]) == Mark(120, 10)
    assert newest_mark([]) is None


def test_idle_marks_group_by_table_in_their_order() -> None:
    a1, b, a2 = (
        IdleMark(t, v, None, Mark(w, 1)) for t, v, w in (("s/a", 1, 10), ("s/b", 4, 10), ("s/a", 1, 20))
    )
    assert by_table([a1, b, a2]) == {"s/a": [a1, a2], "s/b": [b]}
    assert warehouse_of("s3a://lake/wh/public/t/") == "s3a://lake/wh" and warehouse_of("/wh/s/t") == "/wh"


def test_a_history_table_serves_any_position_up_to_its_watermark() -> None:
    mirror_only = TableVersions("m", [Version(0, Mark(300, 250))])
    history = TableVersions("h", [Version(0, Mark(400, 410))], history=(50, 400))
    assert common_watermark([mirror_only, history]) == 300
    assert common_watermark([history]) == 400
    assert common_watermark([history], at_most=120) == 120
    assert common_watermark([history], at_most=40) is None


def test_nothing_in_common_is_none() -> None:
    assert common_watermark([]) is None
    assert common_watermark(tables(("a", [(100, 150)]))) is None
    assert NO_POSITION == 0


def simulate(seed: int) -> None:
    """Random transactions over two tables, a worker publishing progress, a merge reading partitions
    out of step in random batch sizes with replays: every mark recorded must be true."""
    rng = random.Random(seed)
    logs: dict[tuple[str, int], list[int]] = {("a", 0): [], ("a", 1): [], ("b", 0): [], (C, 0): []}
    progress: list[int] = []  # offsets of the control topic holding progress events
    events: dict[int, Progress] = {}
    lsn = 0
    committed: list[int] = []
    for _ in range(200):
        lsn += rng.randint(1, 5)
        for partition in rng.sample(sorted(p for p in logs if p[0] != C), rng.randint(1, 2)):
            logs[partition].append(lsn)
        committed.append(lsn)
        if rng.random() < 0.3:
            # Acknowledged up to a transaction some way back; bounds taken now cover it.
            acked = committed[rng.randint(max(0, len(committed) - 5), len(committed) - 1)]
            bounds = {p: len(m) for p, m in logs.items()}
            events[len(logs[(C, 0)])] = Progress(acked, bounds)
            progress.append(len(logs[(C, 0)]))
            logs[(C, 0)].append(-1)
    read = {p: 0 for p in logs}
    mark = {"a": START, "b": START}
    log = ProgressLog()
    caught_up = False
    while not caught_up:
        caught_up = all(read[p] == len(logs[p]) for p in logs)
        ends = {p: min(len(logs[p]), read[p] + rng.randint(0, 7)) for p in logs}
        if rng.random() < 0.2 and not caught_up:  # a replay from an older checkpoint
            ends = {p: max(0, e - rng.randint(0, 5)) for p, e in ends.items()}
        log.add(events[o] for o in range(len(logs[(C, 0)])) if o in events and o < ends[(C, 0)])
        for table in ("a", "b"):
            parts = [p for p in logs if p[0] == table]
            applied = max((m for p in parts for m in logs[p][: ends[p]]), default=None)
            mark[table] = mark[table].advanced(log.proven(ends, (table, C)), applied)
        read = {p: max(read[p], ends[p]) for p in logs}
        for table in ("a", "b"):
            # The claim: every change of the table at or before the watermark was read (a replay
            # applies nothing new, so the table holds everything read so far).
            for p in (p for p in logs if p[0] == table):
                assert all(m > mark[table].watermark for m in logs[p][read[p] :])
    # Once everything is read, the newest progress event is proven for both.
    assert mark["a"].watermark == mark["b"].watermark == max(e.lsn for e in events.values())


def test_random_interleavings_never_overclaim() -> None:
    for seed in range(50):
        simulate(seed)


def test_the_tail_builds_on_the_version_holding_most_and_nothing_after_the_position() -> None:
    # Versions 1..3 of a mirror, and an idle mark that carried version 3's watermark further.
    table = TableVersions(
        "t",
        [
            Version(1, Mark(100, 90)),
            Version(2, Mark(150, 180)),
            Version(3, Mark(200, 190)),
            Version(3, Mark(260, 190)),
        ],
    )
    # At 300 every version qualifies: the newest watermark, so the shortest tail.
    assert tail_base(table, 300) == Version(3, Mark(260, 190))
    # At 185 versions 2 and 3 hold a change after it (180 is fine, 190 is not): version 2.
    assert tail_base(table, 185) == Version(2, Mark(150, 180))
    assert tail_base(table, 120) == Version(1, Mark(100, 90))
    # Every version holds a change after 50: no base, the read falls back to the mirrors' marks.
    assert tail_base(table, 50) is None
