"""The watch history's bound costs O(1) a write, and drops exactly what the rule says.

Dropping the oldest revision cut the front off the history's two lists on every write once
the history was full: 10,000 pointers moved twice per put at the default bound, 3 us of every
write on every member. The history now moves a start offset and cuts the dead front only once
it is as long as what is kept.
"""

from __future__ import annotations

import random

from rallypoint.coordinator.state.errors import Compacted
from rallypoint.coordinator.state.values import Event, EventType, KeyValue
from rallypoint.coordinator.state.watch import WatchHistory


class CountingList(list[object]):
    """A list that counts the deletions made on it (each moves what follows)."""

    deletions = 0

    def __delitem__(self, index: object) -> None:
        type(self).deletions += 1
        super().__delitem__(index)  # type: ignore[arg-type]


def event(revision: int, key: bytes, value: bytes = b"v") -> Event:
    return Event(EventType.PUT, KeyValue(key, value, revision, revision, 1, 0), None)


def test_a_full_history_does_not_shift_its_lists_on_every_write() -> None:
    history = WatchHistory(max_events=1_000, max_bytes=1 << 30)
    for revision in range(1, 1_001):
        history.append([event(revision, b"k")])
    CountingList.deletions = 0
    history._events = CountingList(history._events)  # type: ignore[assignment]
    history._revisions = CountingList(history._revisions)  # type: ignore[assignment]

    for revision in range(1_001, 6_001):
        history.append([event(revision, b"k")])

    # 5,000 writes past the bound, each dropping the oldest: a cut of both lists about once
    # per 1,000 drops, not one per write.
    assert CountingList.deletions <= 2 * (5_000 // 1_000 + 1)
    assert len(history) == 1_000
    assert history.compacted_revision == 5_000
    assert [e.kv.mod_revision for e in history.in_order()] == list(range(5_001, 6_001))


def test_dropped_events_of_large_values_are_let_go_within_an_eighth_of_the_byte_bound() -> None:
    # Bounded by bytes (8 events of 1,000 bytes), not by count: waiting for the dead front
    # to be as long as what is kept would keep twice the byte bound alive.
    history = WatchHistory(max_events=10_000, max_bytes=8_000)
    for revision in range(1, 2_001):
        history.append([event(revision, b"k", b"v" * 999)])
        referenced = sum(len(e.kv.key) + len(e.kv.value) for e in history._events)
        assert referenced <= 8_000 + 8_000 // 8 + 2 * 1_000, revision
    assert len(history) == 8


class Model:
    """The rule as documented, kept the plain way: whole revisions, oldest first."""

    def __init__(self, max_events: int, max_bytes: int) -> None:
        self.max_events, self.max_bytes = max_events, max_bytes
        self.revisions: list[list[Event]] = []
        self.compacted = 0

    def append(self, events: list[Event]) -> None:
        self.revisions.append(events)
        while self.revisions:
            rest = self.revisions[1:]
            count = sum(len(r) for r in rest)
            size = sum(len(e.kv.key) + len(e.kv.value) for r in rest for e in r)
            if count < self.max_events and size < self.max_bytes:
                break
            self.compacted = self.revisions.pop(0)[0].revision

    def since(self, revision: int, key: bytes, prefix: bool) -> tuple[Event, ...] | Compacted:
        if revision <= self.compacted:
            return Compacted(self.compacted + 1)
        return tuple(
            e
            for r in self.revisions
            for e in r
            if e.revision >= revision and (e.kv.key.startswith(key) if prefix else e.kv.key == key)
        )


def test_the_history_keeps_and_answers_what_the_rule_says_through_many_cuts() -> None:
    rng = random.Random(56)
    history, model = WatchHistory(max_events=50, max_bytes=900), Model(50, 900)
    revision = 0
    for step in range(3_000):
        revision += rng.choice([1, 1, 1, 2])
        events = [
            event(revision, b"k%d" % rng.randrange(5), b"v" * rng.randrange(1, 40))
            for _ in range(rng.choice([1, 1, 1, 3, 20]))
        ]
        history.append(events)
        model.append(events)
        assert history.compacted_revision == model.compacted
        assert history.in_order() == [e for r in model.revisions for e in r]
        assert len(history) == sum(len(r) for r in model.revisions)
        if step % 7 == 0:
            since = revision - rng.randrange(60)
            key = b"k%d" % rng.randrange(5)
            assert history.events_since(since, key) == model.since(since, key, False)
            assert history.events_since(since, b"k", prefix=True) == model.since(since, b"k", True)
            clone = history.copy()
            assert clone.in_order() == history.in_order()
            assert clone.compacted_revision == history.compacted_revision
