"""Majority quorums: which index a majority has acknowledged, and how an election stands.

Theory of operation (etcd-io/raft ``quorum/majority.go``): a majority configuration is a set
of voter ids. An index is committed once more than half of the voters have it in their logs
(Raft paper section 5.3), so sorting the acknowledged indexes in descending order and picking
the one at position ``n // 2`` yields the largest index a majority holds. An election is won
once more than half voted yes, lost once more than half cannot vote yes any more, and is
pending otherwise. The empty configuration wins every vote and commits everything, which
makes it the neutral element when combined in a joint configuration (``joint.py``).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from ..types import Index, NodeId

#: What an empty majority configuration reports as committed: larger than any real index,
#: so that ``min`` over a joint configuration picks the other half.
INFINITE_INDEX = Index(2**64 - 1)

#: Returns the highest index a voter is known to hold, or ``None`` if nothing is known.
AckedIndexer = Callable[[NodeId], Index | None]


class VoteResult(enum.Enum):
    PENDING = 1
    """Neither enough yes nor enough no votes yet."""
    LOST = 2
    """A majority can no longer be reached."""
    WON = 3
    """A majority voted yes."""


@dataclass(frozen=True, slots=True)
class MajorityConfig:
    """A set of voters; decisions need more than half of them."""

    ids: frozenset[NodeId] = frozenset()

    def __len__(self) -> int:
        return len(self.ids)

    def __contains__(self, node_id: object) -> bool:
        return node_id in self.ids

    def __iter__(self) -> Iterator[NodeId]:
        return iter(sorted(self.ids))

    def __str__(self) -> str:
        return "(" + " ".join(str(i) for i in sorted(self.ids)) + ")"

    def sorted_ids(self) -> list[NodeId]:
        return sorted(self.ids)

    def committed_index(self, acked: AckedIndexer) -> Index:
        """The largest index acknowledged by a majority (``INFINITE_INDEX`` if empty)."""
        n = len(self.ids)
        if n == 0:
            return INFINITE_INDEX
        indexes = sorted((acked(i) or 0 for i in self.ids), reverse=True)
        return Index(indexes[n // 2])

    def vote_result(self, votes: Mapping[NodeId, bool]) -> VoteResult:
        """The election outcome given ``votes`` (absent voters have not answered yet)."""
        if not self.ids:
            # An empty configuration wins, so that joint quorums reduce to the other half.
            return VoteResult.WON
        granted = missing = 0
        for node_id in self.ids:
            vote = votes.get(node_id)
            if vote is None:
                missing += 1
            elif vote:
                granted += 1
        quorum = len(self.ids) // 2 + 1
        if granted >= quorum:
            return VoteResult.WON
        if granted + missing >= quorum:
            return VoteResult.PENDING
        return VoteResult.LOST
