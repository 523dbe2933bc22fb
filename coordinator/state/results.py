"""Successful answers of applied commands. Failures are in :mod:`.errors`."""

from __future__ import annotations

from dataclasses import dataclass

from .codec import record
from .errors import Failure
from .jobs import CheckpointInfo, MemorySnapshotInfo, RoundState
from .values import KeyValue


@dataclass(frozen=True, slots=True)
class Success:
    """Base of every successful answer."""


@record(100)
@dataclass(frozen=True, slots=True)
class NoOp(Success):
    """An empty entry (the leader's no-op on election) was applied."""


@dataclass(frozen=True, slots=True)
class ClusterVersionResult(Success):
    """A ClusterVersion command was applied: the cluster version after it, and whether it
    rose. Not a registered record: ClusterVersion carries no session, so its answer is never
    cached (encoded) in one; it only reaches the leader's waiter."""

    version: int
    raised: bool


@record(101)
@dataclass(frozen=True, slots=True)
class PutResult(Success):
    kv: KeyValue
    prev: KeyValue | None


@record(102)
@dataclass(frozen=True, slots=True)
class DeleteResult(Success):
    """``deleted`` counts the keys; ``prev`` lists them in key order when asked for."""

    deleted: int
    prev: tuple[KeyValue, ...]


@record(103)
@dataclass(frozen=True, slots=True)
class CompareAndSetResult(Success):
    """On success ``kv`` is the stored key; on failure the current one (None if absent)."""

    succeeded: bool
    kv: KeyValue | None


@record(104)
@dataclass(frozen=True, slots=True)
class AddResult(Success):
    value: int
    kv: KeyValue


@record(105)
@dataclass(frozen=True, slots=True)
class LeaseGrantResult(Success):
    """``lease_id`` and ``fencing_token`` are both the raft index of the grant."""

    lease_id: int
    fencing_token: int
    ttl_ms: int


@record(106)
@dataclass(frozen=True, slots=True)
class LeaseEndResult(Success):
    """A lease was revoked or expired; its keys were deleted, in key order."""

    lease_id: int
    deleted_keys: tuple[bytes, ...]


@record(107)
@dataclass(frozen=True, slots=True)
class SessionOpenResult(Success):
    session_id: int
    ttl_ms: int


@record(108)
@dataclass(frozen=True, slots=True)
class SessionKeepAliveResult(Success):
    ttl_ms: int


@record(109)
@dataclass(frozen=True, slots=True)
class SessionCloseResult(Success):
    session_id: int


# ---------------------------------------------------------------- rendezvous (tags 140-149)


@record(140)
@dataclass(frozen=True, slots=True)
class ConfigureResult(Success):
    """``created``: the job did not exist, or was closed, and now is open."""

    job: str
    created: bool


@record(141)
@dataclass(frozen=True, slots=True)
class JoinResult(Success):
    """``round`` is the job's current round; ``waiting`` when the participant waits for
    the next one."""

    job: str
    participant_id: int
    round: int
    waiting: bool


@record(147)
@dataclass(frozen=True, slots=True)
class JoinBatchResult(Success):
    """A JoinBatch applied: the participants' ids and waiting flags in request order, and the
    job's current round (number and state) after the batch."""

    job: str
    participant_ids: tuple[int, ...]
    waiting: tuple[bool, ...]
    round: int
    state: RoundState


@record(148)
@dataclass(frozen=True, slots=True)
class DrainResult(Success):
    """A Drain applied: ``changed`` is False when the domain already was (or was not)
    drained; ``ended`` the (job, round) pairs whose ACTIVE round it ended, in job order."""

    domain: str
    changed: bool
    ended: tuple[tuple[str, int], ...]


@record(142)
@dataclass(frozen=True, slots=True)
class RemoveResult(Success):
    """A participant left, was evicted or failed. ``removed`` is False for a stale
    MemberFailed (nothing changed); ``ended_round`` is the round this ended, or 0."""

    job: str
    participant_id: int
    removed: bool
    ended_round: int


@record(143)
@dataclass(frozen=True, slots=True)
class CloseRoundResult(Success):
    """``closed`` is False when the proposal was stale or the condition did not hold."""

    job: str
    round: int
    closed: bool


@record(144)
@dataclass(frozen=True, slots=True)
class CloseJobResult(Success):
    """``ended_round`` is 0 when the job was already closed."""

    job: str
    ended_round: int


@record(145)
@dataclass(frozen=True, slots=True)
class RoundTrainedResult(Success):
    """``recorded`` is False when the proposal was stale or the time was already known."""

    job: str
    round: int
    recorded: bool


@record(146)
@dataclass(frozen=True, slots=True)
class PruneJobsResult(Success):
    """The jobs removed, in id order."""

    pruned: tuple[str, ...]


# ---------------------------------------------------------------- round store (tags 150-154)


@record(150)
@dataclass(frozen=True, slots=True)
class StoreSetResult(Success):
    pass


@record(151)
@dataclass(frozen=True, slots=True)
class StoreAddResult(Success):
    value: int


@record(152)
@dataclass(frozen=True, slots=True)
class StoreCompareSetResult(Success):
    """``value`` is what the key holds after the command (None: absent)."""

    swapped: bool
    value: bytes | None


@record(153)
@dataclass(frozen=True, slots=True)
class StoreDeleteResult(Success):
    existed: bool


# ---------------------------------------------------------------- checkpoints (tags 155-159)


@record(155)
@dataclass(frozen=True, slots=True)
class CheckpointBeginResult(Success):
    checkpoint_id: int


@record(156)
@dataclass(frozen=True, slots=True)
class ShardDoneResult(Success):
    """``reported`` distinct ranks of ``world_size`` have reported their shard."""

    checkpoint_id: int
    reported: int
    world_size: int


@record(157)
@dataclass(frozen=True, slots=True)
class CheckpointCommitResult(Success):
    """``retired``: committed checkpoints dropped beyond keep_checkpoints, oldest first."""

    checkpoint: CheckpointInfo
    retired: tuple[CheckpointInfo, ...]


@record(158)
@dataclass(frozen=True, slots=True)
class CheckpointAbortResult(Success):
    checkpoint_id: int


@record(159)
@dataclass(frozen=True, slots=True)
class MemorySnapshotCommitResult(Success):
    """The memory snapshot now recorded as the job's latest."""

    snapshot: MemorySnapshotInfo


Result = Success | Failure
"""What ``StateMachine.apply`` returns."""
