"""Snapshots this member makes: periodic ones that bound the log, and ones for followers.

Theory of operation (Raft thesis 5.1, 5.3; etcd's ``etcdserver`` snapshot/compact and
``raft.ErrSnapshotTemporarilyUnavailable``). A snapshot is the application state (the
state machine and the member table) at an applied index, with the configuration at
that index. Encoding a large state takes a while, so it never runs on the event loop, and
the Ready loop keeps persisting, sending and applying while it runs:

1. *capture*, on the event loop, between two applies: the applied index, the configuration,
   a copy of the member table and a frozen copy of the state machine
   (``StateMachine.frozen_copy``, which later applies do not change);
2. *encode* the capture on the encoder thread (not the disk thread, which must stay free for
   the WAL writes of the Readies that continue meanwhile);
3. *store* (periodic snapshots only): the snapshot file and its WAL marker on the disk thread,
   then the in-memory log, then compaction, keeping ``snapshot_catchup_entries`` behind the
   snapshot so a briefly lagging follower catches up from the log instead.

A received snapshot may be installed while a periodic one is encoded: storing an older
snapshot is then refused (``SnapOutOfDateError``) and skipped, an expected outcome.

The Raft core asks its storage for a snapshot when a follower needs compacted entries
(``LeaderSnapshots``). The stored one is sent when its configuration is current; it may
predate the configuration that added the follower (the cluster's first snapshot never
names a member added later), and a follower ignores a snapshot whose configuration leaves it
out. Then an up-to-date one is made from a capture, off the event loop, as above: until it
is ready the core is told ``SnapshotTemporarilyUnavailableError`` and retries on a later
heartbeat response. Such a snapshot is sent, not stored, and reused while the configuration
is unchanged and the log still holds the entries after it.

A periodic snapshot is due every ``snapshot_entries`` applied entries (the storage's
policy; 100,000 by default, as etcd's ``--snapshot-count``), or sooner once the entries
applied since the last capture hold ``snapshot_log_bytes`` (a few large entries would
otherwise grow the in-memory log, the WAL and a restart's replay far past what the count
suggests). At most one periodic snapshot runs at a time; when it ends it checks whether
another is due (or asked for, ``snapshot_now``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from rallypoint.client.tasks import cancel_and_wait
from rallypoint.raft.log_storage import SnapOutOfDateError, SnapshotTemporarilyUnavailableError
from rallypoint.raft.storage.disk_storage import DiskStorage
from rallypoint.raft.types import (
    ConfState,
    Entry,
    HardState,
    Index,
    Snapshot,
    SnapshotMetadata,
    Term,
)

from ..member_table import MemberTable, encode_app_snapshot
from ..state.machine import StateMachine

__all__ = ["Capture", "LeaderSnapshots", "Snapshots"]

log = logging.getLogger("rallypoint.node")


@dataclass(frozen=True, slots=True)
class Capture:
    """The application state at one applied index, safe to encode on another thread: no
    part of it is shared with the state the event loop keeps applying to."""

    index: Index
    conf_state: ConfState
    members: MemberTable
    state: StateMachine


def capture(state: StateMachine, members: MemberTable, conf_state: ConfState) -> Capture:
    """Take a capture (on the event loop, between applies)."""
    return Capture(
        Index(state.applied_index),
        conf_state,
        MemberTable(dict(members.items()), members.highest_id),
        state.frozen_copy(),
    )


def encode(captured: Capture) -> bytes:
    """A capture's snapshot data (on the encoder thread)."""
    return encode_app_snapshot(captured.members, captured.state.snapshot())


def _encode_and_hash(captured: Capture) -> tuple[bytes, bytes]:
    data = encode(captured)
    return data, hashlib.sha256(data).digest()


class Snapshots:
    def __init__(
        self,
        member_id: int,
        storage: DiskStorage,
        disk: concurrent.futures.Executor,
        catchup_entries: int,
        applied_index: Callable[[], int],
        take_capture: Callable[[], Capture],
        spawn: Callable[[Coroutine[Any, Any, None]], asyncio.Task[None]],
        log_bytes: int,
    ) -> None:
        self._member_id = member_id
        # A snapshot is also due once the entries applied since the last capture hold this
        # many bytes: the storage's policy counts entries, and a few large ones (a JoinBatch
        # of thousands of participants) would otherwise grow the in-memory log, the WAL and a
        # restart's replay far past what the entry count suggests.
        self._log_bytes = log_bytes
        self._applied_bytes = 0
        self._storage = storage
        self._disk = disk
        self._catchup_entries = catchup_entries
        self._applied_index = applied_index
        self._take_capture = take_capture
        self._spawn = spawn
        # The one thread that encodes snapshots; never the disk thread (see above).
        self._encoder = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rp-snap")
        self._requests: list[asyncio.Future[int]] = []
        self._periodic: asyncio.Task[None] | None = None
        # The snapshot made for followers, or the task making it.
        self._for_followers: Snapshot | None = None
        self._for_followers_task: asyncio.Task[None] | None = None

    # ------------------------------------------------------------- periodic snapshots

    def applied(self, size_bytes: int) -> None:
        """Entries holding ``size_bytes`` were applied."""
        self._applied_bytes += size_bytes

    def installed(self) -> None:
        """A snapshot received from the leader replaced the state."""
        self._applied_bytes = 0

    def _due(self) -> bool:
        applied = Index(self._applied_index())
        if self._storage.should_snapshot(applied):
            return True
        return (
            self._applied_bytes >= self._log_bytes
            and applied > self._storage.snapshot().metadata.index
        )

    def maybe_start(self) -> None:
        """After applying: start a snapshot if one is due (by the storage's entry count, or
        by the bytes applied since the last) or was asked for, and none is running."""
        if (self._requests or self._due()) and self._periodic is None:
            self._periodic = self._spawn(self._run())

    async def snapshot_now(self) -> int:
        """Snapshot at the applied index (unless the stored one is that recent); the index
        of the newest stored snapshot."""
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._requests.append(future)
        self.maybe_start()
        return await future

    async def snapshot_quietly(self) -> None:
        """``snapshot_now``, for a background task that needs no answer."""
        await self.snapshot_now()

    async def _run(self) -> None:
        requests: list[asyncio.Future[int]] = []
        try:
            while True:
                requests, self._requests = self._requests, []
                current = self._storage.snapshot().metadata.index
                if self._applied_index() > current:
                    captured = self._take_capture()
                    self._applied_bytes = 0
                    current = await self._store(captured)
                for future in requests:
                    if not future.done():
                        future.set_result(int(current))
                if not self._requests and not self._due():
                    return
        finally:
            self._periodic = None
            _cancel(requests)

    async def _store(self, captured: Capture) -> Index:
        """Encode, store and compact; the index of the newest stored snapshot after."""
        storage = self._storage
        if captured.index <= storage.snapshot().metadata.index:
            return storage.snapshot().metadata.index
        loop = asyncio.get_running_loop()
        data = await loop.run_in_executor(self._encoder, encode, captured)
        try:
            snapshot = storage.prepare_snapshot(captured.index, captured.conf_state, data)
            await loop.run_in_executor(self._disk, storage.write_snapshot, snapshot)
            storage.memory.create_snapshot(captured.index, captured.conf_state, data)
        except SnapOutOfDateError:
            # A newer snapshot was installed (received from the leader) meanwhile.
            log.info(
                "member %d: snapshot at %d superseded by a received one",
                self._member_id,
                captured.index,
            )
            return storage.snapshot().metadata.index
        compact_to = Index(max(0, captured.index - self._catchup_entries))
        if compact_to > storage.memory.first_index():
            storage.memory.compact(compact_to)
            await loop.run_in_executor(self._disk, storage.release_log, compact_to)
        log.info("member %d: snapshot at %d", self._member_id, captured.index)
        return captured.index

    # ------------------------------------------------------------- for followers

    def for_follower(self, conf_state: ConfState) -> Snapshot:
        """The snapshot the Raft core sends a follower that needs compacted entries, given
        the current configuration; raises SnapshotTemporarilyUnavailableError while an
        up-to-date one is being made."""
        storage = self._storage
        stored = storage.snapshot()
        if stored.metadata.conf_state == conf_state:
            return stored
        made = self._for_followers
        if (
            made is not None
            and made.metadata.conf_state == conf_state
            and made.metadata.index >= stored.metadata.index
            and made.metadata.index + 1 >= storage.first_index()
        ):
            return made
        if self._for_followers_task is None:
            self._for_followers_task = self._spawn(self._make_for_followers())
        raise SnapshotTemporarilyUnavailableError(
            "making a snapshot with the current configuration"
        )

    async def _make_for_followers(self) -> None:
        try:
            captured = self._take_capture()
            term = self._storage.term(captured.index)
            data = await asyncio.get_running_loop().run_in_executor(self._encoder, encode, captured)
            metadata = SnapshotMetadata(captured.conf_state, captured.index, term)
            self._for_followers = Snapshot(data, metadata)
        finally:
            self._for_followers_task = None

    # ------------------------------------------------------------- for backups

    async def encode_for_backup(self, captured: Capture) -> tuple[bytes, bytes]:
        """A capture's snapshot data and its SHA-256, made on the encoder thread (a backup
        is streamed to a client, never stored here)."""
        return await asyncio.get_running_loop().run_in_executor(
            self._encoder, _encode_and_hash, captured
        )

    # ------------------------------------------------------------- lifecycle

    async def stop(self) -> None:
        try:
            await cancel_and_wait(self._periodic, self._for_followers_task)
        finally:
            # A snapshot asked for and not made ends with the member: its asker (a background
            # task) is cancelled instead of waiting until the event loop destroys it, which
            # it took for a broken invariant.
            _cancel(self._requests)
            self._encoder.shutdown(wait=True)


def _cancel(futures: list[asyncio.Future[int]]) -> None:
    for future in futures:
        future.cancel()


class LeaderSnapshots:
    """The Storage Raft reads: DiskStorage, except that the snapshot it hands a follower
    comes from ``make_snapshot`` (``Snapshots.for_follower``)."""

    def __init__(self, storage: DiskStorage, make_snapshot: Callable[[], Snapshot]) -> None:
        self._storage = storage
        self._make_snapshot = make_snapshot

    def initial_state(self) -> tuple[HardState, ConfState]:
        return self._storage.initial_state()

    def entries(self, lo: Index, hi: Index, max_size: int | None = None) -> list[Entry]:
        return self._storage.entries(lo, hi, max_size)

    def term(self, index: Index) -> Term:
        return self._storage.term(index)

    def first_index(self) -> Index:
        return self._storage.first_index()

    def last_index(self) -> Index:
        return self._storage.last_index()

    def snapshot(self) -> Snapshot:
        return self._make_snapshot()
