"""What the leader knows about one follower's log, and how it replicates to it.

Theory of operation (etcd-io/raft ``tracker/progress.go``, thesis 3.5 and 4.2.1): each
follower is in one of three states.

- ``PROBE``: the leader does not know where the follower's log matches its own. It sends at
  most one MsgApp per heartbeat interval and waits for the answer, walking ``next`` back on
  rejections (helped by the follower's hint) until a MsgApp is accepted. Only the first probe
  at a given ``next`` carries entries; the ones a heartbeat answer triggers while it is
  unanswered are empty (``probe_sent_entries``). A follower slow to persist a large probe
  would otherwise be sent the same megabyte again on every heartbeat answer, and every
  ReadIndex broadcasts a heartbeat: a follower catching up after a partition received each
  entry tens of times. An empty probe still recovers a lost one: its acceptance moves the
  follower to ``REPLICATE``, which resends from ``match``.
- ``REPLICATE``: the follower's log is known to match up to ``match``; the leader streams
  entries optimistically, advancing ``next`` as it sends, limited by ``inflights``.
- ``SNAPSHOT``: the follower needs entries the leader has compacted; a snapshot was sent and
  replication is paused until the follower reports it installed (or failed to install) it.
"""

from __future__ import annotations

import enum

from ..types import Index
from .inflights import Inflights

_ZERO = Index(0)
_ONE = Index(1)


class ProgressState(enum.Enum):
    PROBE = 0
    REPLICATE = 1
    SNAPSHOT = 2


class Progress:
    """The leader's view of one follower (or of itself).

    Invariant: ``0 <= match < next``. ``sent_commit <= next - 1`` except right after a
    snapshot is sent.
    """

    __slots__ = (
        "inflights",
        "is_learner",
        "match",
        "msg_app_flow_paused",
        "next",
        "pending_snapshot",
        "probe_sent_entries",
        "recent_active",
        "sent_commit",
        "state",
    )

    def __init__(
        self,
        *,
        match: Index = _ZERO,
        next: Index = _ONE,
        inflights: Inflights,
        is_learner: bool = False,
        recent_active: bool = False,
    ) -> None:
        # Highest index known to be replicated on the follower.
        self.match = match
        # Index of the next entry to send; entries in [match+1, next) may be in flight.
        self.next = next
        # Highest commit index sent to the follower; lets the leader know when the follower
        # may be missing the latest commit index (see can_bump_commit).
        self.sent_commit = Index(0)
        self.state = ProgressState.PROBE
        # In SNAPSHOT state: the index of the snapshot sent; 0 otherwise.
        self.pending_snapshot = Index(0)
        # True if the follower was heard from since the last check-quorum round. The leader's
        # own progress is always recently active.
        self.recent_active = recent_active
        # True when MsgApps to this follower are throttled: a probe was sent in PROBE state, or
        # inflights are full in REPLICATE state. Cleared by a heartbeat response or an ack.
        self.msg_app_flow_paused = False
        # In PROBE state: a MsgApp with entries was sent at the current ``next`` and has not
        # been answered; probes until then carry no entries (see the module docstring).
        self.probe_sent_entries = False
        self.inflights = inflights
        # True if the node is a learner: it receives the log but does not vote.
        self.is_learner = is_learner

    def __repr__(self) -> str:
        parts = [f"{self.state.name} match={self.match} next={self.next}"]
        if self.is_learner:
            parts.append("learner")
        if self.is_paused():
            parts.append("paused")
        if self.pending_snapshot:
            parts.append(f"pendingSnap={self.pending_snapshot}")
        if not self.recent_active:
            parts.append("inactive")
        if self.inflights.count():
            parts.append(f"inflight={self.inflights.count()}")
            if self.inflights.full():
                parts.append("[full]")
        return " ".join(parts)

    def copy(self) -> Progress:
        """An independent copy (inflights included), for status reports and conf changes."""
        pr = Progress(
            match=self.match,
            next=self.next,
            inflights=self.inflights.clone(),
            is_learner=self.is_learner,
            recent_active=self.recent_active,
        )
        pr.sent_commit = self.sent_commit
        pr.state = self.state
        pr.pending_snapshot = self.pending_snapshot
        pr.msg_app_flow_paused = self.msg_app_flow_paused
        pr.probe_sent_entries = self.probe_sent_entries
        return pr

    def reset_state(self, state: ProgressState) -> None:
        self.msg_app_flow_paused = False
        self.probe_sent_entries = False
        self.pending_snapshot = Index(0)
        self.state = state
        self.inflights.reset()

    def become_probe(self) -> None:
        """Probe from just after ``match`` (or after the snapshot just installed)."""
        if self.state is ProgressState.SNAPSHOT:
            # The snapshot may have been applied even if no ack has arrived yet: probe from
            # after it, which the follower will reject if it did not install it.
            pending = self.pending_snapshot
            self.reset_state(ProgressState.PROBE)
            self.next = Index(max(self.match + 1, pending + 1))
        else:
            self.reset_state(ProgressState.PROBE)
            self.next = Index(self.match + 1)
        self.sent_commit = Index(min(self.sent_commit, self.next - 1))

    def messages_may_be_lost(self) -> None:
        """The transport reports the follower unreachable: MsgApps to it may have been lost."""
        if self.state is ProgressState.REPLICATE:
            # During optimistic replication an unreachable peer has likely lost a MsgApp.
            self.become_probe()
        else:
            # The probe with entries may be among what was lost: the next may carry them.
            self.probe_sent_entries = False

    def become_replicate(self) -> None:
        self.reset_state(ProgressState.REPLICATE)
        self.next = Index(self.match + 1)

    def become_snapshot(self, snapshot_index: Index) -> None:
        self.reset_state(ProgressState.SNAPSHOT)
        self.pending_snapshot = snapshot_index
        self.next = Index(snapshot_index + 1)
        self.sent_commit = snapshot_index

    def update_on_entries_send(self, entries: int, size_bytes: int) -> None:
        """Account for a MsgApp of ``entries`` entries appended at ``next``."""
        if self.state is ProgressState.REPLICATE:
            if entries > 0:
                self.next = Index(self.next + entries)
                self.inflights.add(Index(self.next - 1), size_bytes)
            # A message that fills the inflights turns the stream into a probe: wait for acks.
            self.msg_app_flow_paused = self.inflights.full()
        elif self.state is ProgressState.PROBE:
            if entries > 0:
                self.msg_app_flow_paused = True
                self.probe_sent_entries = True
            elif self.probe_sent_entries:
                # An empty re-probe: one per heartbeat answer, not one per proposal.
                self.msg_app_flow_paused = True
        else:
            raise RuntimeError(f"sending append in unhandled progress state {self.state.name}")

    def update_on_commit_send(self, commit: Index) -> None:
        """Record the commit index sent in a MsgApp or heartbeat."""
        self.sent_commit = commit

    def can_bump_commit(self, index: Index) -> bool:
        """True if sending ``index`` as the commit would tell the follower something new."""
        # The follower can only learn commit indexes up to what it is known to have
        # (next - 1), so only a larger index that it was not already sent is worth sending.
        return index > self.sent_commit and self.sent_commit < self.next - 1

    def maybe_update(self, index: Index) -> bool:
        """The follower acked up to ``index``; returns False if the ack is stale."""
        updated = False
        if self.match < index:
            self.match = index
            updated = True
            self.msg_app_flow_paused = False
        self.next = Index(max(self.next, index + 1))
        return updated

    def maybe_decr_to(self, rejected: Index, match_hint: Index) -> bool:
        """A MsgApp at ``rejected`` was refused; move ``next`` back. False if stale.

        ``match_hint`` is the follower's guess of the last index where the logs may match.
        """
        if self.state is ProgressState.REPLICATE:
            # The rejection must be stale if it is at or below what we know matches.
            if rejected <= self.match:
                return False
            # Entries past match were lost or rejected: restart right after match.
            self.next = Index(self.match + 1)
            self.sent_commit = Index(min(self.sent_commit, self.next - 1))
            return True
        # In PROBE state only the rejection of the latest probe (at next - 1) is current.
        if self.next - 1 != rejected:
            return False
        self.next = Index(max(min(rejected, match_hint + 1), self.match + 1))
        self.sent_commit = Index(min(self.sent_commit, self.next - 1))
        self.msg_app_flow_paused = False
        # A new probe position: its first probe may carry entries again.
        self.probe_sent_entries = False
        return True

    def probe_is_empty(self) -> bool:
        """True if the next MsgApp to this follower must carry no entries, only the commit index.

        In REPLICATE state when the inflights are full (the stream still recovers if every
        in-flight message was lost, through an ack or a reject), in PROBE state when the
        probe at ``next`` already carried entries and is unanswered.
        """
        if self.state is ProgressState.REPLICATE:
            return self.inflights.full()
        return self.probe_sent_entries

    def is_paused(self) -> bool:
        """True if no MsgApp (other than an empty heartbeat-driven one) should be sent now."""
        if self.state is ProgressState.SNAPSHOT:
            return True
        return self.msg_app_flow_paused
