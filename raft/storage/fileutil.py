"""File helpers shared by the WAL, the snapshotter and the snapshot receiver.

Durability rules applied everywhere in ``raft/``:

- A file's contents are durable only after ``fsync`` (we use ``fdatasync`` where the file's
  size is all the metadata that matters); a new or renamed name is durable only after the
  *directory* is fsynced.
- A failed fsync is never retried. After a failure Linux may already have dropped the dirty
  pages and cleared the error, so a retry can "succeed" over lost data (the 2018 PostgreSQL
  "fsyncgate"). :func:`fsync_or_die` logs a critical message and ends the process at once;
  recovery on restart repairs or refuses the log.

The fsync function is injectable (``FsyncFn``) so tests can prove the failure path.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable

import google_crc32c

#: Flushes one open file descriptor to stable storage; raises OSError on failure.
FsyncFn = Callable[[int], None]

#: Exit status of a process stopped by a failed fsync (sysexits.h EX_IOERR).
FSYNC_FAILED_EXIT_CODE = 74

_logger = logging.getLogger(__name__)


def default_fsync(fd: int) -> None:
    """``fdatasync`` where the platform has it (Linux), else ``fsync``."""
    sync = getattr(os, "fdatasync", os.fsync)
    sync(fd)


def fsync_or_die(fd: int, fsync: FsyncFn, what: str) -> None:
    """Flush ``fd``; on failure log a critical message and stop the process immediately.

    ``what`` names the file for the message. ``os._exit`` skips every cleanup handler on
    purpose: nothing may run that could write after the kernel lost our pages.
    """
    try:
        fsync(fd)
    except OSError as exc:
        message = (
            f"fsync of {what} failed ({exc!r}); stopping now: the data cannot be trusted "
            "to be on disk and an fsync is never retried"
        )
        _logger.critical(message)
        try:
            sys.stderr.flush()
            os.write(2, f"CRITICAL rallypoint.raft: {message}\n".encode())
        finally:
            os._exit(FSYNC_FAILED_EXIT_CODE)


def fsync_dir(directory: str, fsync: FsyncFn) -> None:
    """Make the names in ``directory`` (creations, renames, removals) durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fsync_or_die(fd, fsync, f"directory {directory}")
    finally:
        os.close(fd)


def write_all(fd: int, data: bytes | bytearray | memoryview, offset: int) -> None:
    """``pwrite`` all of ``data`` at ``offset`` (a short write is continued, not lost)."""
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        if written <= 0:
            raise OSError(f"pwrite wrote {written} bytes")
        view = view[written:]
        offset += written


def write_file_durably(
    path: str, chunks: list[bytes], fsync: FsyncFn, *, preallocate_bytes: int = 0
) -> None:
    """Write ``path`` atomically: ``path.tmp``, fsync, rename over ``path``, fsync the directory.

    A crash at any point leaves either the previous file (or none) or the complete new one;
    a leftover ``.tmp`` is the caller's to remove on start-up.
    """
    tmp_path = path + ".tmp"
    fd = os.open(tmp_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        if preallocate_bytes > 0:
            os.posix_fallocate(fd, 0, preallocate_bytes)
        offset = 0
        for chunk in chunks:
            write_all(fd, chunk, offset)
            offset += len(chunk)
        fsync_or_die(fd, fsync, tmp_path)
    finally:
        os.close(fd)
    os.rename(tmp_path, path)
    fsync_dir(os.path.dirname(path) or ".", fsync)


def is_all_zero(data: bytes | bytearray, start: int = 0, end: int | None = None) -> bool:
    """True when ``data[start:end]`` holds only zero bytes (counted in C, no copy)."""
    stop = len(data) if end is None else min(end, len(data))
    if stop <= start:
        return True
    return data.count(0, start, stop) == stop - start


def remove_leftover_temp_files(directory: str, fsync: FsyncFn) -> list[str]:
    """Delete ``*.tmp`` files (interrupted atomic writes); returns the names removed."""
    removed = [name for name in sorted(os.listdir(directory)) if name.endswith(".tmp")]
    for name in removed:
        os.unlink(os.path.join(directory, name))
    if removed:
        fsync_dir(directory, fsync)
    return removed


class DataCorruptionError(Exception):
    """Stored data failed verification; the process must not start on it.

    ``path`` and ``offset`` locate the first bad byte range found; ``reason`` says what was
    wrong. Subclasses name the kind of file (WAL segment, snapshot).
    """

    def __init__(self, path: str, offset: int, reason: str) -> None:
        super().__init__(f"{path}: offset {offset}: {reason}")
        self.path = path
        self.offset = offset
        self.reason = reason


def crc32c_of(data: bytes, start: int, end: int, piece_bytes: int = 1 << 20) -> int:
    """CRC32C of ``data[start:end]``, copying at most ``piece_bytes`` at a time (the library
    accepts only ``bytes``, not views)."""
    crc = 0
    for pos in range(start, end, piece_bytes):
        crc = google_crc32c.extend(crc, data[pos : min(end, pos + piece_bytes)])
    return crc
