"""The application's handle on a Raft node: inputs in, ``Ready`` batches out.

Theory of operation (etcd-io/raft ``rawnode.go``, without asynchronous storage writes): the
application feeds ticks, network messages and requests into the node, then asks for a
``Ready`` whenever ``has_ready()``. For each Ready, in this order, it must

1. send ``messages`` (at once: they vouch for nothing unpersisted: appends, heartbeats and
   their answers, vote requests, forwarded proposals and reads),
2. persist ``hard_state``, ``entries`` and ``snapshot``, with an fsync when ``must_sync``
   (a new term, vote or entries; a commit index alone may be lost in a crash and relearned;
   storage makes an installed snapshot durable whatever ``must_sync`` says),
3. send ``messages_after_persist`` (they vouch for what was just persisted: votes and
   append acknowledgements, thesis 3.8),
4. apply ``committed_entries`` in order (``apply_conf_change`` for CONF_CHANGE entries),
5. call ``advance(rd)``.

The core, not the application, decides which list a message belongs in: the algorithm puts
what it sends on behalf of unpersisted state (its ``msgs_after_append``) apart from the rest
(``msgs``), as etcd-io/raft's ``msgs`` and ``msgsAfterAppend``; the application never
sorts messages by type. The split means a follower busy persisting a long catch-up still
answers heartbeats on time, and a leader replicates while it writes (thesis 10.2.1).
``must_sync`` is likewise computed here: true exactly when the Ready carries entries or its
hard state changes term or vote.

``ready()`` marks what it hands out as in progress, so two Ready without an ``advance``
between them are refused. ``advance`` tells the log what is now stable and applied, and steps
back in the responses the node addressed to itself: the leader's acknowledgement of its own
appended entries and a candidate's own vote, which count only once persisted (thesis 3.8).
Committed entries are handed out only once persisted locally.

The algorithm (``Raft``) is private to this handle: the application reads what it needs
through ``basic_status()`` (cheap: ids, hard and soft state, applied and pending
configuration indexes) and ``status()`` (also copies of the followers' progress), as etcd's
``BasicStatus``/``Status``, so nothing outside ``raft/`` can change the core's state except
through the inputs above.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field

from .codec import encode_conf_change
from .errors import StepLocalMsgError, StepPeerNotFoundError
from .log_storage import entries_size
from .raft import Config, Raft, SoftState, StateType, payloads_size
from .tracker import Progress
from .types import (
    EMPTY_HARD_STATE,
    EMPTY_SNAPSHOT,
    LOCAL_MESSAGES,
    NONE,
    RESPONSE_MESSAGES,
    ConfChange,
    ConfState,
    Entry,
    EntryType,
    HardState,
    Index,
    Message,
    MessageType,
    NodeId,
    ReadState,
    Snapshot,
    Term,
)

__all__ = ["BasicStatus", "RawNode", "Ready", "SnapshotStatus", "SoftState", "Status"]


@dataclass(frozen=True, slots=True)
class Ready:
    """One batch of work for the application (see the module docstring for the order)."""

    soft_state: SoftState | None = None
    """The new soft state, or None if unchanged since the last Ready."""
    hard_state: HardState = EMPTY_HARD_STATE
    """The hard state to persist, or EMPTY_HARD_STATE if unchanged."""
    read_states: tuple[ReadState, ...] = ()
    entries: tuple[Entry, ...] = ()
    """Entries to persist (append, overwriting any suffix from their first index)."""
    snapshot: Snapshot = EMPTY_SNAPSHOT
    """A snapshot to persist and restore the state machine from, or EMPTY_SNAPSHOT."""
    committed_entries: tuple[Entry, ...] = ()
    """Entries to apply, in order."""
    messages: tuple[Message, ...] = ()
    """Messages to send now, before persisting (they vouch for nothing unpersisted)."""
    messages_after_persist: tuple[Message, ...] = ()
    """Messages to send only once the above is persisted (votes, append acks)."""
    must_sync: bool = False
    """True if the writes must be synced to disk (entries, term or vote changed)."""

    def contains_updates(self) -> bool:
        return (
            self.soft_state is not None
            or not self.hard_state.is_empty()
            or not self.snapshot.is_empty()
            or bool(self.entries)
            or bool(self.committed_entries)
            or bool(self.messages)
            or bool(self.messages_after_persist)
            or bool(self.read_states)
        )


class SnapshotStatus(enum.Enum):
    FINISH = 1
    FAILURE = 2


@dataclass(frozen=True, slots=True)
class BasicStatus:
    """A consistent copy of a node's scalar state (etcd's ``BasicStatus``): what a driver
    reads between Readies, without copying the followers' progress."""

    id: NodeId
    hard_state: HardState
    soft_state: SoftState
    applied: Index
    lead_transferee: NodeId
    pending_conf_index: Index
    """The index of the last configuration change proposed by this leader (0 if none).
    Invariant: a new change may be proposed only once ``applied >= pending_conf_index``."""
    lead_commit: Index
    """The highest commit index the current leader reported in an append of the current term
    (0 before one arrived), as the leader sent it: not clipped to the entries this node
    received, as its own commit index is. See ``RawNode.set_abstain``."""
    lead_commit_first: Index
    """The commit index in the first append of the current leader in the current term this
    node received since it started (0 before one arrived)."""

    def conf_change_pending(self) -> bool:
        """True while a configuration change this leader proposed is not yet applied."""
        return self.pending_conf_index > self.applied


@dataclass(frozen=True, slots=True)
class Status:
    """A consistent copy of a node's state, for monitoring and tests."""

    id: NodeId
    hard_state: HardState
    soft_state: SoftState
    applied: Index
    progress: dict[NodeId, Progress] = field(default_factory=dict)
    """Copies of the followers' progress; empty unless leader."""
    lead_transferee: NodeId = NONE
    conf_state: ConfState = field(default_factory=ConfState)


@dataclass(frozen=True, slots=True)
class _PendingAdvance:
    """What a handed-out Ready will make stable or applied once advanced."""

    term: Term
    """The term when the Ready was accepted: a term change voids the stable mark."""
    stable_index: Index
    stable_term: Term
    """The last unstable entry when accepted (0/0 if none): persisted up to it."""
    snapshot_index: Index
    self_messages: tuple[Message, ...]


class RawNode:
    """A Raft node driven by the application. Not thread-safe."""

    def __init__(self, config: Config) -> None:
        self._raft = Raft(config)
        # Soft and hard state as of the last Ready handed out (to report only changes).
        self._prev_soft_state = self._raft.soft_state()
        self._prev_hard_state = self._raft.hard_state()
        # Set between ready() and advance(): what advance will mark stable and step in.
        self._pending: _PendingAdvance | None = None

    # -- inputs -------------------------------------------------------------------------

    def tick(self) -> None:
        """Advance the logical clock by one tick."""
        self._raft.tick()

    def campaign(self) -> None:
        """Start an election now (pre-vote first if enabled)."""
        self._raft.step(Message(type=MessageType.MsgHup))

    def propose(self, data: bytes) -> None:
        """Propose ``data`` for the log; raises ProposalDroppedError if refused."""
        self.propose_many((data,))

    def propose_many(self, datas: Sequence[bytes]) -> None:
        """Propose every ``data`` for the log, in order, as one message (one append, one
        MsgApp per follower); raises ProposalDroppedError if refused (all of them)."""
        self._raft.step(
            Message(
                type=MessageType.MsgProp,
                from_=self._raft.id,
                entries=tuple(Entry(Term(0), Index(0), EntryType.NORMAL, data) for data in datas),
            )
        )

    def propose_conf_change(self, cc: ConfChange) -> None:
        """Propose a configuration change; raises ProposalDroppedError if refused.

        A change proposed while another is unapplied (or inconsistent with joint state) is
        replaced by an empty normal entry, which the proposer sees applied instead.
        """
        self._raft.step(
            Message(
                type=MessageType.MsgProp,
                from_=self._raft.id,
                entries=(Entry(Term(0), Index(0), EntryType.CONF_CHANGE, encode_conf_change(cc)),),
            )
        )

    def apply_conf_change(self, cc: ConfChange) -> ConfState:
        """Apply a committed change (call when its entry is applied); the new config."""
        return self._raft.apply_conf_change(cc)

    def step(self, m: Message) -> None:
        """Feed a message received from a peer."""
        if m.type in LOCAL_MESSAGES:
            raise StepLocalMsgError(f"cannot step local message {m.type.name} from the network")
        if m.type in RESPONSE_MESSAGES and m.from_ not in self._raft.trk.progress:
            raise StepPeerNotFoundError(f"no peer {m.from_} for {m.type.name}")
        self._raft.step(m)

    def read_index(self, ctx: bytes) -> None:
        """Request a linearizable read tagged ``ctx``; the answer comes as a ReadState."""
        self._raft.step(
            Message(
                type=MessageType.MsgReadIndex,
                entries=(Entry(Term(0), Index(0), EntryType.NORMAL, ctx),),
            )
        )

    def transfer_leader(self, transferee: NodeId) -> None:
        """Ask the leader to hand leadership to ``transferee`` (thesis 3.10)."""
        self._raft.step(Message(type=MessageType.MsgTransferLeader, from_=transferee))

    def set_abstain(self, abstain: bool) -> None:
        """Stop (or resume) voting and campaigning: see ``Config.abstain``. The application
        persists the flag and clears it once this node has caught up: its durable commit index
        reaches the commit index the current leader reported (``BasicStatus.lead_commit``,
        read with the Ready whose hard state holds that commit), which rose above the first
        one it reported (``lead_commit_first``), and holds an entry of the leader's term
        there. The rise was counted without this node (peers do not count an abstaining
        node's acknowledgements), so the leader's term is not one a majority had left behind
        before the loss; and everything the leader had committed is here, the entries the
        node acknowledged before it lost its data included. Its own commit index alone
        is not enough: it is clipped to the entries received, so a node holding the first
        few entries of the leader's term would pass while the leader's commit is far ahead,
        and its vote could elect a node lacking entries committed with its lost
        acknowledgements.

        Stopping records a vote for the leader it follows, if it has none in this term: it
        may have voted in this term before it lost its data, and, restarted, it would
        otherwise grant another candidate of the term a second vote (persisted with the next
        Ready, like any vote)."""
        r = self._raft
        if r.abstain and not abstain and r.vote == NONE and r.lead != NONE:
            r.vote = r.lead
        r.abstain = abstain

    @property
    def abstaining(self) -> bool:
        return self._raft.abstain

    def report_abstaining(self, node_id: NodeId, abstaining: bool) -> None:
        """Whether ``node_id`` says it abstains (lost its data, not caught up yet): report
        it with every message received from it, before stepping them. Its acknowledgements
        count toward no quorum while it does (``Raft.abstaining_peers``)."""
        self._raft.peer_abstains(node_id, abstaining)

    def peer_abstaining(self, node_id: NodeId) -> bool:
        """Whether ``node_id`` abstains as far as this node last heard (``report_abstaining``)."""
        return node_id in self._raft.abstaining_peers

    def report_lost_data(self, node_id: NodeId) -> None:
        """``node_id`` came back without its data (a new incarnation that abstains): a
        leader forgets what it recorded the peer holds and probes it again."""
        self._raft.peer_lost_data(node_id)

    def report_unreachable(self, node_id: NodeId) -> None:
        """The transport failed to reach ``node_id``: its replication falls back to probing."""
        self._raft.step(Message(type=MessageType.MsgUnreachable, from_=node_id))

    def report_snapshot(self, node_id: NodeId, status: SnapshotStatus) -> None:
        """Report the outcome of sending a snapshot to ``node_id``."""
        self._raft.step(
            Message(
                type=MessageType.MsgSnapStatus,
                from_=node_id,
                reject=status is SnapshotStatus.FAILURE,
            )
        )

    def forget_leader(self) -> None:
        """Forget the leader (follower only), e.g. because the application knows it left."""
        self._raft.forget_leader()

    def leader_term(self) -> Term | None:
        """This member's term while it leads, else None."""
        r = self._raft
        return r.term if r.state is StateType.LEADER else None

    def last_index(self) -> Index:
        """The index of the last entry in the log (stable or not)."""
        return self._raft.raft_log.last_index()

    def lease_read_index(self) -> tuple[Term, Index] | None:
        """(term, read index) if this leader may serve a read under its lease, else None
        (see ``Raft.lease_read_index``; the caller checks the lease's clock)."""
        r = self._raft
        index = r.lease_read_index()
        return None if index is None else (r.term, index)

    # -- outputs ------------------------------------------------------------------------

    def held_prefix(self, entries: Sequence[Entry]) -> int:
        """How many of ``entries`` (consecutive, as an append carries them), from the first,
        the log (stable or not) already holds exactly: same index, term, type and data."""
        if not entries:
            return 0
        log = self._raft.raft_log
        lo = entries[0].index
        hi = min(int(entries[-1].index), int(log.last_index())) + 1
        if lo < log.first_index() or lo >= hi:  # compacted, or none held
            return 0
        count = 0
        for entry, ours in zip(entries, log.slice(lo, Index(hi)), strict=False):
            if entry != ours:
                break
            count += 1
        return count

    def has_ready(self) -> bool:
        r = self._raft
        if r.soft_state() != self._prev_soft_state:
            return True
        hs = r.hard_state()
        if not hs.is_empty() and hs != self._prev_hard_state:
            return True
        log = r.raft_log
        if log.has_next_unstable_snapshot():
            return True
        if r.msgs or r.msgs_after_append or r.read_states:
            return True
        return log.has_next_unstable_ents() or log.has_next_committed_ents()

    def ready(self) -> Ready:
        """The pending work; must be followed by ``advance(rd)`` before the next one."""
        if self._pending is not None:
            raise RuntimeError("ready() called twice without advance()")
        r = self._raft
        log = r.raft_log
        soft = r.soft_state()
        hard = r.hard_state()
        entries = tuple(log.next_unstable_ents())
        snapshot = log.next_unstable_snapshot() or EMPTY_SNAPSHOT
        committed = tuple(log.next_committed_ents())
        after_persist: list[Message] = []
        self_messages: list[Message] = []
        for m in r.msgs_after_append:
            (self_messages if m.to == r.id else after_persist).append(m)
        rd = Ready(
            soft_state=soft if soft != self._prev_soft_state else None,
            hard_state=hard if hard != self._prev_hard_state else EMPTY_HARD_STATE,
            read_states=tuple(r.read_states),
            entries=entries,
            snapshot=snapshot,
            committed_entries=committed,
            messages=tuple(r.msgs),
            messages_after_persist=tuple(after_persist),
            must_sync=bool(entries)
            or hard.term != self._prev_hard_state.term
            or hard.vote != self._prev_hard_state.vote,
        )

        # Accept: everything handed out is now in progress.
        if rd.soft_state is not None:
            self._prev_soft_state = soft
        if not rd.hard_state.is_empty():
            self._prev_hard_state = hard
        if rd.read_states:
            r.read_states = []
        stable_index, stable_term = Index(0), Term(0)
        if log.has_next_or_in_progress_unstable_ents():
            # Once this Ready is persisted, the log is stable up to its current last entry
            # (earlier Readies were persisted before this one).
            stable_index, stable_term = log.last_index(), log.last_term()
        self._pending = _PendingAdvance(
            term=r.term,
            stable_index=stable_index,
            stable_term=stable_term,
            snapshot_index=snapshot.metadata.index,
            self_messages=tuple(self_messages),
        )
        r.msgs = []
        r.msgs_after_append = []
        log.accept_unstable()
        if committed:
            log.accept_applying(committed[-1].index, entries_size(committed))
        return rd

    def advance(self, rd: Ready) -> None:
        """``rd`` was persisted, its messages sent and its committed entries applied."""
        pending = self._pending
        if pending is None:
            raise RuntimeError("advance() called without a preceding ready()")
        self._pending = None
        r = self._raft
        log = r.raft_log
        if pending.stable_index and pending.term == r.term:
            # After a term change the unstable tail may have been rewritten since the Ready
            # was handed out; the next Ready re-marks it.
            log.stable_to(pending.stable_index, pending.stable_term)
        if pending.snapshot_index:
            r.applied_snap(rd.snapshot)
        # Our own append ack and vote count now that they are persisted.
        for m in pending.self_messages:
            r.step(m)
        if rd.committed_entries:
            r.reduce_uncommitted_size(payloads_size(rd.committed_entries))
            r.applied_to(rd.committed_entries[-1].index, entries_size(rd.committed_entries))

    def basic_status(self) -> BasicStatus:
        r = self._raft
        return BasicStatus(
            id=r.id,
            hard_state=r.hard_state(),
            soft_state=r.soft_state(),
            applied=r.raft_log.applied,
            lead_transferee=r.lead_transferee,
            pending_conf_index=r.pending_conf_index,
            lead_commit=r.lead_commit,
            lead_commit_first=r.lead_commit_first or Index(0),
        )

    def status(self) -> Status:
        r = self._raft
        progress: dict[NodeId, Progress] = {}
        if r.state is StateType.LEADER:
            progress = {node_id: pr.copy() for node_id, pr in r.trk.progress.items()}
        return Status(
            id=r.id,
            hard_state=r.hard_state(),
            soft_state=r.soft_state(),
            applied=r.raft_log.applied,
            progress=progress,
            lead_transferee=r.lead_transferee,
            conf_state=r.trk.conf_state(),
        )
