"""Durable Raft storage: a MemoryStorage index over a WAL and a snapshot directory.

Theory of operation
===================

A data directory holds ``wal/`` (raft/storage/wal.py) and ``snap/``
(raft/storage/snapshotter.py). The
in-memory :class:`MemoryStorage` answers every read of the :class:`Storage` protocol; the
files make it survive a restart.

Restart (:meth:`DiskStorage.open`) = the newest snapshot that verifies and that the WAL
records, then the WAL replayed after it:

1. The WAL is opened (its torn tail repaired, or :class:`WalCorruptionError` raised).
2. The newest snapshot file that verifies, whose index is at most the highest snapshot
   marker in the WAL, and whose term matches that marker's, is loaded; a damaged newer one
   is skipped with a warning (fallback); if files exist but none verifies,
   :class:`SnapshotCorruptionError` names the file and offset.
3. The WAL's entries are folded by the replay rules (an entry at i replaces i and all after
   it; an installed-snapshot marker empties the log) and the part after the snapshot must
   continue it without a gap. Otherwise the node refuses to start: a fallback snapshot
   cannot bridge a log prefix that was already compacted away.

Writes follow a RawNode Ready: :meth:`persist` (hard state, entries, snapshot), then the
application sends messages and applies. Compaction: :meth:`create_snapshot` writes the
snapshot file and its WAL marker, keeps the ``retain_snapshots`` newest files; then
:meth:`compact` drops the in-memory prefix and deletes whole WAL segments that only hold
entries covered by the *oldest* retained snapshot (so falling back to it still works).

Threading. The class has two halves with no state in common, each to be used by one thread
at a time (raft/ has no locks), so they may run concurrently:

- the *disk half*: :meth:`write_batch` (one fsync for a whole batch of Readys),
  :meth:`write_snapshot`, :meth:`release_log`; the daemon runs them on one worker thread;
- the *memory half*: the Storage reads, :meth:`apply_batch`, :meth:`hold_commit`,
  :meth:`prepare_snapshot`, ``memory.create_snapshot``/``memory.compact``; the daemon runs
  them on the event loop, applying a batch only after its ``write_batch`` returned.

:meth:`persist`, :meth:`persist_batch`, :meth:`create_snapshot`, :meth:`compact` and
:meth:`apply_snapshot` run both halves in sequence, for single-threaded callers.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass

from ..log_storage import MemoryStorage, SnapOutOfDateError
from ..types import (
    EMPTY_HARD_STATE,
    EMPTY_SNAPSHOT,
    ConfState,
    Entry,
    HardState,
    Index,
    Snapshot,
    SnapshotMetadata,
    Term,
)
from .fileutil import FsyncFn, default_fsync
from .snapshotter import Snapshotter
from .wal import (
    DEFAULT_SEGMENT_SIZE_BYTES,
    WAL,
    SnapshotMarker,
    WalCorruptionError,
    WalRecord,
    hard_state_goes_backwards,
)


@dataclass(frozen=True, slots=True)
class PersistRequest:
    """What one Ready asks to persist."""

    hard_state: HardState = EMPTY_HARD_STATE
    entries: tuple[Entry, ...] = ()
    snapshot: Snapshot = EMPTY_SNAPSHOT
    # The Ready's must_sync: False when only the commit index moved (it may be lost in a
    # crash and is relearned from the leader), so no fsync is needed for it.
    must_sync: bool = True


@dataclass(frozen=True, slots=True)
class SnapshotPolicy:
    """When to snapshot and how many snapshot files to keep."""

    entries_per_snapshot: int = 100_000
    retain_snapshots: int = 2  # the newest, plus older ones to fall back on

    def __post_init__(self) -> None:
        if self.entries_per_snapshot < 1 or self.retain_snapshots < 1:
            raise ValueError(f"invalid snapshot policy {self}")

    def should_snapshot(self, applied_index: Index, snapshot_index: Index) -> bool:
        """True once ``entries_per_snapshot`` entries were applied since the last snapshot."""
        return applied_index - snapshot_index >= self.entries_per_snapshot


def _replay(records: list[WalRecord], snapshot: Snapshot, wal_dir: str) -> MemoryStorage:
    """Fold the WAL's records onto ``snapshot`` into a MemoryStorage (see module doc)."""
    hard_state = HardState()
    log: list[Entry] = []  # Invariant: contiguous indexes.
    reset_index: int | None = None  # index of the last installed-snapshot marker
    for record in records:
        value = record.value
        if isinstance(value, HardState):
            hard_state = value
        elif isinstance(value, SnapshotMarker):
            if value.reset:
                log, reset_index = [], value.index
        elif log and log[0].index <= value.index <= log[-1].index + 1:
            del log[value.index - log[0].index :]
            log.append(value)
        elif reset_index is None and (not log or value.index < log[0].index):
            log = [value]  # the first surviving entry, or a rewrite below it
        elif not log and value.index == reset_index:
            raise WalCorruptionError(record.path, record.offset, "entry at a snapshot index")
        elif not log and reset_index is not None and value.index == reset_index + 1:
            log = [value]
        else:
            after = log[-1].index if log else reset_index
            raise WalCorruptionError(
                record.path,
                record.offset,
                f"entry {value.index} does not continue the log (last index {after})",
            )
    snap_index, snap_term = snapshot.metadata.index, snapshot.metadata.term
    if reset_index is not None and snap_index < reset_index:
        raise WalCorruptionError(
            wal_dir,
            0,
            f"the WAL installed a snapshot at index {reset_index}, but the newest usable "
            f"snapshot file is at {snap_index}",
        )
    if log and log[0].index <= snap_index <= log[-1].index:
        term_in_log = log[snap_index - log[0].index].term
        if term_in_log != snap_term:
            raise WalCorruptionError(
                wal_dir,
                0,
                f"snapshot {snap_term}/{snap_index} disagrees with the WAL's entry "
                f"{term_in_log}/{snap_index}",
            )
    tail = [e for e in log if e.index > snap_index]
    if tail and tail[0].index != snap_index + 1:
        raise WalCorruptionError(
            wal_dir,
            0,
            f"the log resumes at index {tail[0].index} but the newest usable snapshot is at "
            f"{snap_index}: entries in between are in no file",
        )
    memory = MemoryStorage()
    if not snapshot.is_empty():
        memory.apply_snapshot(snapshot)
    memory.append(tail)
    memory.set_hard_state(hard_state)
    return memory


class DiskStorage:
    """A :class:`Storage` that survives restarts; see the module docstring."""

    def __init__(
        self,
        wal: WAL,
        snapshotter: Snapshotter,
        memory: MemoryStorage,
        durable_snapshot_index: Index,
        policy: SnapshotPolicy,
    ) -> None:
        """Use :meth:`open`."""
        self._wal = wal  # disk half
        self._snapshotter = snapshotter  # disk half
        # Disk half. Invariant: the highest snapshot index recorded in the WAL.
        self._durable_snapshot_index = durable_snapshot_index
        # Disk half. Invariant: the last hard state written to the WAL (term/vote monotone).
        self._durable_hard_state = memory.hard_state
        # Memory half. Invariant: equals what a restart would load, plus entries kept before
        # the snapshot until compact() drops them, and a commit index held but not yet
        # written (hold_commit).
        self._memory = memory
        self.policy = policy

    @classmethod
    def open(
        cls,
        data_dir: str,
        *,
        segment_size_bytes: int = DEFAULT_SEGMENT_SIZE_BYTES,
        policy: SnapshotPolicy | None = None,
        fsync: FsyncFn = default_fsync,
        logger: logging.Logger | None = None,
    ) -> DiskStorage:
        """Open (creating if needed) the storage in ``data_dir``; see the module docstring.

        Raises WalCorruptionError or SnapshotCorruptionError rather than start on damage.
        """
        wal_dir = os.path.join(data_dir, "wal")
        wal, records = WAL.open(
            wal_dir, segment_size_bytes=segment_size_bytes, fsync=fsync, logger=logger
        )
        try:
            marker_terms: dict[int, int] = {}
            for record in records:
                if isinstance(record.value, SnapshotMarker):
                    marker_terms[record.value.index] = record.value.term
            durable_snapshot_index = Index(max(marker_terms, default=0))

            def accept(meta: SnapshotMetadata) -> str | None:
                term = marker_terms.get(meta.index, meta.term)
                if term != meta.term:
                    return f"its term {meta.term} differs from the WAL's marker term {term}"
                return None

            snapshotter = Snapshotter(os.path.join(data_dir, "snap"), fsync=fsync, logger=logger)
            snapshot = snapshotter.load_newest(durable_snapshot_index, accept)
            memory = _replay(records, snapshot, wal_dir)
        except BaseException:
            wal.close()
            raise
        return cls(wal, snapshotter, memory, durable_snapshot_index, policy or SnapshotPolicy())

    # -- Storage (memory half) ---------------------------------------------------------------

    def initial_state(self) -> tuple[HardState, ConfState]:
        return self._memory.initial_state()

    def entries(self, lo: Index, hi: Index, max_size: int | None = None) -> list[Entry]:
        return self._memory.entries(lo, hi, max_size)

    def term(self, index: Index) -> Term:
        return self._memory.term(index)

    def first_index(self) -> Index:
        return self._memory.first_index()

    def last_index(self) -> Index:
        return self._memory.last_index()

    def snapshot(self) -> Snapshot:
        return self._memory.snapshot()

    @property
    def hard_state(self) -> HardState:
        return self._memory.hard_state

    @property
    def memory(self) -> MemoryStorage:
        """The in-memory index (memory half)."""
        return self._memory

    def should_snapshot(self, applied_index: Index) -> bool:
        """The driver asks after applying; True means call :meth:`create_snapshot`."""
        return self.policy.should_snapshot(applied_index, self._memory.snapshot().metadata.index)

    # -- disk half ---------------------------------------------------------------------------

    def write_batch(self, batch: Sequence[PersistRequest]) -> None:
        """Make a batch of Readys' state durable: snapshot files, WAL records, one fsync.

        Raises AssertionError (before writing anything) if a hard state would move term or
        vote backwards, and SnapOutOfDateError for a snapshot that is not newer.
        """
        hard_state = self._durable_hard_state
        snapshot_index = self._durable_snapshot_index
        for request in batch:
            if not request.hard_state.is_empty():
                if hard_state_goes_backwards(hard_state, request.hard_state):
                    raise AssertionError(
                        f"hard state {request.hard_state} goes backwards from {hard_state}"
                    )
                hard_state = request.hard_state
            if not request.snapshot.is_empty():
                if request.snapshot.metadata.index <= snapshot_index:
                    raise SnapOutOfDateError(
                        f"snapshot at {request.snapshot.metadata.index} is not newer than "
                        f"{snapshot_index}"
                    )
                snapshot_index = request.snapshot.metadata.index
        installed = False
        for request in batch:
            if not request.snapshot.is_empty():
                meta = request.snapshot.metadata
                self._snapshotter.save(request.snapshot)  # durable before its marker
                self._wal.save_snapshot_marker(SnapshotMarker(meta.index, meta.term, reset=True))
                installed = True
            self._wal.save(request.hard_state, request.entries)
        if installed or any(request.must_sync for request in batch):
            self._wal.sync()
        self._durable_hard_state = hard_state
        self._durable_snapshot_index = snapshot_index
        if installed:
            self._snapshotter.retain(self.policy.retain_snapshots)

    def write_snapshot(self, snapshot: Snapshot) -> None:
        """Make a snapshot the application created durable: file, WAL marker, retention.
        The snapshot is of committed entries (a member snapshots what it applied): its index
        is written as committed when the WAL's commit index is below it."""
        meta = snapshot.metadata
        if meta.index <= self._durable_snapshot_index:
            raise SnapOutOfDateError(
                f"snapshot at {meta.index} is not newer than {self._durable_snapshot_index}"
            )
        self._snapshotter.save(snapshot)
        durable = self._durable_hard_state
        if durable.commit < meta.index:
            # The commit index that covers this snapshot may live in the memory half only
            # (hold_commit): a restart must not load a commit index below the snapshot's
            # (the core refuses it), and what was applied to make the snapshot was committed.
            durable = HardState(durable.term, durable.vote, meta.index)
            self._wal.save(durable, ())
            self._durable_hard_state = durable
        self._wal.save_snapshot_marker(SnapshotMarker(meta.index, meta.term))
        self._wal.sync()
        self._durable_snapshot_index = meta.index
        self._snapshotter.retain(self.policy.retain_snapshots)

    def wal_position(self) -> tuple[str, int]:
        """(path of the WAL's last segment, end of its durable records); disk half."""
        return self._wal.segment_paths()[-1], self._wal.synced_offset

    def release_log(self, index: Index) -> list[str]:
        """Delete WAL segments holding only entries at or below both ``index`` and the oldest
        retained snapshot (so a fallback to that snapshot still finds its log)."""
        retained = [
            f.index for f in self._snapshotter.files() if f.index <= self._durable_snapshot_index
        ]
        bound = min(index, min(retained, default=Index(0)))
        return self._wal.release_to(Index(bound))

    # -- memory half -------------------------------------------------------------------------

    def apply_batch(self, batch: Sequence[PersistRequest]) -> None:
        """Update the in-memory index after :meth:`write_batch` returned for ``batch``."""
        for request in batch:
            if not request.snapshot.is_empty():
                self._memory.apply_snapshot(request.snapshot)
            self._memory.append(request.entries)
            if not request.hard_state.is_empty():
                self._memory.set_hard_state(request.hard_state)

    def hold_commit(self, hard_state: HardState) -> None:
        """Take a Ready's hard state that moves only the commit index (``must_sync`` false)
        into the memory half, with no write: the WAL gets it with the next
        :meth:`write_batch` (pass :attr:`hard_state` with entries) or a snapshot
        (:meth:`write_snapshot` raises the WAL's commit index to the snapshot's). A commit
        index may be lost in a crash and is relearned from the leader, as an unsynced write
        of it could be; this spares the caller a hand-off to the disk thread."""
        current = self._memory.hard_state
        if (hard_state.term, hard_state.vote) != (current.term, current.vote):
            raise AssertionError(f"hard state {hard_state} moves more than the commit of {current}")
        if hard_state.commit < current.commit:
            raise AssertionError(f"commit index of {hard_state} goes back from {current}")
        self._memory.set_hard_state(hard_state)

    def prepare_snapshot(self, index: Index, conf_state: ConfState | None, data: bytes) -> Snapshot:
        """The snapshot ``memory.create_snapshot`` would record, without recording it."""
        current = self._memory.snapshot().metadata
        if index <= current.index:
            raise SnapOutOfDateError(f"snapshot index {index} is not newer than {current.index}")
        if index > self._memory.last_index():
            raise ValueError(f"snapshot index {index} is past the last index")
        cs = conf_state if conf_state is not None else current.conf_state
        return Snapshot(data, SnapshotMetadata(cs, index, self._memory.term(index)))

    # -- both halves, for single-threaded callers ----------------------------------------

    def persist_batch(self, batch: Sequence[PersistRequest]) -> None:
        self.write_batch(batch)
        self.apply_batch(batch)

    def persist(
        self,
        hard_state: HardState,
        entries: Sequence[Entry],
        snapshot: Snapshot = EMPTY_SNAPSHOT,
    ) -> None:
        """Persist one Ready's ``hard_state``, ``entries`` and ``snapshot`` (one fsync)."""
        self.persist_batch([PersistRequest(hard_state, tuple(entries), snapshot)])

    def apply_snapshot(self, snapshot: Snapshot) -> None:
        """Install a snapshot received from the leader (replaces the whole log)."""
        self.persist(EMPTY_HARD_STATE, (), snapshot)

    def create_snapshot(self, index: Index, conf_state: ConfState | None, data: bytes) -> Snapshot:
        """Snapshot the application state at ``index`` durably (does not compact)."""
        snapshot = self.prepare_snapshot(index, conf_state, data)
        self.write_snapshot(snapshot)
        return self._memory.create_snapshot(index, conf_state, data)

    def compact(self, index: Index) -> None:
        """Drop entries before ``index`` from memory and the WAL segments a restart no
        longer needs."""
        self._memory.compact(index)
        self.release_log(index)

    def close(self) -> None:
        self._wal.close()
