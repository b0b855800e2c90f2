"""What a changelog commit proves (spark_jobs.rules.changelog_commit): its user metadata read back
whole, a position that never goes back, and a proof that needs every topic of the query."""

from __future__ import annotations

from datetime import UTC, datetime

from spark_jobs.merge_options import MergeOptions, decoding_of, reading_options
from spark_jobs.rules.changelog_commit import (
    ChangelogCommit,
    Decoding,
    newest_commit,
    parse_changelog_commit,
    query_topics,
)
from spark_jobs.rules.watermark import Mark, Progress, ProgressLog, epoch_micros

ENDS = {("bw.a", 0): 10, ("bw.a", 1): 4, ("bw.b", 0): 7, ("bw.bottledwater.control", 0): 3}
AT = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)


def test_a_commit_reads_back_from_its_metadata_whole() -> None:
    commit = ChangelogCommit("query-1", 42, dict(ENDS), 1000, epoch_micros(AT))
    assert parse_changelog_commit(commit.metadata()) == commit


def test_a_commit_keeps_the_topic_ids_it_read_through_its_metadata_and_its_proofs() -> None:
    ids = {"bw.a": "Q2r0qS1ZSxm9pA3x6yL8vg", "bw.b": "x1o8fKpPQk6oO5vT9m3a0w"}
    commit = ChangelogCommit("q", 3, dict(ENDS), 500, None, ids)
    assert parse_changelog_commit(commit.metadata()) == commit
    assert commit.proving(Progress(900, {}, AT)).topic_ids == ids
    # A commit written before the ids were recorded reads back with none.
    older = ChangelogCommit("q", 2, dict(ENDS), 500, None).metadata()
    assert "topic_ids" not in older
    parsed = parse_changelog_commit(older)
    assert parsed is not None and parsed.topic_ids == {}


def test_a_commit_records_how_its_records_are_decoded_without_the_registrys_credentials() -> None:
    merge = MergeOptions("/lake", "avro", "https://lake:s3cret@registry:8081/apis/ccompat/v7", "app")
    decoding = decoding_of(merge)
    assert decoding == Decoding("avro", "https://registry:8081/apis/ccompat/v7", "app")
    commit = ChangelogCommit("q", 3, dict(ENDS), 500, None, {}, decoding)
    assert "s3cret" not in commit.metadata()
    parsed = parse_changelog_commit(commit.metadata())
    assert parsed is not None and parsed.decoding == decoding
    assert commit.proving(Progress(900, {}, AT)).decoding == decoding
    # Read with what it records; what a reader gives wins (the registry with its credentials).
    assert reading_options("/lake", decoding) == MergeOptions(
        "/lake", "avro", "https://registry:8081/apis/ccompat/v7", "app"
    )
    given = reading_options("/lake", decoding, schema_registry=merge.schema_registry, topic_prefix="")
    assert (given.schema_registry, given.topic_prefix) == (merge.schema_registry, None)
    assert reading_options("/lake", None, output_format="json").output_format == "json"
    assert reading_options("/lake", None) == MergeOptions("/lake", "avro", None, None)
    # A commit written before the decoding was recorded has none.
    assert parse_changelog_commit(ChangelogCommit("q", 2, dict(ENDS)).metadata()).decoding is None  # type: ignore[union-attr]


def test_other_commits_metadata_is_not_a_changelog_commit() -> None:
    assert parse_changelog_commit(None) is None
    assert parse_changelog_commit("not json") is None
    assert parse_changelog_commit("{broken") is None
    # A mirror's mark is user metadata of the same family, not a changelog commit.
    assert parse_changelog_commit(Mark(5, 5).metadata()) is None


def test_a_proof_moves_the_position_on_and_an_older_one_never_back() -> None:
    commit = ChangelogCommit("q", 1, dict(ENDS), 500, None)
    newer = commit.proving(Progress(900, {}, AT))
    assert (newer.watermark, newer.at) == (900, epoch_micros(AT))
    assert newer.proving(Progress(700, {}, AT)) == newer
    assert newer.proving(None) == newer


def test_a_later_proof_of_the_same_position_moves_only_its_time() -> None:
    commit = ChangelogCommit("q", 1, dict(ENDS), 900, epoch_micros(AT))
    later = datetime(2026, 11, 27, 12, 0, 5, tzinfo=UTC)
    assert commit.proving(Progress(900, {}, later)).at == epoch_micros(later)
    assert commit.proving(Progress(900, {}, AT)) == commit


def test_the_proof_of_all_tables_needs_every_topic_of_the_batch() -> None:
    progress = ProgressLog()
    # The worker's bound of topic b lies past what the batch read of it: unproven for the changelog,
    # though table a alone would be proven.
    progress.add([Progress(900, {("bw.a", 0): 10, ("bw.b", 0): 8})])
    assert progress.proven(ENDS, ["bw.a"]) is not None
    assert progress.proven(ENDS, query_topics(ENDS)) is None
    progress.add([Progress(800, {("bw.a", 0): 9, ("bw.b", 0): 7, ("bw.bottledwater.control", 0): 3})])
    proven = progress.proven(ENDS, query_topics(ENDS))
    assert proven is not None and proven.lsn == 800


def test_the_newest_commit_is_the_one_with_the_newest_position() -> None:
    old = ChangelogCommit("q", 5, {}, 700, 1)
    new = ChangelogCommit("q", 4, {}, 900, 2)
    assert newest_commit([old, None, new]) == new
    assert newest_commit([]) is None
