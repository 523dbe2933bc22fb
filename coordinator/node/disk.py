"""Where a Ready's write runs: the member's disk thread, or the Ready loop itself.

The disk thread (``DiskThread``) is the only thread that touches the WAL and snapshot files
while the loop serves: a leader's write runs there while its appends travel and the loop
keeps answering, and snapshots, log releases and the identity file are written there too.

A follower's write is on the critical path of every put: the leader counts the follower's
ack, which goes out only once the entry is on disk (fsync). Handing that write to the disk
thread costs two thread wake-ups (the disk thread's, then the loop's when the write is
done), and on a virtualised host a wake-up costs more than a small write's own CPU
(bench/README "A follower writes its small batches itself"). So a follower's Ready loop
writes and fsyncs a small batch itself (``DiskWrites.write``) when

- the disk thread is idle: nothing queued or running there (a snapshot, a log release), so
  the files still have one writer at a time;
- the batch is small (``INLINE_MAX_BYTES`` of entry data, no snapshot);
- the previous write took at most ``INLINE_MAX_SECONDS``: a slow disk blocks the loop for
  one write at most, after which the writes go to the disk thread until one is quick again.

Durability is the same on both paths: the same ``DiskStorage.write_batch`` with its fsync,
and the ack leaves only after it returns (``messages_after_persist``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

from rallypoint.raft.storage.disk_storage import DiskStorage, PersistRequest

_P = ParamSpec("_P")
_T = TypeVar("_T")

# Entry bytes of a batch a follower's loop writes itself; larger batches go to the disk thread.
INLINE_MAX_BYTES = 64 * 1024
# The longest a write may have taken for the next one to run on the loop (blocking it).
INLINE_MAX_SECONDS = 0.002


class DiskThread(concurrent.futures.ThreadPoolExecutor):
    """The member's single disk thread, which knows whether anything is queued or running
    on it. Only the event loop's thread submits (``submitted``); a job counts as finished
    once it returned, on the disk thread, or when it was cancelled before it ran, on the
    thread that cancelled it: hence the lock."""

    def __init__(self) -> None:
        super().__init__(1, thread_name_prefix="rp-disk")
        self.submitted = 0
        self.finished = 0
        self._finished_lock = threading.Lock()

    def submit(
        self, fn: Callable[_P, _T], /, *args: _P.args, **kwargs: _P.kwargs
    ) -> concurrent.futures.Future[_T]:
        self.submitted += 1
        future = super().submit(fn, *args, **kwargs)
        future.add_done_callback(self._done)
        return future

    def _done(self, _future: concurrent.futures.Future[Any]) -> None:
        with self._finished_lock:
            self.finished += 1

    @property
    def idle(self) -> bool:
        return self.finished == self.submitted


def entry_bytes(request: PersistRequest) -> int:
    return sum(len(entry.data) for entry in request.entries)


class DiskWrites:
    """Runs each Ready's write (see the module docstring for where)."""

    def __init__(self, disk: DiskThread) -> None:
        self._disk = disk
        self._last_seconds = 0.0
        # Writes the loop made itself (the rest were handed to the disk thread).
        self.inline = 0

    def may_write_inline(self, request: PersistRequest, follower: bool) -> bool:
        return (
            follower
            and self._disk.idle
            and self._last_seconds <= INLINE_MAX_SECONDS
            and request.snapshot.is_empty()
            and entry_bytes(request) <= INLINE_MAX_BYTES
        )

    async def write(self, storage: DiskStorage, request: PersistRequest, follower: bool) -> float:
        """Make ``request`` durable; returns how long it took (seconds)."""
        started = time.monotonic()
        if self.may_write_inline(request, follower):
            storage.write_batch([request])
            self.inline += 1
        else:
            await asyncio.get_running_loop().run_in_executor(
                self._disk, storage.write_batch, [request]
            )
        self._last_seconds = time.monotonic() - started
        return self._last_seconds
