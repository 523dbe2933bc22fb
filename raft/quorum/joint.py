"""Joint quorums: both the incoming and the outgoing majority must agree (thesis 4.3).

While a configuration change is in flight, decisions (commit, elections) need a majority of
the incoming voters *and* a majority of the outgoing ones. Outside a joint configuration the
outgoing half is empty, and the empty majority agrees with everything, so the same code
serves both cases.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ..types import Index, NodeId
from .majority import AckedIndexer, MajorityConfig, VoteResult


@dataclass(frozen=True, slots=True)
class JointConfig:
    """``incoming`` is the (new, or only) configuration; ``outgoing`` is empty unless joint."""

    incoming: MajorityConfig = field(default_factory=MajorityConfig)
    outgoing: MajorityConfig = field(default_factory=MajorityConfig)

    def __str__(self) -> str:
        if self.outgoing.ids:
            return f"{self.incoming}&&{self.outgoing}"
        return str(self.incoming)

    def ids(self) -> frozenset[NodeId]:
        """Every voter of either half."""
        return self.incoming.ids | self.outgoing.ids

    def is_joint(self) -> bool:
        return bool(self.outgoing.ids)

    def committed_index(self, acked: AckedIndexer) -> Index:
        """The largest index committed by both halves."""
        return min(self.incoming.committed_index(acked), self.outgoing.committed_index(acked))

    def vote_result(self, votes: Mapping[NodeId, bool]) -> VoteResult:
        """Won only if both halves won; lost if either half lost."""
        incoming = self.incoming.vote_result(votes)
        outgoing = self.outgoing.vote_result(votes)
        if incoming is outgoing:
            return incoming
        if VoteResult.LOST in (incoming, outgoing):
            return VoteResult.LOST
        return VoteResult.PENDING
