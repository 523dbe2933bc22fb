"""The Raft wire and storage vocabulary (etcd-io/raft's ``raftpb``), as frozen dataclasses.

Everything the consensus core consumes or produces is one of these values: entries in the
log, the hard state that must be persisted before messages that depend on it are sent,
snapshots with their metadata, configuration changes, and the messages exchanged between
peers. They are immutable so that a ``Ready`` handed to the application can be persisted,
sent and applied without the core changing it underneath.

Names follow etcd-io/raft so a reader can hold the two side by side: ``MsgApp``,
``MsgVote``, ``HardState``, ``ConfState``. ``NONE`` (node id 0) means "no node", as
etcd's ``None`` does; real node ids are positive.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import NewType

NodeId = NewType("NodeId", int)
Term = NewType("Term", int)
Index = NewType("Index", int)

#: The absent node id: "no leader", "voted for nobody".
NONE = NodeId(0)

#: The largest term, index or node id the codec accepts (raft/codec.py; well below 2^64 so
#: that a value plus one still fits the WAL's unsigned 64-bit integers).
MAX_VALUE = 2**62 - 1
#: The highest term a node adopts or campaigns for; a message with a higher term is refused
#: (``TermOutOfRangeError``), never adopted. Derived from the codec's bound so the two always
#: agree: every term a node can reach leaves 2^32 elections below ``MAX_VALUE``, so its next
#: vote request still encodes, and one message with a huge term (a bug, a bit flip) cannot
#: leave a cluster with no term left to elect in. Honest elections never come near it: a term
#: a microsecond for 100,000 years is about 2^52.
MAX_TERM = Term(MAX_VALUE - 2**32)


class EntryType(enum.IntEnum):
    """What an entry's ``data`` holds."""

    NORMAL = 0
    """Application data (or empty: the leader's no-op on election)."""
    CONF_CHANGE = 1
    """An encoded :class:`ConfChange` (see :mod:`rallypoint.raft.codec`)."""


@dataclass(frozen=True, slots=True)
class Entry:
    """One log entry. Invariant: ``index >= 1`` and ``term >= 1`` for any stored entry."""

    term: Term
    index: Index
    type: EntryType = EntryType.NORMAL
    data: bytes = b""


@dataclass(frozen=True, slots=True)
class HardState:
    """The state that must reach stable storage before dependent messages are sent.

    Invariant: ``term`` and ``vote`` never go backwards within a term (a node votes at most
    once per term), and ``commit`` never decreases.
    """

    term: Term = Term(0)
    vote: NodeId = NONE
    commit: Index = Index(0)

    def is_empty(self) -> bool:
        return self == EMPTY_HARD_STATE


EMPTY_HARD_STATE = HardState()


@dataclass(frozen=True, slots=True)
class ConfState:
    """A configuration, possibly joint (thesis section 4.3).

    ``voters`` is the incoming (or only) majority config; ``voters_outgoing`` is non-empty
    only while in a joint configuration. ``learners`` receive the log but do not vote.
    ``learners_next`` holds voters being demoted to learners, which become learners when
    the joint configuration is left (a node cannot be a voter and a learner at once).
    Invariant: ids are sorted tuples, so equal configurations compare and encode equal.
    """

    voters: tuple[NodeId, ...] = ()
    learners: tuple[NodeId, ...] = ()
    voters_outgoing: tuple[NodeId, ...] = ()
    learners_next: tuple[NodeId, ...] = ()
    auto_leave: bool = False


@dataclass(frozen=True, slots=True)
class SnapshotMetadata:
    """Which prefix of the log a snapshot replaces, and the configuration at its end."""

    conf_state: ConfState = field(default_factory=ConfState)
    index: Index = Index(0)
    term: Term = Term(0)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The application's state up to ``metadata.index``; ``data`` is opaque to the core."""

    data: bytes = b""
    metadata: SnapshotMetadata = field(default_factory=SnapshotMetadata)

    def is_empty(self) -> bool:
        return self.metadata.index == 0


EMPTY_SNAPSHOT = Snapshot()


class ConfChangeType(enum.IntEnum):
    ADD_NODE = 0
    """Add a voter, or promote a learner to voter."""
    REMOVE_NODE = 1
    ADD_LEARNER_NODE = 2
    """Add a learner, or demote a voter to learner (through a joint configuration)."""


class ConfChangeTransition(enum.IntEnum):
    """How a change that needs joint consensus leaves the joint configuration."""

    AUTO = 0
    """Single changes apply directly; multiple changes enter joint and leave automatically."""
    JOINT_IMPLICIT = 1
    """Always enter joint; the leader proposes the leave as soon as the entry commits."""
    JOINT_EXPLICIT = 2
    """Always enter joint; the application proposes an empty ConfChange to leave."""


@dataclass(frozen=True, slots=True)
class ConfChangeSingle:
    type: ConfChangeType
    node_id: NodeId


@dataclass(frozen=True, slots=True)
class ConfChange:
    """A configuration change (etcd's ConfChangeV2). An empty ``changes`` leaves a joint config.

    ``context`` is opaque to the core; the coordinator stores the new member's addresses
    there.
    """

    changes: tuple[ConfChangeSingle, ...] = ()
    transition: ConfChangeTransition = ConfChangeTransition.AUTO
    context: bytes = b""

    def leave_joint(self) -> bool:
        """True for the empty change that asks to leave a joint configuration."""
        return not self.changes


class MessageType(enum.IntEnum):
    MsgHup = 0
    """Local: start an election (campaign); pre-vote first when enabled."""
    MsgBeat = 1
    """Local: the leader should send heartbeats."""
    MsgProp = 2
    """A proposal; forwarded by followers to the leader when allowed."""
    MsgApp = 3
    MsgAppResp = 4
    MsgVote = 5
    MsgVoteResp = 6
    MsgSnap = 7
    MsgHeartbeat = 8
    MsgHeartbeatResp = 9
    MsgUnreachable = 10
    """Local: the transport could not reach ``from_``; its probe should pause."""
    MsgSnapStatus = 11
    """Local: a snapshot send to ``from_`` finished (``reject`` means it failed)."""
    MsgCheckQuorum = 12
    """Local: the leader should check it has heard from a quorum recently."""
    MsgTransferLeader = 13
    MsgTimeoutNow = 14
    MsgReadIndex = 15
    MsgReadIndexResp = 16
    MsgPreVote = 17
    MsgPreVoteResp = 18


#: Messages produced and consumed on the same node; never sent over the network.
LOCAL_MESSAGES = frozenset(
    {
        MessageType.MsgHup,
        MessageType.MsgBeat,
        MessageType.MsgUnreachable,
        MessageType.MsgSnapStatus,
        MessageType.MsgCheckQuorum,
    }
)

#: Responses: the receiver must not change its term because of a lower-term one of these.
RESPONSE_MESSAGES = frozenset(
    {
        MessageType.MsgAppResp,
        MessageType.MsgVoteResp,
        MessageType.MsgHeartbeatResp,
        MessageType.MsgUnreachable,
        MessageType.MsgReadIndexResp,
        MessageType.MsgPreVoteResp,
    }
)


def vote_resp_type(msg_type: MessageType) -> MessageType:
    """The response type for a (pre-)vote request."""
    if msg_type is MessageType.MsgVote:
        return MessageType.MsgVoteResp
    if msg_type is MessageType.MsgPreVote:
        return MessageType.MsgPreVoteResp
    raise ValueError(f"not a vote message: {msg_type.name}")


@dataclass(frozen=True, slots=True)
class Message:
    """A message between peers (or a local input to ``step``).

    Field use follows etcd-io/raft: for ``MsgApp`` ``index``/``log_term`` name the entry
    preceding ``entries``; for ``MsgAppResp`` ``index`` is the highest index the follower
    now matches (or, with ``reject``, the rejected index, with ``reject_hint`` and
    ``log_term`` pointing at where to probe next: fast backtracking, thesis 5.3); for votes
    ``index``/``log_term`` describe the candidate's last entry.
    """

    type: MessageType
    to: NodeId = NONE
    from_: NodeId = NONE
    term: Term = Term(0)
    log_term: Term = Term(0)
    index: Index = Index(0)
    entries: tuple[Entry, ...] = ()
    commit: Index = Index(0)
    snapshot: Snapshot | None = None
    reject: bool = False
    reject_hint: Index = Index(0)
    context: bytes = b""


@dataclass(frozen=True, slots=True)
class ReadState:
    """A ReadIndex result: once ``applied >= index`` a read tagged ``request_ctx`` is safe."""

    index: Index
    request_ctx: bytes
