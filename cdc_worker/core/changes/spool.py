"""A bounded local spool for streamed transactions (pgoutput protocol 2, `streaming 'on'`).

Postgres streams a transaction larger than `logical_decoding_work_mem` while it still runs; the
worker may publish none of it before its Stream Commit. Each such transaction's payloads are kept
here, in arrival order: in memory while all transactions together stay under `memory_limit` bytes,
then appended to one file per transaction under `directory` (length-prefixed records). A mark taken
before a subtransaction's first payload lets a subtransaction abort cut the spool back to it.

Files are named `bw-spool-<pid>-<xid>-*`, removed when their transaction ends, and `clean` removes
those a killed worker left behind (Postgres resends such a transaction in full after a restart).
The owner's pid is in the name because several workers may share one directory (the default one
is per machine): a worker starting up must not delete the files of another that is still running.
"""

from __future__ import annotations

import os
import struct
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

FILE_PREFIX = "bw-spool-"


def file_owner(name: str) -> int | None:
    """The pid of the worker that wrote a spool file, from its name (None for a name without one,
    such as the files of versions before the pid was added: those are removed as leftovers)."""
    parts = name[len(FILE_PREFIX) :].split("-")
    if len(parts) < 3 or not parts[0].isdigit():
        return None
    return int(parts[0])


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


_LENGTH = struct.Struct(">I")
# What one payload held in memory costs beyond its bytes (bytes object header, list slot).
PER_RECORD_OVERHEAD = 48
READ_BUFFER = 1 << 20
# A spool file is read back at the commit in blocks of whole records of about this size, each handed
# to the native producer in one call (`drain`).
FILE_BLOCK = 4 << 20
# The memory head's records handed out per list (as many as the native producer takes per call).
MEMORY_PIECE = 1 << 16

# One piece of a transaction's spool as `drain` hands it out: a list of records (the memory head),
# or a block of a spool file, whole records each behind its 4-byte big-endian length.
SpoolChunk = list[bytes] | bytes


@dataclass(frozen=True, slots=True)
class SpoolMark:
    """A position in one transaction's spool: records in memory, bytes in its file."""

    in_memory: int
    file_bytes: int


def default_spool_dir() -> Path:
    return Path(tempfile.gettempdir()) / "bottledwater-spool"


class Spool:
    """The budget and directory every spooled transaction shares."""

    def __init__(self, memory_limit: int, directory: Path | str | None = None) -> None:
        self.memory_limit = memory_limit
        self.directory = Path(directory) if directory is not None else default_spool_dir()
        self.memory_used = 0
        self.peak_memory = 0
        self.files_created = 0

    def clean(self, alive: Callable[[int], bool] | None = None) -> int:
        """Remove the spool files a previous run left (they are of no use: Postgres resends), and
        only those: a file whose owner (the pid in its name) is another live process is kept."""
        is_alive = alive or process_alive
        removed = 0
        if self.directory.is_dir():
            for path in self.directory.glob(FILE_PREFIX + "*"):
                owner = file_owner(path.name)
                if owner is not None and owner != os.getpid() and is_alive(owner):
                    continue
                path.unlink(missing_ok=True)
                removed += 1
        return removed

    def transaction(self, xid: int) -> SpooledTransaction:
        return SpooledTransaction(self, xid)

    def _take(self, size: int) -> bool:
        if self.memory_used + size > self.memory_limit:
            return False
        self.memory_used += size
        self.peak_memory = max(self.peak_memory, self.memory_used)
        return True

    def _give_back(self, size: int) -> None:
        self.memory_used -= size

    def _open_file(self, xid: int) -> tuple[BinaryIO, Path]:
        self.directory.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=f"{FILE_PREFIX}{os.getpid()}-{xid}-", dir=self.directory)
        self.files_created += 1
        return os.fdopen(fd, "w+b"), Path(name)


class SpooledTransaction:
    """One transaction's payloads in order: a memory head, then (once the budget is spent) a file.
    Once a payload went to the file, every later one does too, so that order is kept."""

    def __init__(self, spool: Spool, xid: int) -> None:
        self.spool = spool
        self.xid = xid
        self._memory: list[bytes] = []
        self._memory_bytes = 0
        self._file: BinaryIO | None = None
        self._path: Path | None = None
        self._file_bytes = 0
        # Where blocks of whole records end in the file, FILE_BLOCK bytes or more apart (`drain`).
        self._block_ends: list[int] = []

    @property
    def path(self) -> Path | None:
        return self._path

    def append(self, payload: bytes) -> None:
        if self._file is None:
            size = len(payload) + PER_RECORD_OVERHEAD
            if self.spool._take(size):
                self._memory.append(payload)
                self._memory_bytes += size
                return
            self._file, self._path = self.spool._open_file(self.xid)
        self._file.write(_LENGTH.pack(len(payload)))
        self._file.write(payload)
        self._file_bytes += _LENGTH.size + len(payload)
        ends = self._block_ends
        if self._file_bytes - (ends[-1] if ends else 0) >= FILE_BLOCK:
            ends.append(self._file_bytes)

    def mark(self) -> SpoolMark:
        return SpoolMark(len(self._memory), self._file_bytes)

    def since(self, mark: SpoolMark) -> Iterator[bytes]:
        """The payloads appended after `mark`, in order."""
        yield from self._memory[mark.in_memory :]
        if self._file is not None:
            yield from self._read_file(mark.file_bytes, self._file_bytes)

    def truncate(self, mark: SpoolMark) -> None:
        """Forget every payload appended after `mark`."""
        dropped = self._memory[mark.in_memory :]
        if dropped:
            freed = sum(len(p) for p in dropped) + PER_RECORD_OVERHEAD * len(dropped)
            del self._memory[mark.in_memory :]
            self._memory_bytes -= freed
            self.spool._give_back(freed)
        if self._file is not None:
            if mark.file_bytes == 0:
                self._close_file()
            else:
                self._file.flush()
                self._file.truncate(mark.file_bytes)
                self._file.seek(mark.file_bytes)
                self._file_bytes = mark.file_bytes
                self._block_ends = [end for end in self._block_ends if end <= mark.file_bytes]

    def __iter__(self) -> Iterator[bytes]:
        """Every payload in order; memory is handed back as the head is read."""
        memory, self._memory = self._memory, []
        self.spool._give_back(self._memory_bytes)
        self._memory_bytes = 0
        memory.reverse()
        while memory:
            yield memory.pop()
        if self._file is not None:
            yield from self._read_file(0, self._file_bytes)

    def drain(self) -> Iterator[SpoolChunk]:
        """Every record in order, in bulk: the memory head in lists of up to MEMORY_PIECE records
        (its memory handed back to the budget), then the file in blocks of whole length-prefixed
        records (`framed_records`)."""
        memory, self._memory = self._memory, []
        self.spool._give_back(self._memory_bytes)
        self._memory_bytes = 0
        # Handed out a piece at a time, each freed once used: the producer's queue fills meanwhile,
        # and the two together must not hold twice the budget.
        memory.reverse()
        while memory:
            yield _take_last(memory, MEMORY_PIECE)
        if self._file is None or self._path is None:
            return
        self._file.flush()
        ends = [end for end in self._block_ends if end < self._file_bytes] + [self._file_bytes]
        with open(self._path, "rb", buffering=0) as reader:
            start = 0
            for end in ends:
                yield reader.read(end - start)
                start = end

    def _read_file(self, start: int, end: int) -> Iterator[bytes]:
        assert self._file is not None and self._path is not None
        self._file.flush()
        with open(self._path, "rb", buffering=READ_BUFFER) as reader:
            reader.seek(start)
            position = start
            while position < end:
                (size,) = _LENGTH.unpack(reader.read(_LENGTH.size))
                yield reader.read(size)
                position += _LENGTH.size + size

    def _close_file(self) -> None:
        if self._file is not None:
            self._file.close()
        if self._path is not None:
            self._path.unlink(missing_ok=True)
        self._file = self._path = None
        self._file_bytes = 0
        self._block_ends = []

    def close(self) -> None:
        """Forget everything: memory back to the budget, the file removed."""
        self.spool._give_back(self._memory_bytes)
        self._memory = []
        self._memory_bytes = 0
        self._close_file()


def _take_last(reversed_records: list[bytes], count: int) -> list[bytes]:
    """The last `count` records of a reversed list, removed from it, in their original order."""
    piece = reversed_records[-count:]
    del reversed_records[-count:]
    piece.reverse()
    return piece


def framed_records(block: bytes, start: int = 0) -> Iterator[tuple[bytes, int]]:
    """The records of a spool file block from byte `start` on, each with the position after it."""
    position = start
    while position < len(block):
        (size,) = _LENGTH.unpack_from(block, position)
        position += _LENGTH.size + size
        yield block[position - size : position], position


def chunk_records(chunks: Iterable[SpoolChunk]) -> Iterator[bytes]:
    """The records of `drain`'s chunks, one by one, in order (the reference path's reading)."""
    for chunk in chunks:
        if isinstance(chunk, list):
            yield from chunk
        else:
            for record, _ in framed_records(chunk):
                yield record


def record_at(chunk: SpoolChunk, position: int) -> tuple[bytes, int]:
    """The record at `position` of a chunk (an index into a list, a byte offset into a block) and
    the position after it."""
    if isinstance(chunk, list):
        return chunk[position], position + 1
    return next(framed_records(chunk, position))
