"""A job's checkpoint registry: begin, per-rank shard reports, commit, abort, latest; and
the job's latest complete in-memory snapshot.

Theory of operation. A checkpoint is begun by a member of the job's ACTIVE round (its id is
the raft index of the begin), every rank 0..world_size-1 reports its shard written, and then
it is committed; only committed checkpoints are ever returned by ``latest``. Every operation
carries the round and its fencing token, and the rendezvous refuses it (``StaleRound``,
``StaleToken``) unless they are the job's current ACTIVE round's, before this module is
called. So a zombie (a worker paused past its failure detection, whose round has since
ended) can neither report a shard nor commit: a checkpoint written by an old world can never
become "latest" after a new world started from an older one.

Pending checkpoints therefore always belong to the current ACTIVE round: when the round
ends they can never commit and are dropped (``drop_pending``). At most
``max_pending_checkpoints`` are pending at once. The registry keeps the last
``keep_checkpoints`` committed ones (from the job's config); a commit returns the ones it
retired, oldest first, so the workers can delete their files.

In-memory snapshots. Workers snapshot their training state into memory every step and
protect each rank's copy on peers (other hosts); once every rank's copy of a step is
protected, one ``MemorySnapshotCommit`` records it as complete. It is fenced exactly as the
disk commands are (the rendezvous checks round and token first), so a zombie can never
record one, and its ``world_size`` must be the round's. The registry keeps only the newest
(``memory``; a later commit replaces it, whatever its step: a round that restarted from an
older disk checkpoint has a newer, lower-stepped state), and keeps it when the round ends:
it is what the next round's ranks all read, and so agree on, to restore from memory.
Nothing is pending for a memory snapshot (the workers complete it before committing), so
there is nothing to drop with the round. In a snapshot of the state machine the registry
carries it as a third element only when there is one (see ``to_obj``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from . import codec
from .commands import (
    CheckpointAbort,
    CheckpointBegin,
    CheckpointCommand,
    CheckpointCommit,
    CheckpointShardDone,
    MemorySnapshotCommit,
)
from .errors import CheckpointIncomplete, CheckpointNotFound, InvalidCommand, LimitExceeded
from .jobs import CheckpointInfo, MemorySnapshotInfo, RendezvousLimits
from .results import (
    CheckpointAbortResult,
    CheckpointBeginResult,
    CheckpointCommitResult,
    MemorySnapshotCommitResult,
    Result,
    ShardDoneResult,
)


@dataclass(slots=True)
class Pending:
    checkpoint_id: int
    step: int
    round: int
    world_size: int
    layout: bytes
    uri: str
    # Ranks that reported their shard. Invariant: a subset of range(world_size).
    reported: set[int] = field(default_factory=set)


class CheckpointRegistry:
    def __init__(self) -> None:
        # Invariant: every pending checkpoint belongs to the job's current ACTIVE round.
        self.pending: dict[int, Pending] = {}
        # Oldest first. Invariant: at most the job's keep_checkpoints entries.
        self.committed: list[CheckpointInfo] = []
        # The newest committed memory snapshot, of any round (None: none yet). Invariant: its
        # snapshot_id is the largest raft index a MemorySnapshotCommit of this job succeeded at.
        self.memory: MemorySnapshotInfo | None = None

    def latest(self) -> CheckpointInfo | None:
        return self.committed[-1] if self.committed else None

    def latest_memory_snapshot(self) -> MemorySnapshotInfo | None:
        return self.memory

    def drop_pending(self) -> None:
        self.pending.clear()

    def forget(self) -> None:
        """A new run of the job starts without the old run's state (``rendezvous.py``,
        "Runs"): nothing is pending, committed or in memory any more."""
        self.pending.clear()
        self.committed.clear()
        self.memory = None

    def execute(
        self,
        job: str,
        index: int,
        now_ms: int,
        round_world_size: int,
        keep: int,
        command: CheckpointCommand,
        limits: RendezvousLimits,
    ) -> Result:
        """Apply an already fenced command (see the module docstring)."""
        if isinstance(command, CheckpointBegin):
            return self._begin(index, round_world_size, command, limits)
        if isinstance(command, MemorySnapshotCommit):
            return self._commit_memory(index, now_ms, round_world_size, command, limits)
        if not isinstance(command, CheckpointShardDone | CheckpointCommit | CheckpointAbort):
            raise AssertionError(f"no rule to execute {command!r}")
        pending = self.pending.get(command.checkpoint_id)
        if pending is None:
            return CheckpointNotFound(job, command.checkpoint_id)
        if isinstance(command, CheckpointShardDone):
            if not 0 <= command.rank < pending.world_size:
                return InvalidCommand(
                    f"rank {command.rank} is outside the checkpoint's world of {pending.world_size}"
                )
            pending.reported.add(command.rank)
            return ShardDoneResult(pending.checkpoint_id, len(pending.reported), pending.world_size)
        if isinstance(command, CheckpointAbort):
            del self.pending[pending.checkpoint_id]
            return CheckpointAbortResult(pending.checkpoint_id)
        missing = tuple(sorted(set(range(pending.world_size)) - pending.reported))
        if missing:
            return CheckpointIncomplete(job, pending.checkpoint_id, missing)
        del self.pending[pending.checkpoint_id]
        info = CheckpointInfo(
            pending.checkpoint_id,
            pending.step,
            pending.round,
            pending.world_size,
            pending.layout,
            pending.uri,
            now_ms,
        )
        self.committed.append(info)
        return CheckpointCommitResult(info, self.trim(keep))

    def trim(self, keep: int) -> tuple[CheckpointInfo, ...]:
        """Drop committed checkpoints beyond the newest ``keep``; the dropped ones."""
        retired = tuple(self.committed[: max(0, len(self.committed) - keep)])
        del self.committed[: len(retired)]
        return retired

    def _begin(
        self, index: int, round_world_size: int, command: CheckpointBegin, limits: RendezvousLimits
    ) -> Result:
        if command.world_size != round_world_size:
            return InvalidCommand(
                f"world_size {command.world_size} is not the round's {round_world_size}"
            )
        if len(command.layout) > limits.max_layout_bytes:
            return LimitExceeded("checkpoint layout bytes", limits.max_layout_bytes)
        if len(command.uri) > limits.max_uri_chars:
            return LimitExceeded("checkpoint uri characters", limits.max_uri_chars)
        if len(self.pending) >= limits.max_pending_checkpoints:
            return LimitExceeded("pending checkpoints per job", limits.max_pending_checkpoints)
        self.pending[index] = Pending(
            index, command.step, command.round, command.world_size, command.layout, command.uri
        )
        return CheckpointBeginResult(index)

    def _commit_memory(
        self,
        index: int,
        now_ms: int,
        round_world_size: int,
        command: MemorySnapshotCommit,
        limits: RendezvousLimits,
    ) -> Result:
        if command.world_size != round_world_size:
            return InvalidCommand(
                f"world_size {command.world_size} is not the round's {round_world_size}"
            )
        if command.step < 0:
            return InvalidCommand(f"step must be >= 0, got {command.step}")
        if len(command.layout) > limits.max_layout_bytes:
            return LimitExceeded("memory snapshot layout bytes", limits.max_layout_bytes)
        if len(command.placement) > limits.max_placement_bytes:
            return LimitExceeded("memory snapshot placement bytes", limits.max_placement_bytes)
        self.memory = MemorySnapshotInfo(
            index,
            command.step,
            command.round,
            command.world_size,
            command.layout,
            command.placement,
            now_ms,
        )
        return MemorySnapshotCommitResult(self.memory)

    # ----------------------------------------------------------------- snapshots

    def to_obj(self) -> list[Any]:
        """``[pending, committed]``, and the memory snapshot as a third element when there
        is one: a registry without one encodes as it did before memory snapshots existed
        (the machine then writes an older snapshot format an older member reads)."""
        pending = [
            [p.checkpoint_id, p.step, p.round, p.world_size, p.layout, p.uri, sorted(p.reported)]
            for p in (self.pending[cid] for cid in sorted(self.pending))
        ]
        committed = [codec.to_obj(info) for info in self.committed]
        if self.memory is None:
            return [pending, committed]
        return [pending, committed, codec.to_obj(self.memory)]

    @classmethod
    def from_obj(cls, obj: Any, *, memory: bool = True) -> CheckpointRegistry:
        """Restore from :meth:`to_obj`'s form; ``memory`` False reads a snapshot format
        written before memory snapshots existed (two elements only)."""
        registry = cls()
        lengths = (2, 3) if memory else (2,)
        if not (isinstance(obj, list) and len(obj) in lengths and isinstance(obj[0], list)):
            raise codec.StateCodecError(f"malformed checkpoint registry: {obj!r}"[:200])
        hints = (int, int, int, int, bytes, str, tuple[int, ...])
        for item in obj[0]:
            if not (isinstance(item, list) and len(item) == len(hints)):
                raise codec.StateCodecError(f"malformed pending checkpoint: {item!r}"[:200])
            cid, step, round_, world, layout, uri, reported = (
                codec.from_obj(part, hint) for part, hint in zip(item, hints, strict=True)
            )
            registry.pending[cid] = Pending(cid, step, round_, world, layout, uri, set(reported))
        registry.committed = [codec.from_obj(info, CheckpointInfo) for info in obj[1]]
        if len(obj) == 3:
            registry.memory = codec.from_obj(obj[2], MemorySnapshotInfo)
        return registry
