"""The leader's bookkeeping of the configuration, each peer's progress and election votes.

Theory of operation (etcd-io/raft ``tracker/tracker.go``): the tracker holds the active
configuration (joint voters, learners, learners pending a joint exit) and one ``Progress``
per voter and learner. The commit index is what a (joint) quorum of voters has matched;
elections are tallied over the same voters. Configurations are values: a change builds a new
``TrackerConfig`` and progress map (``confchange.Changer``) which are then swapped in.
"""

from __future__ import annotations

from collections.abc import Callable, Container
from dataclasses import dataclass, field

from ..quorum import JointConfig, VoteResult
from ..types import ConfState, Index, NodeId
from .inflights import Inflights
from .progress import Progress

ProgressMap = dict[NodeId, Progress]


@dataclass(frozen=True, slots=True)
class TrackerConfig:
    """A (possibly joint) configuration.

    Invariants: ``learners`` and ``voters`` are disjoint; ``learners_next`` is a subset of
    the outgoing voters and is empty unless joint; ``auto_leave`` is False unless joint.
    """

    voters: JointConfig = field(default_factory=JointConfig)
    # Leave the joint configuration automatically once it is committed (and applied).
    auto_leave: bool = False
    learners: frozenset[NodeId] = frozenset()
    # Outgoing voters being demoted: they become learners when the joint config is left.
    learners_next: frozenset[NodeId] = frozenset()

    def __str__(self) -> str:
        parts = [f"voters={self.voters}"]
        if self.learners:
            parts.append("learners=(" + " ".join(map(str, sorted(self.learners))) + ")")
        if self.learners_next:
            parts.append("learners_next=(" + " ".join(map(str, sorted(self.learners_next))) + ")")
        if self.auto_leave:
            parts.append("autoleave")
        return " ".join(parts)


class ProgressTracker:
    """Configuration, per-peer progress and votes.

    Invariants: every id in ``config`` (voters, learners, learners_next) has an entry in
    ``progress`` and vice versa; ``votes`` only holds answers for the current election.
    """

    def __init__(self, max_inflight: int, max_inflight_bytes: int = 0) -> None:
        self.config = TrackerConfig()
        self.progress: ProgressMap = {}
        # Votes received in the current (pre-)election: id -> granted.
        self.votes: dict[NodeId, bool] = {}
        # Limits given to each new peer's Inflights.
        self.max_inflight = max_inflight
        self.max_inflight_bytes = max_inflight_bytes

    def new_inflights(self) -> Inflights:
        return Inflights(self.max_inflight, self.max_inflight_bytes)

    def conf_state(self) -> ConfState:
        cfg = self.config
        return ConfState(
            voters=tuple(sorted(cfg.voters.incoming.ids)),
            learners=tuple(sorted(cfg.learners)),
            voters_outgoing=tuple(sorted(cfg.voters.outgoing.ids)),
            learners_next=tuple(sorted(cfg.learners_next)),
            auto_leave=cfg.auto_leave,
        )

    def is_singleton(self) -> bool:
        """True if the configuration has exactly one voter (and is not joint)."""
        voters = self.config.voters
        return len(voters.incoming) == 1 and not voters.outgoing.ids

    def _acked(self, node_id: NodeId) -> Index | None:
        pr = self.progress.get(node_id)
        return None if pr is None else pr.match

    def committed(self, uncounted: Container[NodeId] = ()) -> Index:
        """The largest log index a (joint) quorum of voters has matched, the ``uncounted``
        ones' matches not counted."""
        if not uncounted:
            return self.config.voters.committed_index(self._acked)

        def acked(node_id: NodeId) -> Index | None:
            return Index(0) if node_id in uncounted else self._acked(node_id)

        return self.config.voters.committed_index(acked)

    def visit(self, fn: Callable[[NodeId, Progress], None]) -> None:
        """Call ``fn`` for every peer in ascending id order (deterministic message order)."""
        progress = self.progress
        for node_id in sorted(progress):
            fn(node_id, progress[node_id])

    def sorted_ids(self) -> list[NodeId]:
        return sorted(self.progress)

    def quorum_active(self, uncounted: Container[NodeId] = ()) -> bool:
        """True if a quorum of voters was recently active (the leader counts itself), the
        ``uncounted`` ones not counted."""
        votes = {
            node_id: pr.recent_active and node_id not in uncounted
            for node_id, pr in self.progress.items()
            if not pr.is_learner
        }
        return self.config.voters.vote_result(votes) is VoteResult.WON

    def voter_nodes(self) -> list[NodeId]:
        return sorted(self.config.voters.ids())

    def learner_nodes(self) -> list[NodeId]:
        return sorted(self.config.learners)

    def reset_votes(self) -> None:
        self.votes = {}

    def record_vote(self, node_id: NodeId, granted: bool) -> None:
        """Record ``node_id``'s answer; only the first answer of an election counts."""
        self.votes.setdefault(node_id, granted)

    def tally_votes(self) -> tuple[int, int, VoteResult]:
        """(granted, rejected, outcome) over the voters of the current configuration."""
        granted = rejected = 0
        for node_id, pr in self.progress.items():
            if pr.is_learner:
                continue
            vote = self.votes.get(node_id)
            if vote is None:
                continue
            if vote:
                granted += 1
            else:
                rejected += 1
        return granted, rejected, self.config.voters.vote_result(self.votes)
