"""Where the stream is: the transaction being published, as every collaborator of the session sees it."""

from __future__ import annotations

from dataclasses import dataclass

from cdc_worker.core.pgoutput.decoder import Begin


@dataclass(slots=True)
class StreamPosition:
    """The open transaction's `Begin` (a re-snapshot signal inside it needs its commit LSN, xid and
    time), its commit LSN (named in every error message), and the commit time of the oldest
    transaction not acknowledged yet (the lag metric; `Acknowledgement` clears it)."""

    begin: Begin | None = None
    commit_lsn: int = 0
    oldest_unacked_commit: float | None = None

    def began(self, begin: Begin) -> None:
        """A transaction starts being published: a Begin, or a streamed transaction's commit."""
        self.begin = begin
        self.commit_lsn = begin.final_lsn
        if self.oldest_unacked_commit is None:
            self.oldest_unacked_commit = begin.commit_ts.timestamp()
