"""What the gRPC servicers need from a running member: the seam between the two.

The servicers (``coordinator/service``) validate requests, turn them into state-machine
commands, and map outcomes to gRPC statuses. The member (``node/driver.py``) runs Raft:
it proposes, waits for the entry to apply, and answers reads. This module is the contract
between them, so each side can be tested with a double of the other.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypedDict

if TYPE_CHECKING:
    from typing_extensions import Unpack

from ..backup_file import BackupHeader
from ..liveness.port import LivenessPort
from ..state.commands import Command
from ..state.results import Result
from ..state.values import Event
from ..state.view import StateView


class NodeError(Exception):
    """Base of the outcomes a member reports instead of an answer."""


class NodeStartError(NodeError):
    """The member cannot start; the message says why and what to do."""


class NotLeaderError(NodeError):
    """This member is not the leader. ``leader_address`` is the leader's client address, or
    None when no leader is known (an election is under way)."""

    def __init__(self, leader_id: int, leader_address: str | None) -> None:
        hint = f" (leader is member {leader_id} at {leader_address})" if leader_address else ""
        super().__init__(f"this member is not the leader{hint}")
        self.leader_id = leader_id
        self.leader_address = leader_address


class NoLeaderError(NotLeaderError):
    def __init__(self) -> None:
        NodeError.__init__(self, "the cluster has no leader right now (an election is under way)")
        self.leader_id = 0
        self.leader_address = None


class CutOffError(NoLeaderError):
    """This member's batch heartbeat streams end: no leader took its reports lately."""

    def __init__(self, member_id: int) -> None:
        NodeError.__init__(
            self,
            f"member {member_id} has not reached a leader lately: send heartbeats to another "
            "member",
        )
        self.leader_id = 0
        self.leader_address = None


class ProposalTimeoutError(NodeError):
    """The proposal or read did not complete within the deadline; it may still apply."""


class MemberStoppingError(NodeError):
    """This member stopped while the request waited: a proposal may still apply through the
    others (a retry with the same session and sequence is answered once, from the cache)."""

    def __init__(self, member_id: int) -> None:
        super().__init__(
            f"member {member_id} is shutting down; the request may still apply: retry at "
            "another member"
        )


class ProposalDroppedError(NodeError):
    """Raft refused the proposal (leadership transfer in progress, a pending conf change...)."""


class CompactedWatchError(NodeError):
    """A watch asked for revisions older than the retained history."""

    def __init__(self, requested: int, first_available: int) -> None:
        super().__init__(
            f"revision {requested} was compacted; the oldest available revision is "
            f"{first_available}"
        )
        self.requested = requested
        self.first_available = first_available


class LearnerNotReadyError(NodeError):
    """A learner's log is too far behind the leader's to make it a voter yet."""

    def __init__(
        self, member_id: int, match: int, leader_last: int, *, abstaining: bool = False
    ) -> None:
        why = (
            "it started without data and the leader has not yet heard from it that it caught "
            "up (until then its acknowledgements count toward no quorum)"
            if abstaining
            else f"its log matches the leader's up to entry {match} of {leader_last} (it "
            f"needs {PROMOTE_READY_PERCENT}%)"
        )
        super().__init__(
            f"member {member_id} is not ready to be promoted: {why}; wait for it to catch up "
            "and try again"
        )
        self.member_id = member_id


# A learner becomes a voter only once its log matches this share of the leader's (as etcd).
PROMOTE_READY_PERCENT = 90


class MemberNotFoundError(NodeError):
    def __init__(self, member_id: int) -> None:
        super().__init__(f"member {member_id} is not in the cluster")
        self.member_id = member_id


@dataclass(frozen=True, slots=True)
class Member:
    member_id: int
    peer_address: str
    client_address: str
    is_learner: bool


@dataclass(frozen=True, slots=True)
class PeerProgress:
    member_id: int
    match_index: int
    next_index: int
    state: str  # "probe", "replicate" or "snapshot"
    recent_active: bool


@dataclass(frozen=True, slots=True)
class NodeStatus:
    member_id: int
    cluster_id: int
    term: int
    leader_id: int
    role: str  # "leader", "follower", "candidate", "pre-candidate"
    commit_index: int
    applied_index: int
    snapshot_index: int
    members: tuple[Member, ...]
    progress: tuple[PeerProgress, ...]  # empty unless this member leads
    # True while this member lost its data and has not caught up: it does not vote.
    abstaining: bool = False
    # The cluster version this member applied (coordinator/version.py).
    cluster_version: int = 1


@dataclass(frozen=True, slots=True)
class Header:
    """What every response header carries."""

    revision: int
    raft_term: int
    leader_id: int
    member_id: int


class MembershipChanges(Protocol):
    """Membership changes, on the leader (``node/membership.py``). Raise NotLeaderError,
    MemberNotFoundError, LearnerNotReadyError, ProposalDroppedError, ProposalTimeoutError."""

    async def add(
        self, peer_address: str, client_address: str, as_learner: bool, timeout_s: float = 10.0
    ) -> Member: ...

    async def remove(self, member_id: int, timeout_s: float = 10.0) -> None: ...

    async def promote(self, member_id: int, timeout_s: float = 10.0) -> Member:
        """Learner to voter, once the learner's log has caught up."""
        ...

    async def transfer_leader(self, target_id: int, timeout_s: float = 10.0) -> int:
        """Hand leadership to ``target_id`` (0: the most up-to-date voter); return the new
        leader's id."""
        ...


class ProposeOptions(TypedDict, total=False):
    """How ``ServerNode.propose`` proposes: under a client's session (``session_id``,
    ``sequence``, ``first_unacked``; 0: none), waiting at most ``timeout_s`` (default 5.0),
    only as this leader's entry of ``term`` (default None: any)."""

    session_id: int
    sequence: int
    first_unacked: int
    timeout_s: float
    term: int | None


class ServerNode(Protocol):
    """A running member, as the servicers see it. All methods are called on the event loop."""

    @property
    def member_id(self) -> int: ...

    @property
    def cluster_id(self) -> int: ...

    @property
    def state(self) -> StateView:
        """The applied state, read-only (only the member's apply path changes it); read it
        only after ``read_barrier`` for linearizable reads."""
        ...

    def header(self) -> Header: ...

    async def propose(self, command: Command, **options: Unpack[ProposeOptions]) -> Result:
        """Replicate ``command`` and return its result once applied on this member.
        ``term``: only as this member's entry while it leads in that term; dropped
        (ProposalDroppedError), never forwarded to another leader, otherwise.

        Raises NotLeaderError / NoLeaderError, ProposalDroppedError, ProposalTimeoutError.
        """
        ...

    def submit(self, command: Command, **options: Unpack[ProposeOptions]) -> asyncio.Future[Result]:
        """``propose`` without a task: ``command`` is proposed before this returns (or
        refused: it raises what ``propose`` raises at once), and the future ends as
        ``propose`` would. Cancelling the future stops the wait, not the proposal. For
        callers proposing many commands in one turn of the loop (``service/kv_batch.py``)."""
        ...

    def leader_term(self) -> int | None:
        """This member's term while it leads (as the Raft core knows it now), else None."""
        ...

    def leader_since(self, term: int) -> float | None:
        """When (``time.monotonic()``) this member saw itself become leader in ``term``; None
        if it has not (yet) seen that."""
        ...

    def require_leader(self) -> None:
        """Raise NotLeaderError (with the leader's address if known) unless this member
        leads."""
        ...

    async def read_barrier(self, timeout_s: float = 5.0) -> None:
        """Return once this member has applied everything committed when the call was made
        (ReadIndex). Raises NotLeaderError / NoLeaderError, ProposalTimeoutError."""
        ...

    def watch(self, start_revision: int, key: bytes, prefix: bool) -> AsyncIterator[list[Event]]:
        """Events from ``start_revision`` on (0 = from the next change), in revision order,
        batched per revision, with no gaps and no duplicates. Raises CompactedWatchError
        (when iterated) if the start revision is no longer in the history."""
        ...

    def lease_keep_alive(self, lease_id: int) -> int | None:
        """Leader only: extend the lease; return its TTL in ms, or None if unknown.
        Raises NotLeaderError on a follower."""
        ...

    def lease_remaining_ms(self, lease_id: int) -> int | None:
        """Leader only: milliseconds before the lease expires, None if unknown."""
        ...

    def status(self) -> NodeStatus: ...

    # -- rendezvous: failure detection and time ----------------------------------------

    @property
    def liveness(self) -> LivenessPort:
        """This member's failure detection, as the heartbeat streams and GetJob use it."""
        ...

    def leader_clock_ms(self) -> int:
        """This member's wall clock, in the state machine's time base (for reason strings)."""
        ...

    async def wait_for_apply(self, timeout_s: float) -> bool:
        """Wait until the next batch of entries is applied; False on timeout. Waits on the
        round store and job watches re-check their condition after each return."""
        ...

    @property
    def membership(self) -> MembershipChanges:
        """The configuration changes an operator asks for (``node/membership.py``)."""
        ...

    async def snapshot_now(self) -> int:
        """Write a snapshot at the applied index and compact; return the snapshot's index."""
        ...

    async def backup(self) -> tuple[BackupHeader, bytes]:
        """On the leader: the state at the applied index as a backup file's header and
        payload (``backup_file.py``), encoded off the event loop. NotLeaderError elsewhere."""
        ...
