"""The Raft log: appends and conflicts, terms across compaction, commit and apply marks."""

from __future__ import annotations

import pytest

from rallypoint.raft import (
    CompactedError,
    ConfState,
    Entry,
    Index,
    MemoryStorage,
    Snapshot,
    SnapshotMetadata,
    Term,
)
from rallypoint.raft.log import RaftLog
from rallypoint.raft.log_storage import entries_size
from rallypoint.raft.log_unstable import Unstable


def ent(term: int, index: int, data: bytes = b"") -> Entry:
    return Entry(Term(term), Index(index), data=data)


def log_with(*terms: int, stable: bool = False) -> RaftLog:
    """A log holding one entry per term given, at indexes 1, 2, ... (unstable by default)."""
    entries = [ent(term, i) for i, term in enumerate(terms, start=1)]
    storage = MemoryStorage()
    if stable:
        storage.append(entries)
        return RaftLog(storage)
    log = RaftLog(storage)
    log.append(entries)
    return log


@pytest.mark.parametrize(
    ("entries", "conflict"),
    [
        ([], 0),
        # No conflict: empty, or all present.
        ([ent(1, 1), ent(2, 2), ent(3, 3)], 0),
        ([ent(2, 2), ent(3, 3)], 0),
        ([ent(3, 3)], 0),
        # No conflict, but new entries.
        ([ent(1, 1), ent(2, 2), ent(3, 3), ent(4, 4), ent(4, 5)], 4),
        ([ent(4, 4), ent(4, 5)], 4),
        # Conflicts with existing entries.
        ([ent(4, 1), ent(4, 2)], 1),
        ([ent(1, 2), ent(4, 3), ent(4, 4)], 2),
        ([ent(1, 3), ent(2, 4), ent(4, 5), ent(4, 6)], 3),
    ],
)
def test_find_conflict(entries: list[Entry], conflict: int) -> None:
    assert log_with(1, 2, 3).find_conflict(entries) == conflict


@pytest.mark.parametrize(
    ("terms", "index", "term", "want"),
    [
        # Log terms 2, 5, 5, 5, 5, 5 (indexes 1..6).
        ((2, 5, 5, 5, 5, 5), 6, 6, (6, 5)),
        ((2, 5, 5, 5, 5, 5), 6, 5, (6, 5)),
        ((2, 5, 5, 5, 5, 5), 6, 4, (1, 2)),
        ((2, 5, 5, 5, 5, 5), 6, 2, (1, 2)),
        ((2, 5, 5, 5, 5, 5), 6, 1, (0, 0)),
        ((2, 5, 5, 5, 5, 5), 1, 2, (1, 2)),
        ((2, 5, 5, 5, 5, 5), 1, 1, (0, 0)),
        ((2, 5, 5, 5, 5, 5), 0, 0, (0, 0)),
    ],
)
def test_find_conflict_by_term(
    terms: tuple[int, ...], index: int, term: int, want: tuple[int, int]
) -> None:
    assert log_with(*terms).find_conflict_by_term(Index(index), Term(term)) == want


def test_find_conflict_by_term_returns_unknown_term_at_compaction_boundary() -> None:
    storage = MemoryStorage()
    storage.apply_snapshot(Snapshot(metadata=SnapshotMetadata(ConfState(), Index(10), Term(3))))
    storage.append([ent(4, 11), ent(6, 12)])
    log = RaftLog(storage)
    assert log.find_conflict_by_term(Index(12), Term(5)) == (11, 4)
    assert log.find_conflict_by_term(Index(12), Term(3)) == (10, 3)  # the snapshot's term
    assert log.find_conflict_by_term(Index(9), Term(1)) == (9, 0)  # compacted: unknown


@pytest.mark.parametrize(
    ("last_index", "term", "up_to_date"),
    [
        # Greater last term: up to date whatever the index.
        (1, 4, True),
        (3, 4, True),
        (4, 4, True),
        # Smaller term: never.
        (1, 2, False),
        (4, 2, False),
        # Equal term: at least as long.
        (2, 3, False),
        (3, 3, True),
        (4, 3, True),
    ],
)
def test_is_up_to_date(last_index: int, term: int, up_to_date: bool) -> None:
    assert log_with(1, 2, 3).is_up_to_date(Index(last_index), Term(term)) is up_to_date


@pytest.mark.parametrize(
    ("index", "log_term", "commit", "entries", "want", "ok", "committed"),
    [
        # Not a match: the log term or index is wrong.
        (3, 2, 3, [ent(4, 4)], 0, False, 1),
        (4, 3, 3, [ent(4, 5)], 0, False, 1),
        # A match with the last entry.
        (3, 3, 3, [], 3, True, 3),
        (3, 3, 4, [], 3, True, 3),  # commit is capped at the last new index
        (3, 3, 2, [], 3, True, 2),
        (3, 3, 0, [], 3, True, 1),  # commit never decreases
        (3, 3, 3, [ent(4, 4)], 4, True, 3),
        (3, 3, 4, [ent(4, 4)], 4, True, 4),
        (3, 3, 5, [ent(4, 4)], 4, True, 4),
        (3, 3, 5, [ent(4, 4), ent(4, 5)], 5, True, 5),
        # A match with an earlier entry.
        (2, 2, 3, [ent(4, 3)], 3, True, 3),
        (2, 2, 4, [ent(3, 3), ent(4, 4)], 4, True, 4),
        (1, 1, 4, [ent(2, 2), ent(3, 3), ent(4, 4)], 4, True, 4),
    ],
)
def test_maybe_append(
    index: int,
    log_term: int,
    commit: int,
    entries: list[Entry],
    want: int,
    ok: bool,
    committed: int,
) -> None:
    log = log_with(1, 2, 3)
    log.committed = Index(1)
    assert log.maybe_append(Index(index), Term(log_term), Index(commit), entries) == (want, ok)
    assert log.committed == committed
    if ok and entries:
        assert log.slice(Index(index + 1), Index(log.last_index() + 1)) == entries


def test_maybe_append_refuses_to_overwrite_committed_entries() -> None:
    log = log_with(1, 2, 3)
    log.committed = Index(2)
    with pytest.raises(AssertionError):
        log.maybe_append(Index(1), Term(1), Index(3), [ent(4, 2)])


@pytest.mark.parametrize(
    ("max_index", "term", "commits"),
    [
        (3, 3, True),
        (3, 2, False),  # the entry at 3 is not of the given term: counting cannot commit it
        (2, 3, False),
        (1, 1, False),  # not newer than the commit index
        (3, 0, False),  # a zero term never matches
    ],
)
def test_maybe_commit_only_commits_entries_of_the_given_term(
    max_index: int, term: int, commits: bool
) -> None:
    log = log_with(1, 2, 3)
    log.committed = Index(1)
    assert log.maybe_commit(Index(max_index), Term(term)) is commits
    assert log.committed == (max_index if commits else 1)


def test_commit_to_never_goes_backwards_nor_beyond_the_log() -> None:
    log = log_with(1, 2, 3)
    log.commit_to(Index(3))
    log.commit_to(Index(2))
    assert log.committed == 3
    with pytest.raises(AssertionError):
        log.commit_to(Index(4))


def test_term_across_compaction() -> None:
    storage = MemoryStorage()
    storage.append([ent(i, i) for i in range(1, 11)])
    storage.compact(Index(5))
    log = RaftLog(storage)
    log.append([ent(11, 11)])
    assert log.first_index() == 6
    assert log.term(Index(5)) == 5  # the entry before first_index keeps its term
    assert log.term(Index(11)) == 11
    with pytest.raises(CompactedError):
        log.term(Index(4))
    assert log.zero_term_on_out_of_bounds(Index(12)) == 0
    with pytest.raises(CompactedError):
        log.slice(Index(4), Index(8))


def test_slice_spans_storage_and_unstable_with_size_limit() -> None:
    storage = MemoryStorage()
    storage.append([ent(1, i, b"x" * 4) for i in range(1, 6)])
    log = RaftLog(storage)
    log.append([ent(1, i, b"x" * 4) for i in range(6, 11)])
    whole = log.slice(Index(3), Index(9))
    assert [e.index for e in whole] == list(range(3, 9))
    one_size = entries_size([whole[0]])
    assert [e.index for e in log.slice(Index(3), Index(9), 3 * one_size)] == [3, 4, 5]
    assert [e.index for e in log.slice(Index(4), Index(9), 3 * one_size)] == [4, 5, 6]
    assert [e.index for e in log.slice(Index(4), Index(9), 0)] == [4]  # at least one entry
    assert [e.index for e in log.entries(Index(9))] == [9, 10]
    assert log.entries(Index(11)) == []


def test_committed_entries_are_handed_out_only_once_persisted() -> None:
    storage = MemoryStorage()
    log = RaftLog(storage)
    log.append([ent(1, 1), ent(1, 2), ent(1, 3)])
    log.commit_to(Index(3))
    assert not log.has_next_committed_ents()
    assert log.next_committed_ents() == []
    log.accept_unstable()
    storage.append(log.unstable.entries)
    log.stable_to(Index(2), Term(1))
    assert log.has_next_committed_ents()
    assert [e.index for e in log.next_committed_ents()] == [1, 2]
    log.accept_applying(Index(2), 0)
    assert not log.has_next_committed_ents()
    log.applied_to(Index(2))
    assert log.applied == 2
    log.stable_to(Index(3), Term(1))
    assert [e.index for e in log.next_committed_ents()] == [3]


def test_applying_is_paused_by_the_size_limit() -> None:
    storage = MemoryStorage()
    entries = [ent(1, i, b"x" * 100) for i in range(1, 6)]
    storage.append(entries)
    size = entries_size(entries[:1])
    log = RaftLog(storage, max_applying_ents_size=2 * size)
    log.commit_to(Index(5))
    batch = log.next_committed_ents()
    assert [e.index for e in batch] == [1, 2]
    log.accept_applying(Index(2), entries_size(batch))
    assert log.applying_ents_paused and not log.has_next_committed_ents()
    log.applied_to(Index(2), entries_size(batch))
    assert [e.index for e in log.next_committed_ents()] == [3, 4]


def test_applied_to_checks_its_range() -> None:
    log = log_with(1, 1, stable=True)
    log.commit_to(Index(2))
    log.applied_to(Index(1))
    with pytest.raises(AssertionError):
        log.applied_to(Index(3))
    with pytest.raises(AssertionError):
        log.applied_to(Index(0))


def test_restore_replaces_the_log_with_the_snapshot() -> None:
    log = log_with(1, 2, 3)
    snap = Snapshot(metadata=SnapshotMetadata(ConfState(), Index(10), Term(5)))
    log.restore(snap)
    assert log.committed == 10
    assert log.first_index() == 11
    assert log.last_index() == 10
    assert log.term(Index(10)) == 5
    assert log.has_next_unstable_snapshot()
    assert not log.has_next_committed_ents()  # nothing is applied before the snapshot
    log.accept_unstable()
    assert not log.has_next_unstable_snapshot()
    log.stable_snap_to(Index(10))
    assert not log.has_next_or_in_progress_snapshot()


def test_unstable_stable_to_ignores_replaced_entries() -> None:
    unstable = Unstable(Index(5))
    unstable.truncate_and_append([ent(1, 5), ent(1, 6), ent(1, 7)])
    unstable.accept_in_progress()
    # A new leader replaces index 6 before the write of (7, 1) completes.
    unstable.truncate_and_append([ent(2, 6)])
    assert unstable.offset_in_progress == 6
    unstable.stable_to(Index(7), Term(1))  # no longer there: ignored
    assert [e.index for e in unstable.entries] == [5, 6]
    unstable.stable_to(Index(6), Term(1))  # replaced by term 2: ignored
    assert len(unstable.entries) == 2
    unstable.stable_to(Index(5), Term(1))
    assert [(e.index, e.term) for e in unstable.entries] == [(6, 2)]
    assert unstable.next_entries() == [ent(2, 6)]


def test_unstable_truncate_and_append_cases() -> None:
    unstable = Unstable(Index(5))
    unstable.truncate_and_append([ent(1, 5)])
    unstable.truncate_and_append([ent(1, 6), ent(1, 7)])  # continuation
    unstable.truncate_and_append([ent(2, 7)])  # replaces a suffix
    assert [(e.index, e.term) for e in unstable.entries] == [(5, 1), (6, 1), (7, 2)]
    unstable.truncate_and_append([ent(3, 4)])  # replaces everything, before the offset
    assert unstable.offset == 4 and [e.index for e in unstable.entries] == [4]
    with pytest.raises(AssertionError):
        unstable.truncate_and_append([ent(3, 9)])  # would leave a gap


def test_storage_appends_at_the_end_in_place_and_overwrites_in_a_new_list() -> None:
    """``MemoryStorage.append`` at the log's end costs O(entries appended), not O(log):
    the list grows in place (it copied the whole log on every append, and a Ready is an
    append: with 100,000 entries between snapshots that was ~0.25 ms per Ready per member).
    Overwriting a conflicting suffix still builds a new list."""
    storage = MemoryStorage()
    storage.append([ent(1, i) for i in range(1, 1001)])
    held = storage._ents
    for i in range(1001, 1101):
        storage.append([ent(1, i)])
        assert storage._ents is held, "an append at the end copied the log"
    assert storage.last_index() == 1100
    assert [e.index for e in storage.entries(Index(1), Index(1101))] == list(range(1, 1101))

    handed_out = storage.entries(Index(1090), Index(1101))
    storage.append([ent(2, 1095), ent(2, 1096)])
    assert storage._ents is not held
    assert storage.last_index() == 1096
    assert [(e.term, e.index) for e in storage.entries(Index(1093), Index(1097))] == [
        (1, 1093),
        (1, 1094),
        (2, 1095),
        (2, 1096),
    ]
    assert [e.term for e in handed_out] == [1] * 11
    assert [e.index for e in held[-3:]] == [1098, 1099, 1100]

    storage.compact(Index(1050))
    storage.append([ent(2, 1097)])
    assert storage.first_index() == 1051 and storage.last_index() == 1097
    assert storage.term(Index(1097)) == 2
