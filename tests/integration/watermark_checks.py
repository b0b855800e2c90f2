"""Checks of the source watermarks (spark_jobs/rules/watermark.py) against Postgres, for the lakehouse tests.

A transaction's commit LSN is read from Postgres's own WAL (pg_walinspect: the COMMIT record of its
xid), not from the lake, so that a watermark is checked against the source: a version whose mark is W
must hold every transaction committed at or before W."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import psycopg2
from psycopg2 import sql

from spark_jobs.rules.watermark import Mark, Version


@dataclass(frozen=True)
class Committed:
    """One transaction of a test's workload and the LSN of its COMMIT record in Postgres's WAL (what
    the worker's `bw.lsn` carries)."""

    xid: int
    commit_lsn: int


def commit_transaction(
    dsn: str, *statements: sql.Composable | tuple[sql.Composable, tuple[object, ...]]
) -> Committed:
    """Runs `statements` in one transaction and returns its commit LSN, from the WAL (pg_walinspect,
    installed in the test's database; the stack connects as a superuser)."""
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        cur.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        conn.commit()
        for statement in statements:
            if isinstance(statement, tuple):
                cur.execute(*statement)
            else:
                cur.execute(statement)
        cur.execute("SELECT txid_current(), pg_current_wal_insert_lsn() - '0/0'::pg_lsn")
        row = cur.fetchone()
        assert row is not None
        xid, before = int(row[0]) & 0xFFFFFFFF, int(row[1])
        conn.commit()
        # The record of the commit lies after the insert position read inside the transaction.
        cur.execute(
            "SELECT start_lsn - '0/0'::pg_lsn FROM pg_get_wal_records_info("
            "    '0/0'::pg_lsn + %s::numeric, pg_current_wal_flush_lsn()) "
            "WHERE resource_manager = 'Transaction' AND record_type LIKE 'COMMIT%%' AND xid = %s",
            (before, xid),
        )
        found = cur.fetchall()
    assert len(found) == 1, f"no single COMMIT record of xid {xid} after {before}: {found}"
    return Committed(xid, int(found[0][0]))


def assert_never_back(marks: Sequence[Mark], what: str) -> None:
    """Neither position of a sequence of marks (oldest first) ever goes back."""
    for before, after in zip(marks, marks[1:], strict=False):
        assert after.watermark >= before.watermark and after.applied >= before.applied, (
            f"{what}: the mark went back from {before} to {after}"
        )


def claimed(
    versions: Iterable[Version], transactions: Sequence[Committed]
) -> list[tuple[Version, list[int]]]:
    """Each version (the newest of each distinct mark) with the indexes of the transactions its
    watermark claims (commit LSN <= W), for the versions that claim at least one."""
    newest: dict[Mark, Version] = {}
    for version in versions:
        newest[version.mark] = version
    out = []
    for version in sorted(newest.values(), key=lambda v: v.version):
        indexes = [i for i, t in enumerate(transactions) if t.commit_lsn <= version.mark.watermark]
        if indexes:
            out.append((version, indexes))
    return out
