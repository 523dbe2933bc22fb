"""The Raft consensus state machine (etcd-io/raft ``raft.go``), pure and single-threaded.

Theory of operation. A ``Raft`` reacts to three kinds of input and produces messages:

- ``tick()``: logical time. Followers and candidates count towards an election timeout
  randomized in ``[election_tick, 2 * election_tick)`` (drawn from the injected ``rng``;
  paper section 5.2); leaders count towards heartbeats and, with check-quorum, towards
  verifying they still hear from a quorum (thesis 6.2).
- ``step(m)``: a message from a peer or a local request (MsgHup, MsgProp, MsgReadIndex ...).
  Terms are compared first (section 5.1: a higher term makes us a follower; a lower one is
  mostly ignored), then the role's step function handles the rest. Roles switch by swapping
  ``step_role`` between ``step_follower``, ``step_candidate`` (also used by pre-candidates)
  and ``step_leader``, and ``tick`` between ``tick_election`` and ``tick_heartbeat``.
- configuration changes applied by the application (``apply_conf_change``).

Outputs accumulate in ``msgs`` (sendable at once: they vouch for nothing unpersisted) and
``msgs_after_append`` (responses that vouch for persisted state: append acks and votes;
those addressed to ourselves are stepped back in by ``RawNode.advance`` once persisted, which
is how a leader counts its own log and a candidate its own vote). Nothing here performs IO,
reads a clock or uses global randomness.

Features, as in production implementations: pre-vote (thesis 9.6), check-quorum and leader
stickiness (followers that recently heard from a leader ignore vote requests, thesis 4.2.3),
a no-op entry on election (thesis 6.4), commit only by counting current-term entries
(section 5.4.2, in ``RaftLog.maybe_commit``), pipelined replication with flow control
(``tracker``; commit notices go unanswered, ``COMMIT_NOTICE_CONTEXT``), fast log
backtracking, ReadIndex reads (thesis 6.4), leadership transfer
(thesis 3.10), joint-consensus membership changes (thesis 4.3) with learners, and snapshots.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from . import confchange
from .codec import decode_conf_change, encode_conf_change
from .confchange import Changer
from .errors import ConfigError, ProposalDroppedError, TermOutOfRangeError
from .log import Logger, RaftLog
from .log_storage import (
    CompactedError,
    SnapshotTemporarilyUnavailableError,
    Storage,
    UnavailableError,
)
from .quorum import VoteResult
from .read_only import ReadOnly, ReadOnlyOption
from .tracker import Progress, ProgressMap, ProgressState, ProgressTracker, TrackerConfig
from .types import (
    MAX_TERM,
    NONE,
    ConfChange,
    ConfChangeTransition,
    ConfChangeType,
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
    vote_resp_type,
)

MT = MessageType
_NO_INDEX = Index(0)


class StateType(enum.Enum):
    """A node's role."""

    FOLLOWER = 0
    CANDIDATE = 1
    LEADER = 2
    PRE_CANDIDATE = 3


class CampaignType(enum.Enum):
    PRE_ELECTION = "CampaignPreElection"
    """The first phase of an election with pre-vote: no term change yet."""
    ELECTION = "CampaignElection"
    """A normal election (the second phase with pre-vote)."""
    TRANSFER = "CampaignTransfer"
    """An election forced by a leadership transfer; overrides leader stickiness."""


#: The context of vote requests of a transfer campaign, which peers honour despite a lease.
CAMPAIGN_TRANSFER_CONTEXT = CampaignType.TRANSFER.value.encode()
#: The context of a commit notice: an entry-less MsgApp sent only because the commit index
#: advanced, to a follower in REPLICATE. Accepting it moves only the follower's commit index,
#: and its answer could tell the leader no more than the answers to the appends before it,
#: which are on their way on the same ordered stream: no probe to end, and heartbeat answers
#: keep the follower recently active. So a follower that accepts one does not answer it
#: (a rejection is answered, as ever). If those answers are lost, the heartbeat answer's
#: empty MsgApp, which is no notice, is answered and moves ``match`` (send_append). Members
#: of earlier releases ignore a MsgApp's context and answer every notice, which the leader
#: takes as any stale answer; their own notices carry no context and are answered.
COMMIT_NOTICE_CONTEXT = b"CommitNotice"

_VOTE_TYPES = frozenset({MT.MsgVote, MT.MsgVoteResp, MT.MsgPreVote, MT.MsgPreVoteResp})
_AFTER_APPEND_TYPES = frozenset({MT.MsgAppResp, MT.MsgVoteResp, MT.MsgPreVoteResp})


@dataclass(frozen=True, slots=True)
class SoftState:
    """Volatile state worth reporting to the application (not persisted)."""

    lead: NodeId
    raft_state: StateType


@dataclass(frozen=True, slots=True)
class Config:
    """Parameters of one Raft node. ``validate()`` raises ConfigError on bad values."""

    id: NodeId
    storage: Storage
    rng: random.Random
    # Ticks without hearing from a leader before campaigning (randomized up to twice this).
    election_tick: int = 10
    # Ticks between leader heartbeats; must be below election_tick.
    heartbeat_tick: int = 1
    # The last applied index when restarting (entries up to it are not handed out again).
    applied: Index = _NO_INDEX
    # Bytes of entries per MsgApp (at least one entry is always sent).
    max_size_per_msg: int = 1 << 20
    # Bytes of committed entries handed out per Ready; 0 means no limit.
    max_committed_size_per_ready: int = 1 << 24
    # Bytes of uncommitted entries a leader accepts before dropping proposals; 0 = no limit.
    max_uncommitted_entries_size: int = 0
    # MsgApps in flight per follower during optimistic replication.
    max_inflight_msgs: int = 256
    # Payload bytes in flight per follower; 0 means no limit.
    max_inflight_bytes: int = 0
    check_quorum: bool = True
    pre_vote: bool = True
    read_only_option: ReadOnlyOption = ReadOnlyOption.SAFE
    # The application serves reads under a leader lease timed on its own monotonic clock
    # (coordinator/node/reads.py, whose docstring holds the safety argument). The core's part:
    # a node refuses (pre-)votes for an election timeout after it starts, as if it had just
    # heard from a leader (it may have acknowledged one just before it restarted), and
    # ``lease_read_index`` says when a leader may serve a read without a round trip.
    # Requires check_quorum (leader stickiness), on every member.
    leader_lease: bool = False
    disable_proposal_forwarding: bool = False
    # A leader removed from (or demoted in) the configuration steps down.
    step_down_on_removal: bool = True
    # The node lost its stable storage (its log and its vote) and has not yet caught up
    # with a leader: it neither grants votes nor campaigns, so it can neither vote twice in
    # a term nor help elect a leader lacking entries it acknowledged before the loss. It still
    # appends and acknowledges entries, which is truthful, but having forgotten its term it
    # may acknowledge a deposed leader: peers count its acknowledgements toward no quorum
    # (RawNode.report_abstaining). See RawNode.set_abstain.
    abstain: bool = False
    logger: Logger | None = None

    def validate(self) -> None:
        if self.id == NONE or self.id < 0:
            raise ConfigError(f"cannot use {self.id} as id")
        if self.heartbeat_tick <= 0:
            raise ConfigError("heartbeat tick must be greater than 0")
        if self.election_tick <= self.heartbeat_tick:
            raise ConfigError("election tick must be greater than heartbeat tick")
        if self.max_inflight_msgs <= 0:
            raise ConfigError("max inflight messages must be greater than 0")
        for name in (
            "max_size_per_msg",
            "max_committed_size_per_ready",
            "max_uncommitted_entries_size",
            "max_inflight_bytes",
        ):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must not be negative")
        if 0 < self.max_inflight_bytes < self.max_size_per_msg:
            raise ConfigError("max inflight bytes must be >= max message size")
        if self.read_only_option is ReadOnlyOption.LEASE_BASED and not self.check_quorum:
            raise ConfigError("check_quorum must be enabled when read_only_option is LEASE_BASED")
        if self.leader_lease and not self.check_quorum:
            raise ConfigError("check_quorum must be enabled for leader_lease")


def payloads_size(entries: Sequence[Entry]) -> int:
    """The bytes of application data in ``entries`` (what the size quotas count)."""
    return sum(len(e.data) for e in entries)


_CHANGE_LETTERS = {
    ConfChangeType.ADD_NODE: "v",
    ConfChangeType.REMOVE_NODE: "r",
    ConfChangeType.ADD_LEARNER_NODE: "l",
}


def _describe_changes(cc: ConfChange) -> str:
    """etcd's compact form: ``v4 r3 l5`` (voter, removal, learner); empty = leave joint."""
    return " ".join(f"{_CHANGE_LETTERS[c.type]}{c.node_id}" for c in cc.changes) or "leave-joint"


def _enter_joint(cc: ConfChange) -> tuple[bool, bool]:
    """(auto_leave, uses_joint) for a change (etcd ConfChangeV2.EnterJoint)."""
    if cc.transition is not ConfChangeTransition.AUTO or len(cc.changes) > 1:
        auto_leave = cc.transition is not ConfChangeTransition.JOINT_EXPLICIT
        return auto_leave, True
    return False, False


class Raft:
    """One node's consensus state. See the module docstring."""

    def __init__(self, config: Config) -> None:
        config.validate()
        self.logger: Logger = config.logger or logging.getLogger("rallypoint.raft")
        self.id = config.id
        # Source of the randomized election timeouts; never the global random module.
        self.rng = config.rng
        # The log (storage + unstable tail) with commit/apply marks.
        self.raft_log = RaftLog(config.storage, self.logger, config.max_committed_size_per_ready)
        hard_state, conf_state = config.storage.initial_state()
        # Current term (paper Figure 2); never decreases.
        self.term = Term(0)
        # Whom we voted for in `term` (NONE if nobody); set at most once per term.
        self.vote = NONE
        # The leader of `term` as far as we know (NONE if unknown).
        self.lead = NONE
        # Our role; changed only by the become_* methods, with step_role and tick.
        self.state = StateType.FOLLOWER
        # True if this node is a learner in the current configuration.
        self.is_learner = False
        # Messages to send once the current Ready is persisted; never addressed to us.
        self.msgs: list[Message] = []
        # Append acks and vote answers, which vouch for persisted state; those addressed to
        # ourselves are stepped back in after persisting (RawNode.advance).
        self.msgs_after_append: list[Message] = []
        # ReadIndex results for the application (drained by Ready).
        self.read_states: list[ReadState] = []
        # Bytes of entries per MsgApp (at least one entry is always sent).
        self.max_msg_size = config.max_size_per_msg
        # Limit of uncommitted_size for accepting proposals; 0 means none.
        self.max_uncommitted_size = config.max_uncommitted_entries_size
        # Configuration, per-peer progress (meaningful on the leader) and election votes.
        self.trk = ProgressTracker(config.max_inflight_msgs, config.max_inflight_bytes)
        # The transfer target while a leadership transfer is in progress, else NONE.
        self.lead_transferee = NONE
        # A conf change may only be proposed while applied >= pending_conf_index: at most one
        # unapplied change is in the log (set to the last index on becoming leader, since a
        # previous leader's change may still be unapplied).
        self.pending_conf_index = Index(0)
        # Estimated payload bytes of the leader's uncommitted tail (never overestimated).
        self.uncommitted_size = 0
        # The leader's pending ReadIndex requests; reset on every role change.
        self.read_only = ReadOnly(config.read_only_option)
        # ReadIndex requests received before this leader committed an entry of its term.
        self.pending_read_index_messages: list[Message] = []
        # Ticks since the last election timeout (leader/candidate) or since hearing from
        # the leader (follower).
        self.election_elapsed = 0
        # Ticks since the last heartbeat (leader only).
        self.heartbeat_elapsed = 0
        # Feature switches and timeouts from the Config (fixed for the node's life).
        self.check_quorum = config.check_quorum
        self.pre_vote = config.pre_vote
        self.leader_lease = config.leader_lease
        # Ticks left during which a node that just started refuses votes as if it had heard
        # from a leader (only with leader_lease; counts down to 0 and stays there).
        self.start_stickiness_ticks = config.election_tick if config.leader_lease else 0
        # True once this leader sent MsgTimeoutNow in its term: the transferee's forced
        # campaign overrides the followers' stickiness, so no lease holds again in this term.
        # Invariant: False whenever the node is not a leader (reset by every role change).
        self.lease_fenced = False
        # Invariant: True only while this node lost its storage and has not caught up.
        self.abstain = config.abstain
        # What this node knows of the current leader's log in the current term (follower
        # side; all reset with the term and the leader, in reset()). They matter to a node
        # that abstains, whose own records cannot be trusted by the leader's:
        # - lead_match: the highest index up to which this log is known to equal the
        #   leader's: an append from it was accepted up to there (maybe_append checked the
        #   entry before it), or a snapshot from it installed. The leader's log only grows in
        #   its term, so the prefix stays equal. Invariant: lead_match <= last index.
        # - lead_commit: the highest commit index the leader reported in an append (its
        #   m.commit as sent, not clipped to the entries received, unlike this node's commit
        #   index; a heartbeat's is clipped by the leader, so it does not count). A node
        #   that lost its data votes again only once its commit reaches it
        #   (RawNode.set_abstain).
        self.lead_match = _NO_INDEX
        self.lead_commit = _NO_INDEX
        # - lead_commit_first: the commit index in the first append of this leader in this
        #   term (in this life); None before one arrived. A rise above it, to an entry of
        #   the leader's term, was counted while this node abstained (peers do not count an
        #   abstaining node's acknowledgements: abstaining_peers), so a majority of the
        #   other members accepted an append of this term after this node lost its data:
        #   the term is not one that a majority (with this node's lost vote) had already
        #   left behind. See RawNode.set_abstain.
        self.lead_commit_first: Index | None = None
        # - asked_for_commit: this abstaining node proposed an empty entry to the leader in
        #   this term, to see its commit rise (_maybe_ask_for_commit). At most once per term
        #   and leader in a life, so a leader that cannot commit is not flooded.
        self.asked_for_commit = False
        # Peers the application reports abstaining (RawNode.report_abstaining): they lost
        # their data and have not caught up. They forgot the terms they knew, so they may
        # acknowledge a deposed leader; their acknowledgements count toward no quorum
        # (commit, ReadIndex, check-quorum) until they have caught up. Kept across role and
        # term changes: the application reports the flag with every message it receives.
        self.abstaining_peers: set[NodeId] = set()
        self.heartbeat_timeout = config.heartbeat_tick
        self.election_timeout = config.election_tick
        # In [election_timeout, 2 * election_timeout); redrawn on every role change.
        self.randomized_election_timeout = config.election_tick
        self.disable_proposal_forwarding = config.disable_proposal_forwarding
        self.step_down_on_removal = config.step_down_on_removal
        # The role's tick and step functions (tick_election / tick_heartbeat; step_follower /
        # step_candidate / step_leader), swapped together with state.
        self.tick: Callable[[], None] = self.tick_election
        self.step_role: Callable[[Message], None] = self.step_follower

        cfg, prs = confchange.restore(Changer(self.trk, self.raft_log.last_index()), conf_state)
        self._assert_conf_states_equivalent(conf_state, self.switch_to_config(cfg, prs))
        if not hard_state.is_empty():
            self.load_state(hard_state)
        if config.applied > 0:
            self.raft_log.applied_to(config.applied)
        self.become_follower(self.term, NONE)
        self.logger.info(
            "newRaft %d [peers: %s, term: %d, commit: %d, applied: %d, lastindex: %d, "
            "lastterm: %d]",
            self.id,
            self.trk.voter_nodes(),
            self.term,
            self.raft_log.committed,
            self.raft_log.applied,
            self.raft_log.last_index(),
            self.raft_log.last_term(),
        )

    # -- state snapshots ----------------------------------------------------------------

    def has_leader(self) -> bool:
        return self.lead != NONE

    def soft_state(self) -> SoftState:
        return SoftState(self.lead, self.state)

    def hard_state(self) -> HardState:
        return HardState(self.term, self.vote, self.raft_log.committed)

    # -- sending ------------------------------------------------------------------------

    def send(self, m: Message) -> None:
        """Queue ``m``, filling in ``from_`` and (except for proposals/reads) the term."""
        t = m.type
        updates: dict[str, object] = {}
        if m.from_ == NONE:
            updates["from_"] = self.id
        if t in _VOTE_TYPES:
            # Vote traffic carries the term it is about (pre-votes: the future term).
            if m.term == 0:
                raise AssertionError(f"term should be set when sending {t.name}")
        else:
            if m.term != 0:
                raise AssertionError(f"term should not be set when sending {t.name} ({m.term})")
            # Proposals and read requests forwarded to the leader are local to it.
            if t is not MT.MsgProp and t is not MT.MsgReadIndex:
                updates["term"] = self.term
        if updates:
            m = dataclasses.replace(m, **updates)  # type: ignore[arg-type]
        if t in _AFTER_APPEND_TYPES:
            # Thesis 3.8: votes and append acks must not leave before the state they vouch
            # for is durable; the Ready contract sends these only after persisting.
            self.msgs_after_append.append(m)
        else:
            if m.to == self.id:
                raise AssertionError(f"message should not be self-addressed when sending {t.name}")
            self.msgs.append(m)

    def send_append(self, to: NodeId, commit_notice: bool = False) -> None:
        self.maybe_send_append(to, send_if_empty=True, commit_notice=commit_notice)

    def maybe_send_append(
        self, to: NodeId, send_if_empty: bool, commit_notice: bool = False
    ) -> bool:
        """Send a MsgApp with the entries ``to`` lacks (or a snapshot); True if sent.

        ``send_if_empty`` allows an entry-less MsgApp (useful to carry the commit index or
        probe), unwanted when sending a batch of messages in a loop. ``commit_notice``: sent
        because the commit index advanced; an entry-less one to a follower in REPLICATE is
        then marked so that it goes unanswered (COMMIT_NOTICE_CONTEXT).
        """
        pr = self.trk.progress[to]
        if pr.is_paused():
            return False
        prev_index = Index(pr.next - 1)
        try:
            prev_term = self.raft_log.term(prev_index)
        except (CompactedError, UnavailableError):
            # The entry preceding next was compacted: only a snapshot can catch up.
            return self.maybe_send_snapshot(to, pr)
        ents: list[Entry] = []
        compacted = False
        # A throttled follower in REPLICATE, or one whose probe with entries is unanswered,
        # only gets empty MsgApps: if what is in flight was lost, the answer to an empty one
        # (an ack or a reject) still restarts replication (Progress.probe_is_empty).
        if not pr.probe_is_empty():
            try:
                ents = self.raft_log.entries(pr.next, self.max_msg_size)
            except CompactedError:
                compacted = True
        if not ents and not send_if_empty:
            return False
        if compacted:
            return self.maybe_send_snapshot(to, pr)
        committed = self.raft_log.committed
        notice = commit_notice and not ents and pr.state is ProgressState.REPLICATE
        self.send(
            Message(
                type=MT.MsgApp,
                to=to,
                index=prev_index,
                log_term=prev_term,
                entries=tuple(ents),
                commit=committed,
                context=COMMIT_NOTICE_CONTEXT if notice else b"",
            )
        )
        pr.update_on_entries_send(len(ents), payloads_size(ents))
        pr.update_on_commit_send(committed)
        return True

    def maybe_send_snapshot(self, to: NodeId, pr: Progress) -> bool:
        """Send the latest snapshot to ``to``; False if it is inactive or none is ready."""
        if not pr.recent_active:
            self.logger.debug("ignore sending snapshot to %d since it is not recently active", to)
            return False
        try:
            snap = self.raft_log.snapshot()
        except SnapshotTemporarilyUnavailableError:
            # The application is producing one; a later heartbeat response retries.
            self.logger.debug(
                "%d failed to send snapshot to %d: temporarily unavailable", self.id, to
            )
            return False
        if snap.is_empty():
            raise AssertionError("need non-empty snapshot")
        self.logger.debug(
            "%d [firstindex: %d, commit: %d] sent snapshot[index: %d, term: %d] to %d [%s]",
            self.id,
            self.raft_log.first_index(),
            self.raft_log.committed,
            snap.metadata.index,
            snap.metadata.term,
            to,
            pr,
        )
        pr.become_snapshot(snap.metadata.index)
        self.send(Message(type=MT.MsgSnap, to=to, snapshot=snap))
        return True

    def send_heartbeat(self, to: NodeId, ctx: bytes) -> None:
        pr = self.trk.progress[to]
        # Never tell a follower a commit index beyond what it is known to hold: it might not
        # have those entries, or hold different ones.
        commit = Index(min(pr.match, self.raft_log.committed))
        self.send(Message(type=MT.MsgHeartbeat, to=to, commit=commit, context=ctx))
        pr.update_on_commit_send(commit)

    def bcast_append(self, commit_notice: bool = False) -> None:
        for node_id in self.trk.sorted_ids():
            if node_id != self.id:
                self.send_append(node_id, commit_notice)

    def bcast_heartbeat(self) -> None:
        self.bcast_heartbeat_with_ctx(self.read_only.last_pending_request_ctx())

    def bcast_heartbeat_with_ctx(self, ctx: bytes) -> None:
        for node_id in self.trk.sorted_ids():
            if node_id != self.id:
                self.send_heartbeat(node_id, ctx)

    # -- applying -----------------------------------------------------------------------

    def applied_to(self, index: Index, size_bytes: int = 0) -> None:
        """The application applied up to ``index``; may propose leaving a joint config."""
        new_applied = Index(max(index, self.raft_log.applied))
        self.raft_log.applied_to(new_applied, size_bytes)
        if (
            self.trk.config.auto_leave
            and new_applied >= self.pending_conf_index
            and self.state is StateType.LEADER
        ):
            # The joint configuration is applied: propose leaving it. This can be dropped
            # while a transfer is in progress; it is retried on every later apply.
            m = Message(
                type=MT.MsgProp,
                from_=self.id,
                entries=(
                    Entry(
                        Term(0),
                        Index(0),
                        EntryType.CONF_CHANGE,
                        encode_conf_change(ConfChange()),
                    ),
                ),
            )
            try:
                self.step(m)
            except ProposalDroppedError as exc:
                self.logger.debug(
                    "not initiating automatic transition out of joint configuration %s: %s",
                    self.trk.config,
                    exc,
                )
            else:
                self.logger.info(
                    "initiating automatic transition out of joint configuration %s",
                    self.trk.config,
                )

    def applied_snap(self, snap: Snapshot) -> None:
        """The snapshot was persisted (and the state machine restored from it)."""
        index = snap.metadata.index
        self.raft_log.stable_snap_to(index)
        self.applied_to(index)

    def maybe_commit(self) -> bool:
        """Advance commit to what a quorum matched (leader only); True if it moved."""
        return self.raft_log.maybe_commit(self.trk.committed(self.abstaining_peers), self.term)

    # -- role changes -------------------------------------------------------------------

    def reset(self, term: Term) -> None:
        if self.term != term:
            self.term = term
            self.vote = NONE
        self.lead = NONE
        self.lead_match = _NO_INDEX
        self.lead_commit = _NO_INDEX
        self.lead_commit_first = None
        self.asked_for_commit = False
        self.election_elapsed = 0
        self.heartbeat_elapsed = 0
        self.reset_randomized_election_timeout()
        self.abort_leader_transfer()
        self.trk.reset_votes()
        last = self.raft_log.last_index()
        progress = self.trk.progress
        for node_id, pr in progress.items():
            fresh = Progress(
                match=last if node_id == self.id else Index(0),
                next=Index(last + 1),
                inflights=self.trk.new_inflights(),
                is_learner=pr.is_learner,
            )
            progress[node_id] = fresh
        self.pending_conf_index = Index(0)
        self.uncommitted_size = 0
        self.read_only = ReadOnly(self.read_only.option)
        self.lease_fenced = False

    def append_entry(self, entries: Sequence[Entry]) -> bool:
        """Append proposals at our term (leader); False if over the uncommitted size limit."""
        last = self.raft_log.last_index()
        stamped = [
            Entry(self.term, Index(last + 1 + i), e.type, e.data) for i, e in enumerate(entries)
        ]
        if not self.increase_uncommitted_size(stamped):
            self.logger.warning(
                "%d appending new entries to log would exceed uncommitted entry size limit; "
                "dropping proposal",
                self.id,
            )
            return False
        last = self.raft_log.append(stamped)
        # The leader acks its own entries once they are persisted (it sends itself no
        # MsgApp): this ack is stepped back in by RawNode.advance.
        self.send(Message(type=MT.MsgAppResp, to=self.id, index=last))
        return True

    def tick_election(self) -> None:
        """Followers and candidates: campaign once the randomized timeout elapsed (5.2)."""
        self.count_start_tick()
        self.election_elapsed += 1
        if self.promotable() and self.past_election_timeout():
            self.election_elapsed = 0
            self.step(Message(type=MT.MsgHup, from_=self.id))

    def tick_heartbeat(self) -> None:
        """Leaders: heartbeat every heartbeat_timeout; check quorum every election_timeout."""
        self.count_start_tick()
        self.heartbeat_elapsed += 1
        self.election_elapsed += 1
        if self.election_elapsed >= self.election_timeout:
            self.election_elapsed = 0
            if self.check_quorum:
                self.step(Message(type=MT.MsgCheckQuorum, from_=self.id))
            # A transfer that did not complete within an election timeout is abandoned.
            if self.state is StateType.LEADER and self.lead_transferee != NONE:
                self.abort_leader_transfer()
        if self.state is not StateType.LEADER:
            return
        if self.heartbeat_elapsed >= self.heartbeat_timeout:
            self.heartbeat_elapsed = 0
            self.step(Message(type=MT.MsgBeat, from_=self.id))

    def become_follower(self, term: Term, lead: NodeId) -> None:
        self.step_role = self.step_follower
        self.reset(term)
        self.tick = self.tick_election
        self.lead = lead
        self.state = StateType.FOLLOWER
        self.logger.info("%d became follower at term %d", self.id, self.term)

    def become_candidate(self) -> None:
        if self.state is StateType.LEADER:
            raise AssertionError("invalid transition [leader -> candidate]")
        self.step_role = self.step_candidate
        self.reset(Term(self.term + 1))
        self.tick = self.tick_election
        self.vote = self.id
        self.state = StateType.CANDIDATE
        self.logger.info("%d became candidate at term %d", self.id, self.term)

    def become_pre_candidate(self) -> None:
        if self.state is StateType.LEADER:
            raise AssertionError("invalid transition [leader -> pre-candidate]")
        # A pre-candidate changes neither its term nor its vote (thesis 9.6).
        self.step_role = self.step_candidate
        self.trk.reset_votes()
        self.tick = self.tick_election
        self.lead = NONE
        self.state = StateType.PRE_CANDIDATE
        self.logger.info("%d became pre-candidate at term %d", self.id, self.term)

    def become_leader(self) -> None:
        if self.state is StateType.FOLLOWER:
            raise AssertionError("invalid transition [follower -> leader]")
        self.step_role = self.step_leader
        self.reset(self.term)
        self.tick = self.tick_heartbeat
        self.lead = self.id
        self.state = StateType.LEADER
        # The leader trivially replicates to itself, and is always recently active.
        pr = self.trk.progress[self.id]
        pr.become_replicate()
        pr.recent_active = True
        # The no-op of thesis 6.4: committing it commits every earlier entry (5.4.2).
        if not self.append_entry([Entry(Term(0), Index(0))]):
            raise AssertionError("empty entry was dropped")
        # No conf change may be proposed before our no-op is applied: an earlier leader's
        # change may still be unapplied in our log (scanning for one would be costly), and a
        # change must not be appended while our leadership's first entry is uncommitted.
        # etcd sets this to the index before the no-op, which lets a change in right after
        # an uncommitted no-op when everything before it was applied.
        self.pending_conf_index = self.raft_log.last_index()
        self.logger.info("%d became leader at term %d", self.id, self.term)

    def hup(self, campaign_type: CampaignType) -> None:
        if self.state is StateType.LEADER:
            self.logger.debug("%d ignoring MsgHup because already leader", self.id)
            return
        if not self.promotable():
            self.logger.warning("%d is unpromotable and can not campaign", self.id)
            return
        if self.abstain:
            self.logger.info(
                "%d abstains (catching up after losing its data): no campaign", self.id
            )
            return
        if self.has_unapplied_conf_changes():
            self.logger.warning(
                "%d cannot campaign at term %d since there are still pending configuration "
                "changes to apply",
                self.id,
                self.term,
            )
            return
        if self.term >= MAX_TERM:
            # Only a state written before terms were bounded gets here: every peer would
            # refuse our vote requests (``step``), so do not send them.
            self.logger.error(
                "%d cannot campaign: its term %d leaves no higher term to campaign in "
                "(highest: %d)",
                self.id,
                self.term,
                MAX_TERM,
            )
            return
        self.logger.info("%d is starting a new election at term %d", self.id, self.term)
        self.campaign(campaign_type)

    def has_unapplied_conf_changes(self) -> bool:
        log = self.raft_log
        if log.applied >= log.committed:
            return False
        return log.has_conf_change_between(Index(log.applied + 1), Index(log.committed + 1))

    def campaign(self, campaign_type: CampaignType) -> None:
        """Become (pre-)candidate and request votes from every voter (section 5.2)."""
        if not self.promotable():
            self.logger.warning(
                "%d is unpromotable; campaign() should not have been called", self.id
            )
        if campaign_type is CampaignType.PRE_ELECTION:
            self.become_pre_candidate()
            vote_msg = MT.MsgPreVote
            # Pre-votes are requested for the term we would campaign in.
            term = Term(self.term + 1)
        else:
            self.become_candidate()
            vote_msg = MT.MsgVote
            term = self.term
        last_index = self.raft_log.last_index()
        last_term = self.raft_log.last_term()
        ctx = CAMPAIGN_TRANSFER_CONTEXT if campaign_type is CampaignType.TRANSFER else b""
        for node_id in self.trk.voter_nodes():
            if node_id == self.id:
                # Our own vote counts once it is persisted, like any other.
                self.send(Message(type=vote_resp_type(vote_msg), to=node_id, term=term))
                continue
            self.logger.info(
                "%d [logterm: %d, index: %d] sent %s request to %d at term %d",
                self.id,
                last_term,
                last_index,
                vote_msg.name,
                node_id,
                self.term,
            )
            self.send(
                Message(
                    type=vote_msg,
                    to=node_id,
                    term=term,
                    index=last_index,
                    log_term=last_term,
                    context=ctx,
                )
            )

    def poll(
        self, node_id: NodeId, msg_type: MessageType, granted: bool
    ) -> tuple[int, int, VoteResult]:
        if granted:
            self.logger.info(
                "%d received %s from %d at term %d", self.id, msg_type.name, node_id, self.term
            )
        else:
            self.logger.info(
                "%d received %s rejection from %d at term %d",
                self.id,
                msg_type.name,
                node_id,
                self.term,
            )
        self.trk.record_vote(node_id, granted)
        return self.trk.tally_votes()

    # -- stepping -----------------------------------------------------------------------

    def step(self, m: Message) -> None:
        """Handle one message. Raises ProposalDroppedError for a refused proposal, and
        TermOutOfRangeError (changing nothing) for a message whose term is above MAX_TERM."""
        if m.term > MAX_TERM:
            # A term no honest election reaches (types.py): adopting it would leave us no
            # term to campaign in once its leader is gone, and pass it on to every peer.
            raise TermOutOfRangeError(
                f"{m.type.name} from {m.from_} at term {m.term} is above the highest term a "
                f"node may reach ({MAX_TERM}); refused (at term {self.term})"
            )
        if m.term == 0:
            pass  # A local message (or a proposal/read forwarded by a follower).
        elif m.term > self.term:
            if m.type is MT.MsgVote or m.type is MT.MsgPreVote:
                force = m.context == CAMPAIGN_TRANSFER_CONTEXT
                in_lease = self.check_quorum and (
                    (self.lead != NONE and self.election_elapsed < self.election_timeout)
                    or self.start_stickiness_ticks > 0
                )
                if not force and in_lease:
                    # Leader stickiness (thesis 4.2.3): having heard from a leader within
                    # the minimum election timeout, neither update the term nor vote.
                    self._log_vote_decision(
                        "ignored",
                        m,
                        f": lease is not expired (remaining ticks: "
                        f"{self.election_timeout - self.election_elapsed})",
                    )
                    return
            if m.type is MT.MsgPreVote:
                pass  # Never change our term in response to a pre-vote.
            elif m.type is MT.MsgPreVoteResp and not m.reject:
                # A granted pre-vote carries the term we would campaign in; the term only
                # moves once a quorum granted it.
                pass
            else:
                self.logger.info(
                    "%d [term: %d] received a %s message with higher term from %d [term: %d]",
                    self.id,
                    self.term,
                    m.type.name,
                    m.from_,
                    m.term,
                )
                if m.type in (MT.MsgApp, MT.MsgHeartbeat, MT.MsgSnap):
                    self.become_follower(m.term, m.from_)
                else:
                    self.become_follower(m.term, NONE)
        elif m.term < self.term:
            if m.type in (MT.MsgHeartbeat, MT.MsgApp):
                # A leader of an older term: maybe we raised our term while partitioned and
                # can neither win nor rejoin. Tell that leader our term (the paper's "reply
                # with currentTerm"); it steps down and a fresh election frees us (pre-vote
                # keeps this from disrupting a healthy cluster). etcd answers only with
                # check-quorum or pre-vote on, counting on our higher-term votes otherwise;
                # but a member that missed a configuration change sends its votes to the
                # wrong peers (possibly only removed ones), and nothing else would ever
                # reach the leader: the simulator found that stall (seed 71958).
                self.send(Message(type=MT.MsgAppResp, to=m.from_))
            elif m.type is MT.MsgPreVote:
                # Reject rather than ignore, or a cluster upgraded to pre-vote with a
                # higher-term, shorter-log candidate could deadlock.
                self._log_vote_decision("rejected", m)
                self.send(Message(type=MT.MsgPreVoteResp, to=m.from_, term=self.term, reject=True))
            else:
                self.logger.info(
                    "%d [term: %d] ignored a %s message with lower term from %d [term: %d]",
                    self.id,
                    self.term,
                    m.type.name,
                    m.from_,
                    m.term,
                )
            return

        if m.type is MT.MsgHup:
            self.hup(CampaignType.PRE_ELECTION if self.pre_vote else CampaignType.ELECTION)
        elif m.type is MT.MsgVote or m.type is MT.MsgPreVote:
            self._handle_vote_request(m)
        else:
            self.step_role(m)

    def _log_vote_decision(self, decision: str, m: Message, detail: str = "") -> None:
        self.logger.info(
            "%d [logterm: %d, index: %d, vote: %d] %s %s from %d [logterm: %d, index: %d] "
            "at term %d%s",
            self.id,
            self.raft_log.last_term(),
            self.raft_log.last_index(),
            self.vote,
            decision,
            m.type.name,
            m.from_,
            m.log_term,
            m.index,
            self.term,
            detail,
        )

    def _handle_vote_request(self, m: Message) -> None:
        # We can vote if this repeats a vote we already cast, if we have not voted and know
        # no leader in this term, or if this is a pre-vote for a future term ...
        can_vote = not self.abstain and (
            self.vote == m.from_
            or (self.vote == NONE and self.lead == NONE)
            or (m.type is MT.MsgPreVote and m.term > self.term)
        )
        # ... and the candidate's log is at least as up to date as ours (5.4.1).
        if can_vote and self.raft_log.is_up_to_date(m.index, m.log_term):
            # Learners answer too: a learner promoted by a change it has not yet applied is a
            # voter in the candidate's eyes, and an election may need it. A candidate counts
            # only the voters of its own configuration.
            self._log_vote_decision("cast", m)
            # Answer with the request's term: for pre-votes ours may be older, and the
            # pre-candidate would ignore an answer carrying it.
            self.send(Message(type=vote_resp_type(m.type), to=m.from_, term=m.term))
            if m.type is MT.MsgVote:
                # Only real votes are recorded (and persisted before the answer is sent).
                self.election_elapsed = 0
                self.vote = m.from_
        else:
            self._log_vote_decision("rejected", m)
            self.send(Message(type=vote_resp_type(m.type), to=m.from_, term=self.term, reject=True))

    def step_leader(self, m: Message) -> None:
        t = m.type
        # These message types do not need a progress for m.from_.
        if t is MT.MsgBeat:
            self.bcast_heartbeat()
            return
        if t is MT.MsgCheckQuorum:
            if not self.trk.quorum_active(self.abstaining_peers):
                self.logger.warning(
                    "%d stepped down to follower since quorum is not active", self.id
                )
                self.become_follower(self.term, NONE)
            # Everyone but us starts the next check-quorum period inactive.
            for node_id, peer in self.trk.progress.items():
                if node_id != self.id:
                    peer.recent_active = False
            return
        if t is MT.MsgProp:
            self._leader_propose(m)
            return
        if t is MT.MsgReadIndex:
            if self.trk.is_singleton():
                # Only one voter (us): the commit index is trivially confirmed.
                resp = self.response_to_read_index_req(m, self.raft_log.committed)
                if resp is not None:
                    self.send(resp)
                return
            # Thesis 6.4: until an entry of this term commits, our commit index may lag
            # behind entries committed by earlier leaders.
            if not self.committed_entry_in_current_term():
                self.pending_read_index_messages.append(m)
                return
            self.send_msg_read_index_response(m)
            return

        pr = self.trk.progress.get(m.from_)
        if pr is None:
            self.logger.debug("%d no progress available for %d", self.id, m.from_)
            return
        if t is MT.MsgAppResp:
            self._leader_handle_app_resp(m, pr)
        elif t is MT.MsgHeartbeatResp:
            self._leader_handle_heartbeat_resp(m, pr)
        elif t is MT.MsgSnapStatus:
            if pr.state is not ProgressState.SNAPSHOT:
                return
            if not m.reject:
                pr.become_probe()
                self.logger.debug(
                    "%d snapshot succeeded, resumed replication to %d [%s]", self.id, m.from_, pr
                )
            else:
                # Forget the pending snapshot first, or the probe would start after it.
                pr.pending_snapshot = Index(0)
                pr.become_probe()
                self.logger.debug(
                    "%d snapshot failed, resumed replication to %d [%s]", self.id, m.from_, pr
                )
            # After success wait for the follower's MsgAppResp before the next MsgApp; after
            # failure wait for a heartbeat interval before retrying.
            pr.msg_app_flow_paused = True
        elif t is MT.MsgUnreachable:
            pr.messages_may_be_lost()
            self.logger.debug(
                "%d failed to send message to %d because it is unreachable [%s]",
                self.id,
                m.from_,
                pr,
            )
        elif t is MT.MsgTransferLeader:
            self._leader_handle_transfer(m, pr)

    def _leader_propose(self, m: Message) -> None:
        if not m.entries:
            raise AssertionError(f"{self.id} stepped empty MsgProp")
        if self.id not in self.trk.progress:
            # Removed from the configuration while leading: take no new proposals.
            raise ProposalDroppedError("this leader is not a member of the configuration")
        if self.lead_transferee != NONE:
            self.logger.debug(
                "%d [term %d] transfer leadership to %d is in progress; dropping proposal",
                self.id,
                self.term,
                self.lead_transferee,
            )
            raise ProposalDroppedError(
                f"leadership transfer to {self.lead_transferee} is in progress"
            )
        entries = list(m.entries)
        for i, entry in enumerate(entries):
            if entry.type is not EntryType.CONF_CHANGE:
                continue
            cc = decode_conf_change(entry.data)
            already_pending = self.pending_conf_index > self.raft_log.applied
            already_joint = self.trk.config.voters.is_joint()
            wants_leave_joint = cc.leave_joint()
            failed_check = ""
            if already_pending:
                failed_check = (
                    f"possible unapplied conf change at index {self.pending_conf_index} "
                    f"(applied to {self.raft_log.applied})"
                )
            elif already_joint and not wants_leave_joint:
                failed_check = "must transition out of joint config first"
            elif not already_joint and wants_leave_joint:
                failed_check = "not in joint state; refusing empty conf change"
            if failed_check:
                # The change becomes an empty normal entry, so the proposer sees it applied
                # as a no-op rather than waiting forever.
                self.logger.info(
                    "%d ignoring conf change %s at config %s: %s",
                    self.id,
                    _describe_changes(cc),
                    self.trk.config,
                    failed_check,
                )
                entries[i] = Entry(Term(0), Index(0))
            else:
                self.pending_conf_index = Index(self.raft_log.last_index() + i + 1)
        if not self.append_entry(entries):
            raise ProposalDroppedError("uncommitted entries size limit exceeded")
        self.bcast_append()

    def _leader_handle_app_resp(self, m: Message, pr: Progress) -> None:
        # Also reached from RawNode.advance: the leader's ack of its own persisted entries.
        pr.recent_active = True
        if m.reject:
            # reject_hint is the follower's guess of the last index where the logs may
            # match, log_term its term there. If log_term is set, every index whose term in
            # our log exceeds it cannot match either (terms only grow along a log), so skip
            # straight to the last index with a term <= log_term: at most one probe per term.
            self.logger.debug(
                "%d received MsgAppResp(rejected, hint: (index %d, term %d)) from %d for index %d",
                self.id,
                m.reject_hint,
                m.log_term,
                m.from_,
                m.index,
            )
            next_probe_index = m.reject_hint
            if m.log_term > 0:
                next_probe_index, _ = self.raft_log.find_conflict_by_term(m.reject_hint, m.log_term)
            if pr.maybe_decr_to(m.index, next_probe_index):
                self.logger.debug("%d decreased progress of %d to [%s]", self.id, m.from_, pr)
                if pr.state is ProgressState.REPLICATE:
                    pr.become_probe()
                self.send_append(m.from_)
            return
        # Update on a newer match, or when a probing peer is confirmed at its match (it can
        # go back to REPLICATE).
        if not (
            pr.maybe_update(m.index) or (pr.match == m.index and pr.state is ProgressState.PROBE)
        ):
            return
        if pr.state is ProgressState.PROBE:
            pr.become_replicate()
        elif pr.state is ProgressState.SNAPSHOT and pr.match + 1 >= self.raft_log.first_index():
            # Whatever snapshot got applied, the follower can now be caught up from the log.
            # Go through PROBE so the status is consistent until the next append round.
            self.logger.debug(
                "%d recovered from needing snapshot, resumed replication to %d [%s]",
                self.id,
                m.from_,
                pr,
            )
            pr.become_probe()
            pr.become_replicate()
        elif pr.state is ProgressState.REPLICATE:
            pr.inflights.free_le(m.index)

        if self.maybe_commit():
            # Entries of this term committed: pending reads may now be answered.
            self.release_pending_read_index_messages()
            self.bcast_append(commit_notice=True)
        elif m.from_ != self.id and pr.can_bump_commit(self.raft_log.committed):
            # The follower may lack the latest commit index; tell it now rather than at the
            # next heartbeat.
            self.send_append(m.from_, commit_notice=True)
        # Flow control may now allow several size-limited MsgApps at once.
        if m.from_ != self.id:
            while self.maybe_send_append(m.from_, send_if_empty=False):
                pass
        if m.from_ == self.lead_transferee and pr.match == self.raft_log.last_index():
            self.logger.info(
                "%d sent MsgTimeoutNow to %d after received MsgAppResp", self.id, m.from_
            )
            self.send_timeout_now(m.from_)

    def _leader_handle_heartbeat_resp(self, m: Message, pr: Progress) -> None:
        pr.recent_active = True
        pr.msg_app_flow_paused = False
        # A throttled or probing follower gets a MsgApp (possibly empty) so that replication
        # recovers even if every in-flight message was lost; so does one that could not
        # take the heartbeat's commit (reject: it abstains, see handle_heartbeat).
        if pr.match < self.raft_log.last_index() or pr.state is ProgressState.PROBE or m.reject:
            self.send_append(m.from_)
        if self.read_only.option is not ReadOnlyOption.SAFE or not m.context:
            return
        if m.from_ in self.abstaining_peers:
            # It may have forgotten a newer term and be following this deposed leader: its
            # acknowledgement proves nothing about who leads (the simulator's wipe seed
            # 1845 answered a read with a deposed leader's commit index).
            return
        acks = self.read_only.recv_ack(m.from_, m.context)
        if self.trk.config.voters.vote_result(acks) is not VoteResult.WON:
            return
        for status in self.read_only.advance(m.context):
            resp = self.response_to_read_index_req(status.req, status.index)
            if resp is not None:
                self.send(resp)

    def _leader_handle_transfer(self, m: Message, pr: Progress) -> None:
        if pr.is_learner:
            self.logger.debug("%d is learner. Ignored transferring leadership", m.from_)
            return
        transferee = m.from_
        last_transferee = self.lead_transferee
        if last_transferee != NONE:
            if last_transferee == transferee:
                self.logger.info(
                    "%d [term %d] transfer leadership to %d is in progress, ignores request to "
                    "same node %d",
                    self.id,
                    self.term,
                    transferee,
                    transferee,
                )
                return
            self.abort_leader_transfer()
            self.logger.info(
                "%d [term %d] abort previous transferring leadership to %d",
                self.id,
                self.term,
                last_transferee,
            )
        if transferee == self.id:
            self.logger.debug(
                "%d is already leader. Ignored transferring leadership to self", self.id
            )
            return
        self.logger.info(
            "%d [term %d] starts to transfer leadership to %d", self.id, self.term, transferee
        )
        # The transfer must finish within an election timeout (thesis 3.10).
        self.election_elapsed = 0
        self.lead_transferee = transferee
        if pr.match == self.raft_log.last_index():
            self.send_timeout_now(transferee)
            self.logger.info(
                "%d sends MsgTimeoutNow to %d immediately as %d already has up-to-date log",
                self.id,
                transferee,
                transferee,
            )
        else:
            self.send_append(transferee)

    def step_candidate(self, m: Message) -> None:
        """Shared by CANDIDATE and PRE_CANDIDATE; each counts only its own kind of answer."""
        my_vote_resp = (
            MT.MsgPreVoteResp if self.state is StateType.PRE_CANDIDATE else MT.MsgVoteResp
        )
        t = m.type
        if t is MT.MsgProp:
            self.logger.info("%d no leader at term %d; dropping proposal", self.id, self.term)
            raise ProposalDroppedError(f"no leader at term {self.term}")
        if t is MT.MsgApp:
            self.become_follower(m.term, m.from_)  # m.term == self.term here
            self.handle_append_entries(m)
        elif t is MT.MsgHeartbeat:
            self.become_follower(m.term, m.from_)
            self.handle_heartbeat(m)
        elif t is MT.MsgSnap:
            self.become_follower(m.term, m.from_)
            self.handle_snapshot(m)
        elif t is my_vote_resp:
            granted, rejected, result = self.poll(m.from_, t, not m.reject)
            self.logger.info(
                "%d has received %d %s votes and %d vote rejections",
                self.id,
                granted,
                t.name,
                rejected,
            )
            if result is VoteResult.WON:
                if self.state is StateType.PRE_CANDIDATE:
                    self.campaign(CampaignType.ELECTION)
                else:
                    self.become_leader()
                    self.bcast_append()
            elif result is VoteResult.LOST:
                # A pre-vote answer carries the future term: stay at ours.
                self.become_follower(self.term, NONE)
        elif t is MT.MsgTimeoutNow:
            self.logger.debug(
                "%d [term %d state %s] ignored MsgTimeoutNow from %d",
                self.id,
                self.term,
                self.state.name,
                m.from_,
            )

    def step_follower(self, m: Message) -> None:
        t = m.type
        if t is MT.MsgProp:
            if self.lead == NONE:
                self.logger.info("%d no leader at term %d; dropping proposal", self.id, self.term)
                raise ProposalDroppedError(f"no leader at term {self.term}")
            if self.disable_proposal_forwarding:
                self.logger.info(
                    "%d not forwarding to leader %d at term %d; dropping proposal",
                    self.id,
                    self.lead,
                    self.term,
                )
                raise ProposalDroppedError("proposal forwarding is disabled")
            self.send(dataclasses.replace(m, to=self.lead))
        elif t is MT.MsgApp:
            self.election_elapsed = 0
            self.lead = m.from_
            self.handle_append_entries(m)
        elif t is MT.MsgHeartbeat:
            self.election_elapsed = 0
            self.lead = m.from_
            self.handle_heartbeat(m)
        elif t is MT.MsgSnap:
            self.election_elapsed = 0
            self.lead = m.from_
            self.handle_snapshot(m)
        elif t is MT.MsgTransferLeader:
            if self.lead == NONE:
                self.logger.info(
                    "%d no leader at term %d; dropping leader transfer msg", self.id, self.term
                )
                return
            self.send(dataclasses.replace(m, to=self.lead))
        elif t is MT.MsgTimeoutNow:
            self.logger.info(
                "%d [term %d] received MsgTimeoutNow from %d and starts an election to get "
                "leadership",
                self.id,
                self.term,
                m.from_,
            )
            # Transfers skip pre-vote: the cluster is known healthy, no partition to guard.
            self.hup(CampaignType.TRANSFER)
        elif t is MT.MsgReadIndex:
            if self.lead == NONE:
                self.logger.info(
                    "%d no leader at term %d; dropping index reading msg", self.id, self.term
                )
                return
            self.send(dataclasses.replace(m, to=self.lead))
        elif t is MT.MsgReadIndexResp:
            if len(m.entries) != 1:
                self.logger.error(
                    "%d invalid format of MsgReadIndexResp from %d, entries count: %d",
                    self.id,
                    m.from_,
                    len(m.entries),
                )
                return
            self.read_states.append(ReadState(m.index, m.entries[0].data))

    def peer_lost_data(self, node_id: NodeId) -> None:
        """``node_id`` came back without its data (leader only; ignored otherwise): what this
        leader recorded it holds is void. Its progress restarts as a new peer's (match 0,
        probing from the end of the log), or its rejections would look stale forever (they
        fall below the recorded match) and it would never be sent what it lost."""
        pr = self.trk.progress.get(node_id)
        if self.state is not StateType.LEADER or node_id == self.id or pr is None:
            return
        self.logger.info(
            "%d resets the progress of %d, which lost its data [%s]", self.id, node_id, pr
        )
        self.trk.progress[node_id] = Progress(
            match=Index(0),
            next=Index(max(self.raft_log.last_index(), 1)),
            inflights=self.trk.new_inflights(),
            is_learner=pr.is_learner,
            recent_active=pr.recent_active,
        )
        self.send_append(node_id)

    def peer_abstains(self, node_id: NodeId, abstaining: bool) -> None:
        """Record whether ``node_id`` abstains (see ``abstaining_peers``). A leader whose
        peer stopped abstaining counts its acknowledgements again at once."""
        if not abstaining:
            if node_id in self.abstaining_peers:
                self.abstaining_peers.discard(node_id)
                if self.state is StateType.LEADER and self.maybe_commit():
                    self.bcast_append(commit_notice=True)
            return
        if node_id not in self.abstaining_peers and node_id != self.id:
            self.logger.info(
                "%d does not count the acknowledgements of %d: it abstains", self.id, node_id
            )
            self.abstaining_peers.add(node_id)

    def forget_leader(self) -> None:
        """Forget the current leader (follower only), so that votes are granted at once.

        Used when the application knows the leader is gone (e.g. it was removed); ignored
        with lease-based reads, whose safety relies on the lease.
        """
        if self.state is not StateType.FOLLOWER:
            return
        if self.read_only.option is ReadOnlyOption.LEASE_BASED or self.leader_lease:
            self.logger.error("ignoring forget_leader due to lease-based reads")
            return
        if self.lead != NONE:
            self.logger.info("%d forgetting leader %d at term %d", self.id, self.lead, self.term)
            self.lead = NONE

    # -- follower handlers --------------------------------------------------------------

    def handle_append_entries(self, m: Message) -> None:
        log = self.raft_log
        self.lead_commit = Index(max(self.lead_commit, m.commit))
        if self.lead_commit_first is None:
            self.lead_commit_first = m.commit
        if m.index < log.committed:
            # Everything up to committed is known to match; say so.
            self.send(Message(type=MT.MsgAppResp, to=m.from_, index=log.committed))
            return
        last_new, ok = log.maybe_append(m.index, m.log_term, m.commit, m.entries)
        if ok:
            self.lead_match = Index(max(self.lead_match, last_new))
            if m.entries or m.context != COMMIT_NOTICE_CONTEXT:
                self.send(Message(type=MT.MsgAppResp, to=m.from_, index=last_new))
            self._maybe_ask_for_commit()
            return
        self.logger.debug(
            "%d [logterm: %d, index: %d] rejected MsgApp [logterm: %d, index: %d] from %d",
            self.id,
            log.zero_term_on_out_of_bounds(m.index),
            m.index,
            m.log_term,
            m.index,
            m.from_,
        )
        # Hint the largest (index, term) at which the logs may match: the last entry with a
        # term <= the leader's term at m.index, skipping our divergent higher-term tail.
        # m.index >= committed here, so the hint never goes below the committed prefix.
        hint_index = Index(min(m.index, log.last_index()))
        hint_index, hint_term = log.find_conflict_by_term(hint_index, m.log_term)
        self.send(
            Message(
                type=MT.MsgAppResp,
                to=m.from_,
                index=m.index,
                reject=True,
                reject_hint=hint_index,
                log_term=hint_term,
            )
        )

    def handle_heartbeat(self, m: Message) -> None:
        # A heartbeat's commit is bounded by what the leader recorded as this node's match.
        # A node that lost its data (abstaining) may hold less than that record, or other
        # entries at those indexes, so it takes the commit only up to what an append or
        # snapshot of this leader proved equal (lead_match). If that leaves its commit
        # behind, the answer says so (reject) and the leader sends an append, whose log
        # check proves the prefix: otherwise a leader that recorded the node as caught up
        # sends it nothing but heartbeats until a new entry comes, and in a quiet cluster
        # the node never applies what was committed, nor stops abstaining (the
        # simulator's wipe seed 1014).
        commit = m.commit if not self.abstain else min(m.commit, self.lead_match)
        self.raft_log.commit_to(commit)
        lagging = self.abstain and self.raft_log.committed < m.commit
        self.send(Message(type=MT.MsgHeartbeatResp, to=m.from_, context=m.context, reject=lagging))
        self._maybe_ask_for_commit()

    def _maybe_ask_for_commit(self) -> None:
        """An abstaining node that holds everything its leader reported committed, but has
        not seen that commit rise since the leader's first append (RawNode.set_abstain),
        proposes an empty entry (like a new leader's): its commit is the rise, and a cluster
        that writes nothing would otherwise keep the node abstaining until the next write."""
        first = self.lead_commit_first
        if (
            not self.abstain
            or self.asked_for_commit
            or first is None
            or self.lead_commit > first
            or self.raft_log.committed < self.lead_commit
            or self.lead == NONE
            or self.disable_proposal_forwarding
        ):
            return
        self.asked_for_commit = True
        self.logger.info(
            "%d proposes an empty entry to %d: caught up at commit %d, waiting for a commit "
            "made while it abstains",
            self.id,
            self.lead,
            self.raft_log.committed,
        )
        self.send(Message(type=MT.MsgProp, to=self.lead, entries=(Entry(Term(0), Index(0)),)))

    def handle_snapshot(self, m: Message) -> None:
        snap = m.snapshot if m.snapshot is not None else Snapshot()
        index, term = snap.metadata.index, snap.metadata.term
        if self.restore(snap):
            self.lead_match = Index(max(self.lead_match, index))
            self.logger.info(
                "%d [commit: %d] restored snapshot [index: %d, term: %d]",
                self.id,
                self.raft_log.committed,
                index,
                term,
            )
            self.send(Message(type=MT.MsgAppResp, to=m.from_, index=self.raft_log.last_index()))
        else:
            self.logger.info(
                "%d [commit: %d] ignored snapshot [index: %d, term: %d]",
                self.id,
                self.raft_log.committed,
                index,
                term,
            )
            self.send(Message(type=MT.MsgAppResp, to=m.from_, index=self.raft_log.committed))

    def restore(self, snap: Snapshot) -> bool:
        """Install a leader's snapshot; False if it is stale or not for us."""
        meta = snap.metadata
        if meta.index <= self.raft_log.committed:
            return False
        if self.state is not StateType.FOLLOWER:
            # Only followers receive snapshots; a leader doing so would be a bug. Step up a
            # term as follower to make sure no damage follows, and refuse it.
            self.logger.warning(
                "%d attempted to restore snapshot as leader; should never happen", self.id
            )
            self.become_follower(Term(self.term + 1), NONE)
            return False
        cs = meta.conf_state
        if (
            self.id not in cs.voters
            and self.id not in cs.learners
            and self.id not in cs.voters_outgoing
        ):
            # learners_next members are outgoing voters, so checked above.
            self.logger.warning(
                "%d attempted to restore snapshot but it is not in the ConfState %s; should never "
                "happen",
                self.id,
                cs,
            )
            return False
        if self.raft_log.match_term(meta.index, meta.term):
            # We already hold the snapshot's last entry: just fast-forward the commit index.
            self.logger.info(
                "%d [commit: %d, lastindex: %d, lastterm: %d] fast-forwarded commit to snapshot "
                "[index: %d, term: %d]",
                self.id,
                self.raft_log.committed,
                self.raft_log.last_index(),
                self.raft_log.last_term(),
                meta.index,
                meta.term,
            )
            self.raft_log.commit_to(meta.index)
            return False
        if self.raft_log.applying > self.raft_log.applied:
            # Entries handed to the application (a Ready not yet advanced) are still being
            # applied; it would apply them, conf changes included, on top of the snapshot's
            # configuration. Refuse for now: the leader sends the snapshot again later.
            self.logger.info(
                "%d [applied: %d, applying: %d] ignored snapshot [index: %d, term: %d] while "
                "applying committed entries",
                self.id,
                self.raft_log.applied,
                self.raft_log.applying,
                meta.index,
                meta.term,
            )
            return False
        self.raft_log.restore(snap)
        # Rebuild the configuration from the snapshot's.
        self.trk = ProgressTracker(self.trk.max_inflight, self.trk.max_inflight_bytes)
        cfg, prs = confchange.restore(Changer(self.trk, self.raft_log.last_index()), cs)
        self._assert_conf_states_equivalent(cs, self.switch_to_config(cfg, prs))
        self.logger.info(
            "%d [commit: %d, lastindex: %d, lastterm: %d] restored snapshot [index: %d, term: %d]",
            self.id,
            self.raft_log.committed,
            self.raft_log.last_index(),
            self.raft_log.last_term(),
            meta.index,
            meta.term,
        )
        return True

    def promotable(self) -> bool:
        """True if this node may campaign: a voter, with no snapshot pending."""
        pr = self.trk.progress.get(self.id)
        return (
            pr is not None
            and not pr.is_learner
            and not self.raft_log.has_next_or_in_progress_snapshot()
        )

    # -- configuration ------------------------------------------------------------------

    def apply_conf_change(self, cc: ConfChange) -> ConfState:
        """Apply a committed configuration change; returns the new configuration."""
        changer = Changer(self.trk, self.raft_log.last_index())
        if cc.leave_joint():
            cfg, prs = changer.leave_joint()
        else:
            auto_leave, joint = _enter_joint(cc)
            if joint:
                cfg, prs = changer.enter_joint(auto_leave, cc.changes)
            else:
                cfg, prs = changer.simple(cc.changes)
        return self.switch_to_config(cfg, prs)

    def switch_to_config(self, cfg: TrackerConfig, prs: ProgressMap) -> ConfState:
        """Make ``cfg``/``prs`` current and react: step down if removed, commit, probe."""
        self.trk.config = cfg
        self.trk.progress = prs
        self.logger.info("%d switched to configuration %s", self.id, cfg)
        cs = self.trk.conf_state()
        pr = prs.get(self.id)
        self.is_learner = pr is not None and pr.is_learner
        if (pr is None or self.is_learner) and self.state is StateType.LEADER:
            # Removed or demoted while leading.
            if self.step_down_on_removal:
                self.become_follower(self.term, NONE)
            return cs
        if self.state is not StateType.LEADER or not cs.voters:
            return cs
        if self.maybe_commit():
            # The new quorum may commit more: tell everyone.
            self.bcast_append(commit_notice=True)
        else:
            # Probe newly added peers now rather than at the next heartbeat or proposal.
            for node_id in self.trk.sorted_ids():
                if node_id != self.id:
                    self.maybe_send_append(node_id, send_if_empty=False)
        if self.lead_transferee != NONE and self.lead_transferee not in cfg.voters.ids():
            # The transferee was removed or demoted.
            self.abort_leader_transfer()
        return cs

    def _assert_conf_states_equivalent(self, expected: ConfState, actual: ConfState) -> None:
        def normal(cs: ConfState) -> tuple[object, ...]:
            return (
                tuple(sorted(cs.voters)),
                tuple(sorted(cs.learners)),
                tuple(sorted(cs.voters_outgoing)),
                tuple(sorted(cs.learners_next)),
                cs.auto_leave,
            )

        if normal(expected) != normal(actual):
            raise AssertionError(f"ConfStates not equivalent after restore: {expected} != {actual}")

    def load_state(self, hs: HardState) -> None:
        if hs.commit < self.raft_log.committed or hs.commit > self.raft_log.last_index():
            raise AssertionError(
                f"{self.id} state.commit {hs.commit} is out of range "
                f"[{self.raft_log.committed}, {self.raft_log.last_index()}]"
            )
        self.raft_log.committed = hs.commit
        self.term = hs.term
        self.vote = hs.vote

    # -- timers and transfer --------------------------------------------------------------

    def past_election_timeout(self) -> bool:
        return self.election_elapsed >= self.randomized_election_timeout

    def reset_randomized_election_timeout(self) -> None:
        self.randomized_election_timeout = self.election_timeout + self.rng.randrange(
            self.election_timeout
        )

    def send_timeout_now(self, to: NodeId) -> None:
        # The lease ends before the message leaves: once the transferee campaigns, followers
        # that acknowledged us grant it their votes at once.
        self.lease_fenced = True
        self.send(Message(type=MT.MsgTimeoutNow, to=to))

    def abort_leader_transfer(self) -> None:
        self.lead_transferee = NONE

    # -- reads and size accounting ------------------------------------------------------

    def lease_read_index(self) -> Index | None:
        """The read index of a lease read, or None when a lease cannot hold: only a leader
        with leader_lease on, that committed an entry of its term (thesis 6.4), is not
        transferring leadership and has not sent MsgTimeoutNow in this term. The application
        still checks its clock: the lease is its acknowledged rounds' send time plus less than
        an election timeout (coordinator/node/reads.py)."""
        if (
            self.state is not StateType.LEADER
            or not self.leader_lease
            or self.lease_fenced
            or self.lead_transferee != NONE
            or self.is_learner
            or not self.committed_entry_in_current_term()
        ):
            return None
        return self.raft_log.committed

    def count_start_tick(self) -> None:
        if self.start_stickiness_ticks > 0:
            self.start_stickiness_ticks -= 1

    def committed_entry_in_current_term(self) -> bool:
        # A leader's term is never 0, so an unknown (compacted) term never matches.
        return self.raft_log.zero_term_on_out_of_bounds(self.raft_log.committed) == self.term

    def response_to_read_index_req(self, req: Message, read_index: Index) -> Message | None:
        """Answer a read: a ReadState if it is ours, else the message to send to its origin."""
        if req.from_ == NONE or req.from_ == self.id:
            self.read_states.append(ReadState(read_index, req.entries[0].data))
            return None
        return Message(
            type=MT.MsgReadIndexResp, to=req.from_, index=read_index, entries=req.entries
        )

    def send_msg_read_index_response(self, m: Message) -> None:
        if self.read_only.option is ReadOnlyOption.SAFE:
            ctx = m.entries[0].data
            self.read_only.add_request(self.raft_log.committed, m)
            # The leader acknowledges its own request.
            self.read_only.recv_ack(self.id, ctx)
            self.bcast_heartbeat_with_ctx(ctx)
        else:
            resp = self.response_to_read_index_req(m, self.raft_log.committed)
            if resp is not None:
                self.send(resp)

    def release_pending_read_index_messages(self) -> None:
        if not self.pending_read_index_messages:
            return
        if not self.committed_entry_in_current_term():
            self.logger.error(
                "pending MsgReadIndex should be released only after first commit in current term"
            )
            return
        pending, self.pending_read_index_messages = self.pending_read_index_messages, []
        for m in pending:
            self.send_msg_read_index_response(m)

    def increase_uncommitted_size(self, entries: Sequence[Entry]) -> bool:
        """Account for new proposals; False if they would exceed the limit.

        An empty uncommitted tail accepts any proposal, and empty payloads are always
        accepted (the leader's no-op).
        """
        size = payloads_size(entries)
        limit = self.max_uncommitted_size
        if (
            limit
            and self.uncommitted_size > 0
            and size > 0
            and self.uncommitted_size + size > limit
        ):
            return False
        self.uncommitted_size += size
        return True

    def reduce_uncommitted_size(self, size: int) -> None:
        """Committed entries of ``size`` payload bytes no longer count as uncommitted."""
        # The estimate may be low (e.g. entries from an earlier term); saturate at 0.
        self.uncommitted_size = max(0, self.uncommitted_size - size)
