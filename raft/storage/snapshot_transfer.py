"""Chunked, resumable transfer of a snapshot file to a lagging follower.

Theory of operation
===================

The sender reads a snapshot file (raft/storage/snapshotter.py format, though any file works) and
yields :class:`SnapshotChunk` values: (offset, bytes, total size, CRC32C of the whole file).
Every chunk carries the whole file's size and checksum, so the receiver knows from any
chunk which snapshot it belongs to.

The receiver writes chunks, strictly in order, into ``<final>.<size>-<crc>.partial``. A
chunk at another offset raises :class:`ChunkOutOfOrderError` carrying the offset the
receiver wants; the sender resumes from there (after a dropped stream, or a receiver
restart: the partial file's length is the resume point). A partial file of another snapshot
is discarded when a new one starts. When the last byte arrives the receiver fsyncs the
partial file, re-reads it and checks the whole-file CRC; only then is it renamed to the
final path and the directory fsynced. A mismatch deletes the partial file and raises
:class:`SnapshotChecksumError` (the transfer restarts from offset 0). So the final path
holds either nothing or a complete, verified file: a half-installed snapshot is never
visible. The gRPC transport carries the chunks; this module does only the file side.

Threading: a sender iterator or a receiver is used by one thread at a time (file IO: the
daemon runs them off the event loop).
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterator
from dataclasses import dataclass

import google_crc32c

from .fileutil import FsyncFn, default_fsync, fsync_dir, fsync_or_die, write_all

DEFAULT_CHUNK_SIZE_BYTES = 1024 * 1024


@dataclass(frozen=True, slots=True)
class SnapshotChunk:
    offset: int
    data: bytes
    total_size: int
    whole_crc: int  # CRC32C of the whole file


class SnapshotTransferError(Exception):
    """A chunk that does not fit the transfer in progress."""


class ChunkOutOfOrderError(SnapshotTransferError):
    """The receiver wants ``expected_offset`` next; the sender should resume from it."""

    def __init__(self, expected_offset: int, got_offset: int) -> None:
        super().__init__(f"expected a chunk at offset {expected_offset}, got {got_offset}")
        self.expected_offset = expected_offset


class SnapshotChecksumError(SnapshotTransferError):
    """The assembled file does not match the sender's whole-file checksum."""


def file_crc32c(path: str, read_size_bytes: int = DEFAULT_CHUNK_SIZE_BYTES) -> tuple[int, int]:
    """(CRC32C, size in bytes) of a file, read in pieces."""
    crc = 0
    size = 0
    with open(path, "rb") as f:
        while piece := f.read(read_size_bytes):
            crc = google_crc32c.extend(crc, piece)
            size += len(piece)
    return crc, size


def read_chunks(
    path: str,
    *,
    chunk_size_bytes: int = DEFAULT_CHUNK_SIZE_BYTES,
    start_offset: int = 0,
) -> Iterator[SnapshotChunk]:
    """The sender: chunks of ``path`` from ``start_offset`` (a resume point) to the end.

    The file must not change during the transfer (snapshot files never do: they are
    written once, atomically).
    """
    if chunk_size_bytes < 1:
        raise ValueError("chunk_size_bytes must be positive")
    whole_crc, total_size = file_crc32c(path)
    if not 0 <= start_offset <= total_size:
        raise ValueError(f"resume offset {start_offset} outside [0, {total_size}]")
    with open(path, "rb") as f:
        f.seek(start_offset)
        offset = start_offset
        while True:
            data = f.read(chunk_size_bytes)
            if not data and (offset > 0 or total_size > 0):
                return
            yield SnapshotChunk(offset, data, total_size, whole_crc)
            offset += len(data)
            if offset >= total_size:
                return


class SnapshotReceiver:
    """Assembles one snapshot file at ``final_path`` from chunks; see the module docstring."""

    def __init__(self, final_path: str, *, fsync: FsyncFn = default_fsync) -> None:
        self._final_path = final_path
        self._directory = os.path.dirname(final_path) or "."
        self._fsync = fsync
        os.makedirs(self._directory, exist_ok=True)
        # The transfer in progress: (total size, whole crc), or None before the first chunk.
        self._identity: tuple[int, int] | None = None
        # Invariant: bytes [0, _next_offset) of the partial file are written, in order.
        self._next_offset = 0
        self._complete = False

    def _partial_path(self, total_size: int, whole_crc: int) -> str:
        return f"{self._final_path}.{total_size:x}-{whole_crc:08x}.partial"

    @property
    def complete(self) -> bool:
        """True once the verified file is at the final path."""
        return self._complete

    def resume_offset(self, total_size: int, whole_crc: int) -> int:
        """Where a transfer of the snapshot (total_size, whole_crc) should start.

        Adopts a matching partial file left by an earlier attempt (its length is the resume
        point; damage in it is caught by the final checksum) and deletes any other.
        """
        if self._identity == (total_size, whole_crc):
            return self._next_offset
        wanted = self._partial_path(total_size, whole_crc)
        for path in glob.glob(glob.escape(self._final_path) + ".*.partial"):
            if path != wanted:
                os.unlink(path)
        self._identity = (total_size, whole_crc)
        self._complete = False
        size = os.path.getsize(wanted) if os.path.exists(wanted) else 0
        self._next_offset = min(size, total_size)
        return self._next_offset

    def accept(self, chunk: SnapshotChunk) -> bool:
        """Write one chunk; returns True when the file is complete, verified and in place."""
        if self._complete and self._identity == (chunk.total_size, chunk.whole_crc):
            return True
        expected = self.resume_offset(chunk.total_size, chunk.whole_crc)
        if chunk.offset != expected:
            raise ChunkOutOfOrderError(expected, chunk.offset)
        end = chunk.offset + len(chunk.data)
        if end > chunk.total_size:
            raise SnapshotTransferError(f"chunk ends at {end}, past the size {chunk.total_size}")
        partial = self._partial_path(chunk.total_size, chunk.whole_crc)
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            write_all(fd, chunk.data, chunk.offset)
            self._next_offset = end
            if end < chunk.total_size:
                return False
            os.ftruncate(fd, end)  # an adopted partial file may have been longer
            fsync_or_die(fd, self._fsync, partial)
        finally:
            os.close(fd)
        crc, size = file_crc32c(partial)
        if (crc, size) != (chunk.whole_crc, chunk.total_size):
            os.unlink(partial)
            self._identity, self._next_offset = None, 0
            raise SnapshotChecksumError(
                f"{partial}: assembled crc {crc:08x} size {size} != sent crc "
                f"{chunk.whole_crc:08x} size {chunk.total_size}; restart from offset 0"
            )
        os.rename(partial, self._final_path)
        fsync_dir(self._directory, self._fsync)
        self._complete = True
        return True
