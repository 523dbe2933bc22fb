"""The bounded history of changes that watches read from.

Theory of operation. Every change appends an :class:`Event` in revision order. The oldest
revision is dropped, whole, once the revisions after it hold ``max_events`` events or
``max_bytes`` of keys and values (a revision's events are never split, so a watcher that
resumes from "last revision seen + 1" never gets half a revision). The bounds thus say how
far behind a watcher may fall, whatever the size of each revision: a revision larger than
the bounds (a prefix delete of 50,000 keys) stays as long as a one-key revision would, so a
watcher that was caught up when it was applied still reads it. What is kept is at most the
bounds plus the oldest kept revision, and one revision holds at most every key in the store;
dropped events wait in memory for the next cut of the lists (amortised O(1) a write), at most
as many as are kept and an eighth of ``max_bytes`` (plus the last revision dropped).
``compacted_revision`` is the newest revision dropped: a watch from at or below it gets
:class:`Compacted` instead of a silent gap. The history and the compaction point are part
of the snapshot, so a watcher served by a member restored from a snapshot gets the same
answer.
"""

from __future__ import annotations

import bisect
import collections
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from .errors import Compacted
from .values import Event


def by_revision(events: Iterable[Event]) -> Iterator[list[Event]]:
    """``events`` (in revision order) as one list per revision: a watcher is sent a whole
    revision at a time."""
    batch: list[Event] = []
    for event in events:
        if batch and event.revision != batch[-1].revision:
            yield batch
            batch = []
        batch.append(event)
    if batch:
        yield batch


def _event_size_bytes(event: Event) -> int:
    previous = event.prev
    return len(event.kv.key) + len(event.kv.value) + (len(previous.value) if previous else 0)


@dataclass(slots=True)
class _RevisionSize:
    """How many events, and bytes of keys and values, one revision in the history holds."""

    revision: int
    events: int
    size_bytes: int


class WatchHistory:
    def __init__(self, max_events: int, max_bytes: int) -> None:
        if max_events < 1 or max_bytes < 1:
            raise ValueError("the watch history must keep at least one event and one byte")
        self.max_events = max_events
        self.max_bytes = max_bytes
        # Invariant: revisions ascending (equal within one revision). The history is
        # ``_events[_start:]`` (and ``_revisions[_start:]``), every revision there >
        # compacted_revision: dropping the oldest revision moves ``_start`` on, and the dead
        # prefix (``_dead_bytes`` of keys and values) is cut off only once it is as long as
        # the history itself or holds an eighth of ``max_bytes``, so it never keeps more
        # than that alive. Cutting it at every drop moved the whole list (10,000 pointers,
        # twice) on every write.
        self._events: list[Event] = []
        self._revisions: list[int] = []
        self._start = 0
        self._dead_bytes = 0
        # Invariant: one entry per distinct revision of the history, in order; their events
        # and bytes add up to len(self) and _size_bytes.
        self._per_revision: collections.deque[_RevisionSize] = collections.deque()
        self._size_bytes = 0
        # Invariant: every event at or below this revision has been dropped; only grows.
        self.compacted_revision = 0

    def __len__(self) -> int:
        return len(self._events) - self._start

    def append(self, events: list[Event]) -> None:
        """Add the events of one revision (all sharing it), then enforce the bounds."""
        if not events:
            return
        revision = events[0].revision
        if any(event.revision != revision for event in events):
            raise AssertionError("one append holds events of several revisions")
        if self._revisions and revision < self._revisions[-1]:
            raise AssertionError(f"event revision {revision} goes backwards")
        # One pass in C-speed steps where it can: a prefix delete appends every key it removed.
        size_bytes = sum(map(_event_size_bytes, events))
        self._events.extend(events)
        self._revisions.extend([revision] * len(events))
        self._size_bytes += size_bytes
        newest = self._per_revision[-1] if self._per_revision else None
        if newest is not None and newest.revision == revision:
            newest.events += len(events)
            newest.size_bytes += size_bytes
        else:
            self._per_revision.append(_RevisionSize(revision, len(events), size_bytes))
        self._trim()

    def _add(self, event: Event) -> None:
        if self._revisions and event.revision < self._revisions[-1]:
            raise AssertionError(f"event revision {event.revision} goes backwards")
        self._events.append(event)
        self._revisions.append(event.revision)
        size_bytes = _event_size_bytes(event)
        self._size_bytes += size_bytes
        newest = self._per_revision[-1] if self._per_revision else None
        if newest is not None and newest.revision == event.revision:
            newest.events += 1
            newest.size_bytes += size_bytes
        else:
            self._per_revision.append(_RevisionSize(event.revision, 1, size_bytes))

    def _trim(self) -> None:
        drop = 0
        while self._per_revision:
            # The oldest revision goes once the revisions after it reach a bound.
            oldest = self._per_revision[0]
            newer_events = len(self._events) - self._start - drop - oldest.events
            newer_bytes = self._size_bytes - oldest.size_bytes
            if newer_events < self.max_events and newer_bytes < self.max_bytes:
                break
            self._per_revision.popleft()
            drop += oldest.events
            self._dead_bytes += oldest.size_bytes
            self._size_bytes = newer_bytes
            self.compacted_revision = oldest.revision
        if drop:
            self._start += drop
            # Amortised O(1) per event: a cut moves what is left, at most as many events as
            # were dropped since the last cut, or after max_bytes / 8 of them went.
            live = len(self._events) - self._start
            if self._start >= live or self._dead_bytes * 8 >= self.max_bytes:
                del self._events[: self._start]
                del self._revisions[: self._start]
                self._start = 0
                self._dead_bytes = 0

    def events_since(
        self, revision: int, key: bytes, prefix: bool = False
    ) -> tuple[Event, ...] | Compacted:
        """Events at ``revision`` or later for ``key`` (or keys under it), in order."""
        if revision <= self.compacted_revision:
            return Compacted(self.compacted_revision + 1)
        start = bisect.bisect_left(self._revisions, revision, self._start)
        if prefix:
            return tuple(e for e in self._events[start:] if e.kv.key.startswith(key))
        return tuple(e for e in self._events[start:] if e.kv.key == key)

    def in_order(self) -> list[Event]:
        return self._events[self._start :]

    def copy(self) -> WatchHistory:
        """A copy later appends and compactions do not change (events are frozen)."""
        clone = WatchHistory(self.max_events, self.max_bytes)
        clone._events = self._events[self._start :]
        clone._revisions = self._revisions[self._start :]
        clone._per_revision = collections.deque(
            _RevisionSize(r.revision, r.events, r.size_bytes) for r in self._per_revision
        )
        clone._size_bytes = self._size_bytes
        clone.compacted_revision = self.compacted_revision
        return clone

    def restore(self, compacted_revision: int, events: list[Event]) -> None:
        self._events = []
        self._revisions = []
        self._start = 0
        self._dead_bytes = 0
        self._per_revision.clear()
        self._size_bytes = 0
        self.compacted_revision = compacted_revision
        for event in events:
            if event.revision <= compacted_revision:
                raise AssertionError("snapshot history holds a compacted revision")
            self._add(event)
