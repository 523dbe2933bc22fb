"""The read-only view of stable storage the consensus core needs, and an in-memory one.

The core never writes storage itself: the application persists what ``Ready`` hands it
(hard state, entries, snapshot) and then the core reads back through this protocol. A
storage holds a snapshot (possibly empty) followed by a contiguous run of entries.

Theory of operation (as etcd-io/raft's ``MemoryStorage``): ``_ents[0]`` is a dummy entry
whose index and term are those of the last compacted entry (the snapshot's), so
``first_index() == _ents[0].index + 1`` and ``term(first_index() - 1)`` is still answerable,
which the core needs to check the entry preceding an append.
"""

from __future__ import annotations

from typing import Protocol

from .types import (
    ConfState,
    Entry,
    HardState,
    Index,
    Snapshot,
    SnapshotMetadata,
    Term,
)


class StorageError(Exception):
    """Base class of the expected storage outcomes below."""


class CompactedError(StorageError):
    """The requested index precedes the first available entry (it was compacted)."""

    def __init__(self, index: int = 0) -> None:
        super().__init__(f"requested index {index} is unavailable due to compaction")
        self.index = index


class UnavailableError(StorageError):
    """The requested index is past the last entry."""

    def __init__(self, index: int = 0) -> None:
        super().__init__(f"requested entry at index {index} is unavailable")
        self.index = index


class SnapOutOfDateError(StorageError):
    """The snapshot offered is older than the one held."""


class SnapshotTemporarilyUnavailableError(StorageError):
    """No snapshot can be produced right now; the leader will retry later."""


class Storage(Protocol):
    """What the core reads. Errors other than the ``StorageError`` kinds are fatal."""

    def initial_state(self) -> tuple[HardState, ConfState]:
        """The persisted hard state and the configuration as of the last applied state."""
        ...

    def entries(self, lo: Index, hi: Index, max_size: int | None = None) -> list[Entry]:
        """Entries in ``[lo, hi)``; at least one if any, at most ``max_size`` bytes of data.

        Raises ``CompactedError`` if ``lo <= snapshot index`` and ``UnavailableError`` if
        ``hi > last_index() + 1``.
        """
        ...

    def term(self, index: Index) -> Term:
        """The term of entry ``index``, valid in ``[first_index() - 1, last_index()]``."""
        ...

    def first_index(self) -> Index:
        """Index of the first entry possibly available (the snapshot index + 1)."""
        ...

    def last_index(self) -> Index: ...

    def snapshot(self) -> Snapshot:
        """The most recent snapshot, or raise ``SnapshotTemporarilyUnavailableError``."""
        ...


def entries_size(entries: list[Entry] | tuple[Entry, ...]) -> int:
    """The size the core counts against byte limits: the data plus a small fixed overhead."""
    return sum(len(e.data) + 16 for e in entries)


def limit_size(entries: list[Entry], max_size: int | None) -> list[Entry]:
    """The longest prefix within ``max_size`` bytes, but always at least one entry."""
    if max_size is None or not entries:
        return entries
    size = len(entries[0].data) + 16
    n = 1
    while n < len(entries):
        size += len(entries[n].data) + 16
        if size > max_size:
            break
        n += 1
    return entries[:n]


class MemoryStorage:
    """A ``Storage`` held in memory, used by tests, the simulator and as the daemon's cache.

    Invariant: ``_ents`` is non-empty; ``_ents[i].index == _ents[0].index + i``.
    """

    def __init__(self) -> None:
        self._hard_state = HardState()
        self._snapshot = Snapshot()
        self._ents: list[Entry] = [Entry(Term(0), Index(0))]

    # -- Storage -------------------------------------------------------------------------

    def initial_state(self) -> tuple[HardState, ConfState]:
        return self._hard_state, self._snapshot.metadata.conf_state

    def entries(self, lo: Index, hi: Index, max_size: int | None = None) -> list[Entry]:
        offset = self._ents[0].index
        if lo <= offset:
            raise CompactedError(lo)
        if hi > self.last_index() + 1:
            raise UnavailableError(hi)
        if len(self._ents) == 1:  # only the dummy entry
            raise UnavailableError(lo)
        return limit_size(self._ents[lo - offset : hi - offset], max_size)

    def term(self, index: Index) -> Term:
        offset = self._ents[0].index
        if index < offset:
            raise CompactedError(index)
        if index - offset >= len(self._ents):
            raise UnavailableError(index)
        return self._ents[index - offset].term

    def first_index(self) -> Index:
        return Index(self._ents[0].index + 1)

    def last_index(self) -> Index:
        return Index(self._ents[0].index + len(self._ents) - 1)

    def snapshot(self) -> Snapshot:
        return self._snapshot

    # -- writes (the application's side) ---------------------------------------------------

    @property
    def hard_state(self) -> HardState:
        return self._hard_state

    def set_hard_state(self, hs: HardState) -> None:
        self._hard_state = hs

    def apply_snapshot(self, snap: Snapshot) -> None:
        """Replace the contents with ``snap``; an older snapshot raises SnapOutOfDateError."""
        if self._snapshot.metadata.index >= snap.metadata.index:
            raise SnapOutOfDateError(
                f"snapshot at {snap.metadata.index} is not newer than "
                f"{self._snapshot.metadata.index}"
            )
        self._snapshot = snap
        self._ents = [Entry(snap.metadata.term, snap.metadata.index)]

    def create_snapshot(self, index: Index, conf_state: ConfState | None, data: bytes) -> Snapshot:
        """Record a snapshot of the application state at ``index`` (does not compact)."""
        if index <= self._snapshot.metadata.index:
            raise SnapOutOfDateError(f"snapshot index {index} is not newer")
        offset = self._ents[0].index
        if index > self.last_index():
            raise ValueError(f"snapshot index {index} is out of bound {self.last_index()}")
        cs = conf_state if conf_state is not None else self._snapshot.metadata.conf_state
        meta = SnapshotMetadata(cs, index, self._ents[index - offset].term)
        self._snapshot = Snapshot(data, meta)
        return self._snapshot

    def compact(self, compact_index: Index) -> None:
        """Discard entries before ``compact_index`` (which stays, as the new dummy entry)."""
        offset = self._ents[0].index
        if compact_index <= offset:
            raise CompactedError(compact_index)
        if compact_index > self.last_index():
            raise ValueError(f"compact {compact_index} is out of bound {self.last_index()}")
        i = compact_index - offset
        head = self._ents[i]
        self._ents = [Entry(head.term, head.index), *self._ents[i + 1 :]]

    def append(self, entries: list[Entry] | tuple[Entry, ...]) -> None:
        """Append entries, overwriting any conflicting suffix (entries must be contiguous)."""
        if not entries:
            return
        first = self.first_index()
        last = entries[-1].index
        if last < first:  # everything is already compacted
            return
        ents = list(entries)
        if first > ents[0].index:  # truncate the compacted part
            ents = ents[first - ents[0].index :]
        offset = ents[0].index - self._ents[0].index
        if offset > len(self._ents):
            raise ValueError(
                f"missing log entry [last: {self.last_index()}, append at: {ents[0].index}]"
            )
        if offset == len(self._ents):
            # The common case, appending at the end: in place (amortized O(1), as etcd's
            # ``append(ms.ents, entries...)``); copying the whole log on every append made
            # each one cost O(entries since the last compaction).
            self._ents.extend(ents)
        else:
            # Overwriting a conflicting suffix: a new list, so slices handed out before
            # are not rewritten under their holders.
            self._ents = self._ents[:offset] + ents
