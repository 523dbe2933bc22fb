"""Memory snapshots kept in host memory outside the training process: files on a tmpfs.

Theory of operation. A snapshot server holds its blobs (its rank's own and the replicas it
protects), parity shares, metadata and placement in its process's heap, so a fault that kills
every training process at once (a software bug, an out-of-memory kill of the job) loses every
snapshot with them, and the relaunched processes go back to the disk checkpoint. With a
directory (``MemorySnapshots(directory=...)``; the elastic loop's ``snapshot_dir``: a tmpfs
such as /dev/shm, which is memory) the server keeps each of them in a file there instead: a
blob is written in place (the file is sized first and mapped, and the save or the socket
writes straight into the mapping), so it is held once, in the host's page cache rather than
the heap, and the server serves it from the mapping as before.

What a file is called: ``r<round>-s<step>-w<world>-...``, where world is a digest of the
world's token (random, chosen by rank 0 of each world: a world of another run, or of another
coordinator cluster that reuses round numbers, has another). The snapshot's registration
carries the world (``SnapshotPlacement.world``), so a file is only ever taken for the
registered snapshot it belongs to. A file appears under its name only once it is whole
(written under a temporary name, then renamed).

What is kept: exactly what the server holds (a file is removed when its snapshot is dropped:
at most the registered snapshot and one being protected), and nothing once the process leaves
its job (``close(keep=False)``). A process that dies without leaving (SIGKILL, a crash, an
interrupted run its job keeps open) leaves its files for the next process of the same job and
worker name, which finds them at its first restore (:meth:`HostFiles.leftovers`): the files
of the snapshot the coordinator has registered are taken up (mapped, served, restored from:
``SnapshotServer.recover``); every other file is removed then.

One process per directory: the directory is locked (``flock``) while a process uses it; a
second process finding it locked keeps its snapshots in its heap and says so.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import logging
import mmap
import os
import re
import stat
import threading
import time
from pathlib import Path
from urllib.parse import quote

log = logging.getLogger("rallypoint.worker.snapshots")

# A buffer a blob lives in: the heap's, or a mapping of its file.
Buffer = bytes | bytearray | mmap.mmap

LOCK_NAME = ".lock"
# How long a process waits for the directory's lock before it keeps its snapshots in its heap.
LOCK_WAIT_S = 2.0
# r<round>-s<step>-w<world>-rank<rank>.blob, ...-g<group>-p<parity>.parity,
# r<round>-s<step>-w<world>.metadata, .placement
NAME = re.compile(
    r"r(?P<round>\d+)-s(?P<step>\d+)-w(?P<world>[0-9a-f]+)"
    r"(?:-rank(?P<rank>\d+)\.blob|-g(?P<group>\d+)-p(?P<parity>\d+)\.parity"
    r"|\.(?P<small>metadata|placement))"
)


def world_of(token: bytes) -> str:
    """A world's name in file names and registrations: a digest of its token (the token
    itself is a secret of the world's members; this is not)."""
    return hashlib.sha256(b"rallypoint snapshot world\0" + token).hexdigest()[:16]


def _size(fd: int, length: int) -> None:
    """Give the file ``length`` bytes of memory now (ENOSPC here, not a SIGBUS when a page
    is first written through its mapping); a filesystem that cannot reserve gets a sparse
    file of that length."""
    try:
        os.posix_fallocate(fd, 0, length)
    except OSError as error:
        if error.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise
        os.ftruncate(fd, length)


def job_directory(root: str | os.PathLike[str], job: str, name: str) -> Path:
    """Where the worker ``name`` of ``job`` keeps its snapshot files under ``root`` (each
    quoted, dots too: a name is one directory, never ``..``)."""
    return Path(root) / "rallypoint-snapshots" / _component(job) / _component(name)


def _component(text: str) -> str:
    return quote(text, safe="-_").replace(".", "%2E")


def blob_name(round_number: int, step: int, world: str, rank: int) -> str:
    return f"r{round_number}-s{step}-w{world}-rank{rank}.blob"


def parity_name(round_number: int, step: int, world: str, group: int, parity: int) -> str:
    return f"r{round_number}-s{step}-w{world}-g{group}-p{parity}.parity"


def small_name(round_number: int, step: int, world: str, what: str) -> str:
    return f"r{round_number}-s{step}-w{world}.{what}"


class HostFiles:
    """One process's snapshot files in ``directory`` (module docstring). Thread-safe."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = self.directory.stat()
        if info.st_uid != os.getuid() or stat.S_IMODE(info.st_mode) & 0o077:
            raise ValueError(
                f"snapshot directory {self.directory} must be this user's and closed to others "
                f"(owner uid {info.st_uid}, mode {stat.S_IMODE(info.st_mode):o})"
            )
        self._lock_fd = os.open(self.directory / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
        # A process that just died may hold it a moment longer (a child it forked, a
        # DataLoader worker, shares its descriptor until it notices): wait a little.
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(self._lock_fd)
                    raise
                time.sleep(0.05)
        # Files a process before this one left, found at the start (taken up or removed at
        # the first restore: ``SnapshotServer.recover``).
        self.leftovers = sorted(
            entry.name for entry in os.scandir(self.directory) if entry.name != LOCK_NAME
        )
        # Guards the two below (files are written outside it, by several threads at once).
        self._lock = threading.Lock()
        # Buffers being written, by id: (the buffer, its temporary file's name).
        self._writing: dict[int, tuple[mmap.mmap, str]] = {}
        self._serial = 0
        self._full_warned = False

    @classmethod
    def open(cls, directory: str | os.PathLike[str]) -> HostFiles | None:
        """The files of ``directory``, or None (logged) when another live process holds it."""
        try:
            return cls(directory)
        except BlockingIOError:
            log.warning(
                "snapshot directory %s is in use by another process: this one keeps its "
                "snapshots in its own memory (they do not outlive it)",
                directory,
            )
            return None

    def _temporary(self, name: str) -> str:
        with self._lock:
            self._serial += 1
            return f".{name}.{os.getpid()}.{self._serial}.tmp"

    def allocate(self, name: str, length: int) -> Buffer:
        """A writable buffer of ``length`` bytes for the file ``name``, mapped from a file
        sized for it (a heap bytearray when the directory has no room: logged once);
        :meth:`commit` makes it the file ``name``."""
        if length == 0:
            return bytearray()
        temporary = self._temporary(name)
        path = self.directory / temporary
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            _size(fd, length)
            buffer = mmap.mmap(fd, length)
        except OSError as error:
            os.unlink(path)
            if error.errno not in (errno.ENOSPC, errno.ENOMEM):
                raise
            self._warn_full(error)
            return bytearray(length)
        finally:
            os.close(fd)
        with self._lock:
            self._writing[id(buffer)] = (buffer, temporary)
        return buffer

    def _warn_full(self, error: OSError) -> None:
        with self._lock:
            warned, self._full_warned = self._full_warned, True
        if not warned:
            log.warning(
                "snapshot directory %s has no room (%s): snapshots that do not fit are kept "
                "in this process's memory and do not outlive it",
                self.directory,
                error.strerror,
            )

    def commit(self, name: str, buffer: Buffer) -> Buffer:
        """Make ``buffer`` the file ``name``: renamed if :meth:`allocate` made it, else
        written; returns what to hold it as (the file's mapping; ``buffer`` itself when it
        does not fit)."""
        with self._lock:
            writing = self._writing.pop(id(buffer), None)
        if writing is not None and writing[0] is buffer:
            os.rename(self.directory / writing[1], self.directory / name)
            return buffer
        return self.load(name) if self.keep(name, buffer) else buffer

    def keep(self, name: str, data: bytes | bytearray | memoryview | mmap.mmap) -> bool:
        """Write the file ``name``; False (logged once) when the directory has no room."""
        try:
            self.write(name, data)
        except OSError as error:
            if error.errno not in (errno.ENOSPC, errno.ENOMEM):
                raise
            self._warn_full(error)
            return False
        return True

    def abandon(self, buffer: Buffer) -> None:
        """Forget a buffer :meth:`allocate` made that will never be committed."""
        with self._lock:
            writing = self._writing.pop(id(buffer), None)
        if writing is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.directory / writing[1])

    def write(self, name: str, data: bytes | bytearray | memoryview | mmap.mmap) -> None:
        """Write the file ``name`` whole (a temporary file renamed)."""
        temporary = self.directory / self._temporary(name)
        try:
            with open(temporary, "xb") as file:
                file.write(data)
            os.rename(temporary, self.directory / name)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary)
            raise

    def load(self, name: str) -> Buffer:
        """The file ``name``, mapped (empty: b"")."""
        with open(self.directory / name, "r+b") as file:
            size = os.fstat(file.fileno()).st_size
            return mmap.mmap(file.fileno(), size) if size else b""

    def read(self, name: str) -> bytes:
        return (self.directory / name).read_bytes()

    def remove(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.directory / name)

    def close(self, *, keep: bool) -> None:
        """Stop using the directory; ``keep=False`` removes every file in it (and the
        directory, and its job's, once empty)."""
        with self._lock:
            writing, self._writing = list(self._writing.values()), {}
        for _, temporary in writing:
            self.remove(temporary)
        if not keep:
            for entry in os.scandir(self.directory):
                if entry.name != LOCK_NAME:
                    self.remove(entry.name)
            self.remove(LOCK_NAME)
        os.close(self._lock_fd)
        if not keep:
            for directory in (self.directory, self.directory.parent):
                with contextlib.suppress(OSError):
                    directory.rmdir()
