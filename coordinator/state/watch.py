"""The bounded history of changes that watches read from.

Theory of operation. Every change appends an :class:`Event` in revision order. The history
keeps at most ``max_events`` events and ``max_bytes`` of keys and values; beyond that the
oldest revisions are dropped whole (a revision's events are never split, so a watcher that
resumes from "last revision seen + 1" never gets half a revision). ``compacted_revision`` is
the newest revision dropped: a watch from at or below it gets :class:`Compacted` instead of
a silent gap. The history and the compaction point are part of the snapshot, so a watcher
served by a member restored from a snapshot gets the same answer.
"""

from __future__ import annotations

import bisect

from .errors import Compacted
from .values import Event


def _event_size_bytes(event: Event) -> int:
    previous = event.prev
    return len(event.kv.key) + len(event.kv.value) + (len(previous.value) if previous else 0)


class WatchHistory:
    def __init__(self, max_events: int, max_bytes: int) -> None:
        if max_events < 1 or max_bytes < 1:
            raise ValueError("the watch history must keep at least one event and one byte")
        self.max_events = max_events
        self.max_bytes = max_bytes
        # Invariant: revisions ascending (equal within one revision), all > compacted_revision.
        self._events: list[Event] = []
        self._revisions: list[int] = []
        self._size_bytes = 0
        # Invariant: every event at or below this revision has been dropped; only grows.
        self.compacted_revision = 0

    def __len__(self) -> int:
        return len(self._events)

    def append(self, events: list[Event]) -> None:
        """Add the events of one revision (all sharing it), then enforce the bounds."""
        for event in events:
            if self._revisions and event.revision < self._revisions[-1]:
                raise AssertionError(f"event revision {event.revision} goes backwards")
            self._events.append(event)
            self._revisions.append(event.revision)
            self._size_bytes += _event_size_bytes(event)
        self._trim()

    def _trim(self) -> None:
        drop = 0
        size_bytes = self._size_bytes
        while drop < len(self._events) and (
            len(self._events) - drop > self.max_events or size_bytes > self.max_bytes
        ):
            # Drop the whole revision of the oldest event.
            revision = self._revisions[drop]
            end = bisect.bisect_right(self._revisions, revision, lo=drop)
            size_bytes -= sum(_event_size_bytes(e) for e in self._events[drop:end])
            drop = end
            self.compacted_revision = revision
        if drop:
            del self._events[:drop]
            del self._revisions[:drop]
            self._size_bytes = size_bytes

    def events_since(
        self, revision: int, key: bytes, prefix: bool = False
    ) -> tuple[Event, ...] | Compacted:
        """Events at ``revision`` or later for ``key`` (or keys under it), in order."""
        if revision <= self.compacted_revision:
            return Compacted(self.compacted_revision + 1)
        start = bisect.bisect_left(self._revisions, revision)
        if prefix:
            return tuple(e for e in self._events[start:] if e.kv.key.startswith(key))
        return tuple(e for e in self._events[start:] if e.kv.key == key)

    def in_order(self) -> list[Event]:
        return list(self._events)

    def restore(self, compacted_revision: int, events: list[Event]) -> None:
        self._events = []
        self._revisions = []
        self._size_bytes = 0
        self.compacted_revision = compacted_revision
        for event in events:
            if event.revision <= compacted_revision:
                raise AssertionError("snapshot history holds a compacted revision")
            self._events.append(event)
            self._revisions.append(event.revision)
            self._size_bytes += _event_size_bytes(event)
