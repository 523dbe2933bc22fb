"""The tail of the log not yet known to be in stable storage.

Theory of operation (etcd-io/raft ``log_unstable.go``): entries (and at most one incoming
snapshot) that the core has accepted but the application has not yet confirmed persisted
live here. ``Ready`` hands them to the application; once written, ``stable_to`` drops them,
after which reads go to ``Storage``. Entries handed out but not yet confirmed are "in
progress" (``offset_in_progress``), so the next ``Ready`` does not hand them out again.

``entries[i]`` has index ``offset + i``. If ``snapshot`` is set it precedes ``offset``
(``snapshot.metadata.index == offset - 1`` right after a restore).
"""

from __future__ import annotations

from .types import Entry, Index, Snapshot, Term


class Unstable:
    """The unstable snapshot and entries.

    Invariants: ``offset <= offset_in_progress <= offset + len(entries)``; ``entries`` are
    contiguous from ``offset``; ``snapshot_in_progress`` implies ``snapshot is not None``.
    """

    __slots__ = ("entries", "offset", "offset_in_progress", "snapshot", "snapshot_in_progress")

    def __init__(self, offset: Index) -> None:
        # The incoming snapshot, if any, not yet persisted.
        self.snapshot: Snapshot | None = None
        # Entries not yet persisted; entries[i].index == offset + i.
        self.entries: list[Entry] = []
        self.offset = offset
        # True once the snapshot was handed out for persisting.
        self.snapshot_in_progress = False
        # entries[: offset_in_progress - offset] were handed out for persisting.
        self.offset_in_progress = offset

    def maybe_first_index(self) -> Index | None:
        """The first index after the unstable snapshot, if there is one."""
        if self.snapshot is not None:
            return Index(self.snapshot.metadata.index + 1)
        return None

    def maybe_last_index(self) -> Index | None:
        if self.entries:
            return Index(self.offset + len(self.entries) - 1)
        if self.snapshot is not None:
            return self.snapshot.metadata.index
        return None

    def maybe_term(self, index: Index) -> Term | None:
        if index < self.offset:
            snap = self.snapshot
            if snap is not None and snap.metadata.index == index:
                return snap.metadata.term
            return None
        position = index - self.offset
        if position >= len(self.entries):
            return None
        return self.entries[position].term

    def next_entries(self) -> list[Entry]:
        """Entries not yet handed out for persisting."""
        in_progress = self.offset_in_progress - self.offset
        if in_progress >= len(self.entries):
            return []
        return self.entries[in_progress:]

    def next_snapshot(self) -> Snapshot | None:
        """The snapshot, if it was not yet handed out for persisting."""
        if self.snapshot is None or self.snapshot_in_progress:
            return None
        return self.snapshot

    def accept_in_progress(self) -> None:
        """Everything currently here has been handed out for persisting."""
        if self.entries:
            self.offset_in_progress = Index(self.entries[-1].index + 1)
        if self.snapshot is not None:
            self.snapshot_in_progress = True

    def stable_to(self, index: Index, term: Term) -> None:
        """Entries up to ``(index, term)`` are persisted; drop them if still the same."""
        gt = self.maybe_term(index)
        if gt is None or index < self.offset:
            # Unknown here, or it is the unstable snapshot's index: nothing to drop.
            return
        if gt != term:
            # The entry was replaced (by a new leader's) after it was handed out: the write
            # that completed is not the entry we hold, which is still unstable.
            return
        count = index + 1 - self.offset
        del self.entries[:count]
        self.offset = Index(index + 1)
        self.offset_in_progress = Index(max(self.offset_in_progress, self.offset))

    def stable_snap_to(self, index: Index) -> None:
        if self.snapshot is not None and self.snapshot.metadata.index == index:
            self.snapshot = None
            self.snapshot_in_progress = False

    def restore(self, snap: Snapshot) -> None:
        self.offset = Index(snap.metadata.index + 1)
        self.offset_in_progress = self.offset
        self.entries = []
        self.snapshot = snap
        self.snapshot_in_progress = False

    def truncate_and_append(self, ents: list[Entry] | tuple[Entry, ...]) -> None:
        """Append ``ents``, first dropping any suffix they overwrite."""
        from_index = ents[0].index
        if from_index == self.offset + len(self.entries):
            # The common case: a direct continuation.
            self.entries.extend(ents)
        elif from_index <= self.offset:
            # Replaces everything unstable; the storage suffix is overwritten on persist.
            self.entries = list(ents)
            self.offset = from_index
            self.offset_in_progress = self.offset
        else:
            # Keep the prefix before from_index, replace the rest.
            if from_index > self.offset + len(self.entries):
                raise AssertionError(
                    f"unstable append at {from_index} leaves a gap after "
                    f"{self.offset + len(self.entries) - 1}"
                )
            del self.entries[from_index - self.offset :]
            self.entries.extend(ents)
            self.offset_in_progress = Index(min(self.offset_in_progress, from_index))

    def slice(self, lo: Index, hi: Index) -> list[Entry]:
        """Entries in ``[lo, hi)``, which must lie within the unstable entries."""
        upper = self.offset + len(self.entries)
        if lo > hi:
            raise AssertionError(f"invalid unstable slice {lo} > {hi}")
        if lo < self.offset or hi > upper:
            raise AssertionError(f"unstable slice [{lo},{hi}) out of bound [{self.offset},{upper}]")
        return self.entries[lo - self.offset : hi - self.offset]
