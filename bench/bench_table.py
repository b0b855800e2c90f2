"""The benchmark set `bench/run_benchmarks.py` runs: which benchmarks, with which arguments (at the
default, realistic size and at the `--quick` size), and which RESULT keys make each row of the table
in docs/benchmarks.md. Add a `Bench` (or a `Row` to one) here to add a row."""

from __future__ import annotations

from dataclasses import dataclass

PYTHON = ".venv/bin/python"  # how the table's commands name the interpreter


@dataclass(frozen=True)
class Figure:
    """One RESULT key shown in the table: its unit, and for a baseline what it is."""

    key: str
    unit: str
    what: str = ""


@dataclass(frozen=True)
class Row:
    """One row of the table: a figure against a baseline from the same RESULT line.

    `ratio` names the bench's own ratio key; without it the ratio is figure / baseline. `where`
    picks among several RESULT lines of one run (the last line carrying all those fields). `rule`
    is the target as `verdict` judges it, when the words the table shows are not in that form
    (the watermark's "p99 ≤ 2 intervals" is its ratio to the trigger interval, "≤ 2×")."""

    label: str
    figure: Figure
    baseline: Figure
    ratio: str | None = None
    target: str = ""
    where: tuple[tuple[str, str], ...] = ()
    rule: str = ""


@dataclass(frozen=True)
class Bench:
    """One benchmark process: its script under bench/, its arguments at the default (realistic)
    size and at the `--quick` size, and the rows its RESULT lines make."""

    name: str
    script: str
    args: tuple[str, ...]
    quick: tuple[str, ...]
    rows: tuple[Row, ...]
    section: str = ""  # the anchor of its section in docs/benchmarks.md

    def command(self, quick: bool = False) -> str:
        return " ".join([PYTHON, f"bench/{self.script}", *(self.quick if quick else self.args)])


ROWS_S, CHANGES_S = "rows/s", "changes/s"


def _lag_row(label: str, key: str = "") -> Row:
    """A watermark_lag_bench row: a lag's p99 (`lag_p99_s`, or `<key>_lag_p99_s`) against the
    trigger interval, target p99 ≤ 2 intervals."""
    prefix = f"{key}_" if key else ""
    return Row(label, Figure(f"{prefix}lag_p99_s", "s"), Figure("trigger_s", "s", "the trigger interval"),
               f"{prefix}p99_intervals", "p99 ≤ 2 intervals", rule="≤ 2×")  # fmt: skip


BENCHES: tuple[Bench, ...] = (
    Bench(
        "snapshot", "snapshot_bench.py", ("--rows", "1000000", "--producers", "native"),
        ("--rows", "50000", "--producers", "native"),
        (
            Row("Snapshot, 1M rows, Avro", Figure("native_rows_s", ROWS_S),
                Figure("pipe_rows_s", ROWS_S, "the pipe: COPY | kcat -P"), "native_vs_pipe", "≥ 0.5×"),
            Row("Snapshot against the keyed pipe", Figure("native_rows_s", ROWS_S),
                Figure("keyed_pipe_rows_s", ROWS_S, "the pipe with the contract's key and headers"),
                "native_vs_keyed_pipe"),
        ),
        "snapshot",
    ),
    Bench(
        "stream", "stream_bench.py", ("--changes", "500000"), ("--changes", "20000"),
        (
            Row("Stream, 500k changes, Avro", Figure("worker_changes_s", CHANGES_S),
                Figure("recvlogical_changes_s", CHANGES_S, "pg_recvlogical"), "worker_vs_recvlogical",
                "≥ 0.9×"),
        ),
        "stream",
    ),
    Bench(
        "delivery", "delivery_bench.py", ("--changes", "500000"), ("--changes", "20000", "--repeat", "1"),
        (
            Row("Stream exactly-once, 500k changes, Avro", Figure("eos_changes_s", CHANGES_S),
                Figure("alo_changes_s", CHANGES_S, "the same worker, at-least-once"), "eos_vs_alo",
                "≥ 0.95×"),
            Row("Stream exactly-once against pg_recvlogical", Figure("eos_changes_s", CHANGES_S),
                Figure("recvlogical_changes_s", CHANGES_S, "pg_recvlogical"), "eos_vs_recvlogical",
                "≥ 1×"),
        ),
        "exactly-once-delivery",
    ),
    Bench(
        "snapshot_eos", "snapshot_delivery_bench.py", ("--rows", "1000000"),
        ("--rows", "50000", "--repeat", "1"),
        (
            Row("Snapshot exactly-once, 1M rows in 8 tables, Avro",
                Figure("tables_exactly_once_rows_s", ROWS_S),
                Figure("tables_at_least_once_rows_s", ROWS_S, "the same worker, at-least-once"),
                "eos_vs_alo_tables", "≥ 0.9×"),
            Row("Snapshot exactly-once, 1M rows in one table, Avro",
                Figure("one_table_exactly_once_rows_s", ROWS_S),
                Figure("one_table_at_least_once_rows_s", ROWS_S, "the same worker, at-least-once"),
                "eos_vs_alo_one_table", "≥ 0.9×"),
        ),
        "exactly-once-delivery",
    ),
    Bench(
        "partitions", "partitions_bench.py", ("--rows", "1000000", "--leaves", "12"),
        ("--rows", "50000", "--leaves", "12", "--repeat", "1"),
        (
            Row("Snapshot of a partitioned table, 1M rows in 12 leaves, Avro",
                Figure("partitioned_rows_s", ROWS_S),
                Figure("plain_rows_s", ROWS_S, "the same rows in a plain table"), "partitioned_vs_plain",
                "≥ 0.9×"),
        ),
        "partitioned-tables",
    ),
    Bench(
        "stream_partitions", "stream_bench.py", ("--changes", "500000", "--leaves", "12"),
        ("--changes", "20000", "--leaves", "12"),
        (
            Row("Stream of a partitioned table, 500k changes over 12 leaves, Avro",
                Figure("worker_changes_s", CHANGES_S),
                Figure("recvlogical_changes_s", CHANGES_S, "pg_recvlogical on the same publication"),
                "worker_vs_recvlogical", "≥ 0.9×"),
        ),
        "partitioned-tables",
    ),
    *(
        Bench(
            f"stream_pg{major}", "stream_bench.py",
            ("--changes", "500000", "--postgres-version", str(major)),
            ("--changes", "20000", "--postgres-version", str(major)),
            (
                Row(f"Stream on Postgres {major}, 500k changes, Avro", Figure("worker_changes_s", CHANGES_S),
                    Figure("recvlogical_changes_s", CHANGES_S, f"pg_recvlogical of Postgres {major}"),
                    "worker_vs_recvlogical", "≥ 15's ratio"),
            ),
            "postgres-versions",
        )
        for major in (14, 16, 17, 18)
    ),
    Bench(
        "secured_kafka", "secured_kafka_bench.py", ("--rows", "1000000", "--changes", "1000000"),
        ("--rows", "50000", "--changes", "20000"),
        (
            Row("Snapshot, SASL_SSL, 3 brokers, RF 3, JSON", Figure("secured_snapshot_rows_s", ROWS_S),
                Figure("secured_pipe_rows_s", ROWS_S, "the pipe with the same security, acks=all"),
                "secured_snapshot_vs_pipe"),
            Row("Snapshot ratio to the pipe: secured against plaintext",
                Figure("secured_snapshot_vs_pipe", "×"),
                Figure("plain_snapshot_vs_pipe", "×", "the same ratio on the plaintext broker"),
                "secured_vs_plain_snapshot_ratio", "≥ 0.9×"),
            Row("Stream, SASL_SSL, 3 brokers, RF 3, JSON", Figure("secured_stream_changes_s", CHANGES_S),
                Figure("recvlogical_changes_s", CHANGES_S, "pg_recvlogical"), "secured_stream_vs_recvlogical",
                "≥ 0.9×"),
        ),
        "secured-kafka",
    ),
    Bench(
        "latency", "latency_bench.py", ("--rate", "1000", "--seconds", "10"), ("--seconds", "3"),
        (
            Row("Latency p99, 1,000 tx/s", Figure("p99_ms", "ms"),
                Figure("baseline_p99_ms", "ms", "a bare producer"), "p99_vs_baseline", "p99 < 100 ms"),
        ),
        "latency",
    ),
    Bench(
        "latency_eos", "latency_bench.py",
        ("--rate", "1000", "--seconds", "10", "--delivery", "exactly-once"),
        ("--seconds", "3", "--delivery", "exactly-once"),
        (
            Row("Latency p99 exactly-once, 1,000 tx/s, commit → visible to read_committed",
                Figure("visible_p99_ms", "ms"), Figure("baseline_p99_ms", "ms", "a bare producer"),
                "visible_p99_vs_baseline", "p99 ≤ 50 ms"),
        ),
        "exactly-once-delivery",
    ),
    Bench(
        "large_txn", "large_txn_bench.py", ("--rows", "1000000"), ("--rows", "50000"),
        (
            Row("Large transaction, 1M rows: commit → acked", Figure("streaming_commit_to_ack_s", "s"),
                Figure("protocol1_commit_to_ack_s", "s", "protocol 1, not streamed"),
                "commit_to_ack_ratio", "≤ 0.5×"),
            Row("Large transaction: streamed commit against the keyed pipe",
                Figure("streaming_commit_rows_s", ROWS_S),
                Figure("keyed_pipe_rows_s", ROWS_S, "the keyed pipe: the same rows, COPY | kcat -P -K"),
                "commit_vs_keyed_pipe", "≥ 0.8×"),
            Row("Large transaction: spilled on the server", Figure("streaming_spill_mb", "MB"),
                Figure("protocol1_spill_mb", "MB", "protocol 1, not streamed"), None, "0 MB"),
        ),
        "large-transaction",
    ),
    Bench(
        "large_txn_eos", "large_txn_bench.py", ("--rows", "1000000", "--delivery", "exactly-once"),
        ("--rows", "50000", "--delivery", "exactly-once"),
        (
            Row("Large transaction exactly-once, 1M rows: commit → visible",
                Figure("streaming_commit_to_ack_s", "s"),
                Figure("protocol1_commit_to_ack_s", "s", "protocol 1, not streamed, exactly-once"),
                "commit_to_visible_ratio", "≤ 0.2×"),
        ),
        "exactly-once-delivery",
    ),
    Bench(
        "large_txn_eos_spread", "large_txn_bench.py",
        ("--rows", "1000000", "--delivery", "exactly-once", "--statements", "10", "--pause-s", "1"),
        ("--rows", "50000", "--delivery", "exactly-once", "--statements", "2", "--pause-s", "0.5"),
        (
            Row("Large transaction exactly-once, 1M rows in 10 statements 1 s apart: commit → visible",
                Figure("streaming_commit_to_ack_s", "s"),
                Figure("protocol1_commit_to_ack_s", "s", "protocol 1, not streamed, exactly-once"),
                "commit_to_visible_ratio", "≤ 0.2×"),
        ),
        "exactly-once-delivery",
    ),
    Bench(
        "spark_snapshot", "spark_snapshot_bench.py", ("--rows", "1000000"), ("--rows", "50000"),
        (
            Row("Spark snapshot, 1M rows", Figure("spark_rows_s", ROWS_S),
                Figure("worker_rows_s", ROWS_S, "the worker's own snapshot"), "spark_vs_worker"),
        ),
        "spark-snapshot",
    ),
    Bench(
        "merge", "merge_bench.py", ("--rows", "1000000", "--large-rows", "5000000"),
        ("--rows", "20000", "--large-rows", "100000", "--freshness-seconds", "45", "--cadence-seconds", "15",
         "--continuous-seconds", "45", "--warmup-seconds", "10"),
        (
            Row("Merge's decode + append, 1M changes", Figure("native_decode_append_rows_s", ROWS_S),
                Figure("pipe_rows_s", ROWS_S, "the lake pipe: the Kafka records appended raw to Delta"),
                "decode_append_vs_pipe", "≥ 0.8×"),
            Row("Merge, 1M changes into a 5M-row mirror", Figure("merge_large_rows_s", ROWS_S),
                Figure("pipe_rows_s", ROWS_S, "the lake pipe"), "merge_large_vs_pipe", "≥ 0.5×"),
            Row("Merge, 1M changes into 1M rows", Figure("merge_rows_s", ROWS_S),
                Figure("pipe_rows_s", ROWS_S, "the lake pipe"), "merge_vs_pipe"),
            Row("Continuous-merge freshness p99, 200 changes/s", Figure("continuous_p99_s", "s"),
                Figure("freshness_p99_s", "s", "the scheduled merge every 60 s"), None, "p99 ≤ 20 s"),
        ),
        "merge",
    ),
    Bench(
        "watermark_lag", "watermark_lag_bench.py", ("--seconds", "240", "--warmup-seconds", "60"),
        ("--seconds", "45", "--warmup-seconds", "15"),
        (
            _lag_row("Common watermark lag p99, 200 changes/s, continuous merge"),
        ),
        "watermark-lag",
    ),
    Bench(
        "watermark_lag_30", "watermark_lag_bench.py",
        ("--trigger-interval", "30", "--seconds", "240", "--warmup-seconds", "60"),
        ("--trigger-interval", "30", "--seconds", "60", "--warmup-seconds", "15"),
        (
            _lag_row("Common watermark lag p99, 200 changes/s, continuous merge, 30 s trigger"),
        ),
        "watermark-lag",
    ),
    Bench(
        "watermark_lag_changelog", "watermark_lag_bench.py",
        ("--changelog", "--seconds", "240", "--warmup-seconds", "60"),
        ("--changelog", "--seconds", "45", "--warmup-seconds", "15"),
        (
            _lag_row("The lake's position lag p99 (the changelog's), 3 busy tables, 200 changes/s",
                     "changelog"),
        ),
        "watermark-lag",
    ),
    Bench(
        "watermark_lag_changelog_behind", "watermark_lag_bench.py",
        ("--changelog", "--mirror-budget", "0", "--seconds", "240", "--warmup-seconds", "60"),
        ("--changelog", "--mirror-budget", "0", "--seconds", "45", "--warmup-seconds", "15"),
        (
            _lag_row(
                "The lake's position lag p99 (the changelog's), 3 busy tables, mirrors behind (budget 0)",
                "changelog",
            ),
        ),
        "watermark-lag",
    ),
    Bench(
        "watermark_lag_changelog_200", "watermark_lag_bench.py",
        ("--changelog", "--tables", "200", "--no-history", "--seconds", "600", "--warmup-seconds", "360"),
        ("--changelog", "--tables", "20", "--no-history", "--seconds", "45", "--warmup-seconds", "15"),
        (
            _lag_row("The lake's position lag p99 (the changelog's), 200 busy tables sharing 200 changes/s",
                     "changelog"),
        ),
        "watermark-lag",
    ),
    Bench(
        "many_tables", "many_tables_bench.py", ("--tables", "200", "--legacy-tables", "20"),
        ("--tables", "20", "--legacy-tables", "5"),
        (
            Row("Merge of one transaction touching 200 tables", Figure("txn_s_per_table", "s/table"),
                Figure("legacy_s_per_table", "s/table", "a query per table, the merge before"), None,
                "≤ 0.1 s/table with start-up"),
            Row("Idle merge run over 200 tables", Figure("idle_s", "s"),
                Figure("startup_s", "s", "start-up: JVM + SparkSession"), None, "≤ 15 s"),
        ),
        "many-tables",
    ),
    Bench(
        "changelog", "changelog_bench.py", ("--changes", "1000000", "--topics", "10"),
        ("--changes", "50000", "--topics", "5", "--runs", "1", "--warmup-runs", "0"),
        (
            Row("Changelog append, 1M changes over 10 topics", Figure("changelog_s", "s"),
                Figure("pipe_s", "s", "the lake pipe: the Kafka records appended raw to Delta"),
                "changelog_vs_pipe", "≥ 0.9×"),
        ),
        "changelog",
    ),
    Bench(
        "many_tables_changelog", "many_tables_bench.py",
        ("--tables", "200", "--legacy-tables", "0", "--changelog"),
        ("--tables", "20", "--legacy-tables", "0", "--changelog"),
        (
            Row("A transaction touching 200 tables in the lake (changelog committed)",
                Figure("txn_in_changelog_s", "s"), Figure("txn_s", "s", "every mirror merged, same run"),
                None,
                "≤ 20 s"),
        ),
        "changelog",
    ),
    Bench(
        "many_tables_behind", "many_tables_bench.py",
        ("--tables", "200", "--legacy-tables", "0", "--changelog", "--mirror-budget", "5"),
        ("--tables", "20", "--legacy-tables", "0", "--changelog", "--mirror-budget", "1"),
        (
            Row("A transaction touching 200 tables in the lake, mirrors merged behind (5 s budget)",
                Figure("txn_in_changelog_s", "s"), Figure("txn_s", "s", "the run, with its budgeted mirrors"),
                None, "≤ 20 s"),
            Row("A consistent read of 200 tables through the changelog (mirror + tail), warm session",
                Figure("consistent_read_s", "s"),
                Figure("mirrors_caught_up_s", "s", "the run catching every mirror up after"), None, "≤ 5 s"),
        ),
        "changelog",
    ),
    Bench(
        "many_tables_no_flags", "many_tables_bench.py",
        ("--tables", "200", "--legacy-tables", "0", "--no-lake-flags"),
        ("--tables", "20", "--legacy-tables", "0", "--no-lake-flags"),
        (
            Row("A transaction touching 200 tables readable consistently, no lake flags (in the lake + "
                "a read given only the warehouse and the names)",
                Figure("txn_readable_s", "s"), Figure("txn_in_changelog_s", "s", "in the changelog"),
                None, "≤ 20 s"),
        ),
        "changelog",
    ),
    Bench(
        "table_floor", "table_floor_bench.py", ("--rounds", "12"), ("--rounds", "2", "--warmup", "1"),
        (
            Row("One small table's batch (1-row change, 100-row mirror)", Figure("session_s", "s"),
                Figure("plain_append_s", "s", "a plain Delta append of the same Kafka range"), None,
                "≤ 0.6 s"),
            Row("One small table's batch, Spark jobs", Figure("session_jobs", "jobs"),
                Figure("plain_append_jobs", "jobs", "a plain Delta append of the same Kafka range"), None,
                "≤ 6 jobs"),
        ),
        "table-floor",
    ),
    Bench(
        "idle_merge", "idle_merge_bench.py", ("--tables", "200", "--idle-seconds", "600"),
        ("--tables", "10", "--idle-seconds", "60", "--baseline-seconds", "10"),
        (
            Row("Idle continuous merge over 200 tables, CPU", Figure("cpu_s_per_min", "s/min"),
                Figure("idle_jvm_cpu_s_per_min", "s/min", "the same JVM with no query"), None, "≤ 3 s/min"),
            Row("Lake lag after 10 idle minutes", Figure("lag_s", "s"),
                Figure("idle_progress_interval_s", "s", "the worker's idle progress interval"), None,
                "≤ 60 s"),
        ),
        "idle-merge",
    ),
    Bench(
        "demo_freshness", "demo_freshness_bench.py", ("--probes", "40"),
        ("--probes", "5", "--warmup-seconds", "10"),
        (
            Row("The demo: a change readable consistently after its commit, p99", Figure("lag_p99_s", "s"),
                Figure("trigger_s", "s", "the continuous merge's trigger interval"), None, "≤ 20 s"),
        ),
        "demo",
    ),
    Bench(
        "rss", "rss_bench.py", ("--rows", "2000000"), ("--rows", "100000"),
        (
            Row("Memory through a 2M-row transaction", Figure("peak_rss_mb", "MB"),
                Figure("idle_rss_mb", "MB", "the worker streaming, idle"), "peak_vs_idle", "peak < 300 MB"),
        ),
        "memory",
    ),
)  # fmt: skip
