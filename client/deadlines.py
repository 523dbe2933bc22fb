"""Deadlines of many futures under one timer.

A caller that waits for an answer under a deadline needs the deadline to fail its future when
it passes. A timer per future (``loop.call_later`` and its cancel, or an ``asyncio.timeout``
scope) costs ~2.5-4 us on uvloop: as much as the rest of a batched put's way through the
client, and a tenth of a leader's work per proposal. :class:`FutureDeadlines` keeps the
deadlines in a heap with one timer armed for the earliest. A future that ends before its
deadline (answered, failed, cancelled) leaves its entry behind; entries of ended futures are
dropped when they come to the top, and all at once when they outnumber the live ones (so the
heap holds at most about twice the live entries, and a future costs amortised O(log n)).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable
from typing import Any

# The heap is rebuilt from its live entries once it holds twice as many as after the last
# rebuild, plus this many (a small heap is never rebuilt).
_SLACK = 64


class FutureDeadlines:
    """Fails each added future that is not done by its deadline with ``expired(key)`` (the
    ``key`` it was added with). Use it from the loop it was made on.

    Invariant: every future added and not done has an entry in the heap; while the heap has
    an entry, the timer is armed at or before the earliest one."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, expired: Callable[[Any], BaseException]
    ) -> None:
        self._loop = loop
        self._expired = expired
        # (deadline on the loop's clock, order added, future, key): a heap.
        self._heap: list[tuple[float, int, asyncio.Future[Any], Any]] = []
        self._order = itertools.count()
        self._rebuild_at = _SLACK
        self._timer: asyncio.TimerHandle | None = None
        self._closed = False

    def __len__(self) -> int:
        """Entries held, live or not (tests: the heap stays bounded)."""
        return len(self._heap)

    def add(self, future: asyncio.Future[Any], timeout_s: float, key: Any = None) -> None:
        """Fail ``future`` with ``expired(key)`` if it is not done ``timeout_s`` from now."""
        if self._closed:
            return  # nothing fails it any more (close)
        loop = self._loop
        at = loop.time() + timeout_s
        heap = self._heap
        if len(heap) >= self._rebuild_at:
            heap[:] = [entry for entry in heap if not entry[2].done()]
            heapq.heapify(heap)
            self._rebuild_at = 2 * len(heap) + _SLACK
        heapq.heappush(heap, (at, next(self._order), future, key))
        timer = self._timer
        if timer is None or at < timer.when():
            if timer is not None:
                timer.cancel()
            self._timer = loop.call_at(at, self._expire)

    def _expire(self) -> None:
        self._timer = None
        heap = self._heap
        now = self._loop.time()
        expired = self._expired
        while heap and heap[0][0] <= now:
            _, _, future, key = heapq.heappop(heap)
            if not future.done():
                future.set_exception(expired(key))
        while heap and heap[0][2].done():
            heapq.heappop(heap)
        if heap and not self._closed:
            self._timer = self._loop.call_at(heap[0][0], self._expire)

    def close(self) -> None:
        """Stop the timer and forget every entry (the futures are left as they are)."""
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._heap.clear()
