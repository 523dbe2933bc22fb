"""Linearizable reads: batching ReadIndex requests (Raft thesis 6.4).

Theory of operation. A read is linearizable if it is answered from a state that includes
every write committed before the read started. The leader learns such an index with one
round of heartbeats (ReadIndex): the commit index at the time of the request, confirmed
still to be the leader's. The read then waits until this member has applied up to it.

Reads arrive far more often than one heartbeat round takes, so they are batched: at most
one ReadIndex request is in flight; reads that arrive meanwhile queue, and when the answer
comes the next request covers all of them. Every read therefore waits for a confirmation
that *started after it did*, which is what linearizability needs (an answer to a request
issued before the read began could predate a write the reader already saw acknowledged).

A request can be lost (the leader changes, a message drops). When the leader changes the
batch in flight is re-queued in front of the newer reads and asked again of the new leader;
a request unanswered for an election timeout is asked again too. When no leader is known the
reads fail with the error the caller gives; with a new leader known they stay queued.

All of this runs on the event loop; ``read_index`` hands the request to the Raft core and
``wake`` nudges the Ready loop that carries it out.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass

from rallypoint.raft.types import ReadState

__all__ = ["ReadIndexBatcher"]


@dataclass
class _ReadBatch:
    context: bytes
    futures: list[asyncio.Future[None]]
    issued_at_s: float


class ReadIndexBatcher:
    def __init__(
        self,
        read_index: Callable[[bytes], None],
        wake: Callable[[], None],
        clock_s: Callable[[], float] = time.monotonic,
    ) -> None:
        self._read_index = read_index
        self._wake = wake
        self._clock_s = clock_s
        # Reads not yet covered by a request. A caller that gave up leaves its future here
        # (it waits on a shield of it); a done future is skipped when resolving.
        self._queue: list[asyncio.Future[None]] = []
        # The one request in flight and the reads it covers, if any.
        self._inflight: _ReadBatch | None = None
        # Confirmed batches waiting for the applied index to reach theirs.
        self._waiting_apply: list[tuple[int, list[asyncio.Future[None]]]] = []
        self._contexts = itertools.count(1)

    def enqueue(self) -> asyncio.Future[None]:
        """A new read: its future resolves once the state it may be answered from is
        applied."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.append(future)
        self.issue()
        return future

    def issue(self) -> None:
        """Ask for one ReadIndex covering every read queued since the last one was asked:
        each read waits for a confirmation that started after it did."""
        if self._inflight is not None or not self._queue:
            return
        context = next(self._contexts).to_bytes(8, "big")
        self._inflight = _ReadBatch(context, self._queue, self._clock_s())
        self._queue = []
        self._read_index(context)
        self._wake()

    def requeue(self, leader_known: bool) -> None:
        """The request in flight may be lost (the leader changed): ask again, first."""
        batch, self._inflight = self._inflight, None
        if batch is not None:
            self._queue = batch.futures + self._queue
        if leader_known:
            self.issue()

    def retry_if_lost(self, timeout_s: float, leader_known: bool) -> None:
        """Called every tick: a request unanswered for ``timeout_s`` is asked again."""
        batch = self._inflight
        if batch is not None and self._clock_s() - batch.issued_at_s > timeout_s:
            self.requeue(leader_known)

    def on_read_state(self, read_state: ReadState, applied_index: int) -> None:
        batch = self._inflight
        if batch is None or read_state.request_ctx != batch.context:
            return  # the answer to a request given up on
        self._inflight = None
        if read_state.index <= applied_index:
            _resolve(batch.futures)
        else:
            self._waiting_apply.append((read_state.index, batch.futures))
        self.issue()

    def on_applied(self, applied_index: int) -> None:
        still_waiting = []
        for index, futures in self._waiting_apply:
            if index <= applied_index:
                _resolve(futures)
            else:
                still_waiting.append((index, futures))
        self._waiting_apply = still_waiting

    def fail_queued(self, error: Exception, keep: bool) -> None:
        """The leader changed or the member stops: fail the queued reads with ``error``, or
        ``keep`` them to ask the new leader."""
        if keep:
            return
        reads, self._queue = self._queue, []
        for future in reads:
            if not future.done():
                future.set_exception(error)


def _resolve(futures: list[asyncio.Future[None]]) -> None:
    for future in futures:
        if not future.done():
            future.set_result(None)
