"""Quorum arithmetic: majority and joint commit indexes and vote results."""

from __future__ import annotations

import pytest

from rallypoint.raft import Index, NodeId
from rallypoint.raft.quorum import INFINITE_INDEX, JointConfig, MajorityConfig, VoteResult


def majority(*ids: int) -> MajorityConfig:
    return MajorityConfig(frozenset(NodeId(i) for i in ids))


def acked_by(indexes: dict[int, int]) -> dict[NodeId, Index]:
    return {NodeId(k): Index(v) for k, v in indexes.items()}


@pytest.mark.parametrize(
    ("voters", "acked", "committed"),
    [
        ((1,), {1: 5}, 5),
        ((1,), {}, 0),
        ((1, 2), {1: 5, 2: 3}, 3),
        ((1, 2, 3), {1: 5, 2: 3}, 3),
        ((1, 2, 3), {1: 5}, 0),
        ((1, 2, 3), {1: 2, 2: 2, 3: 9}, 2),
        ((1, 2, 3, 4), {1: 9, 2: 8, 3: 7, 4: 6}, 7),
        ((1, 2, 3, 4, 5), {1: 9, 2: 8, 3: 7, 4: 6, 5: 5}, 7),
        ((1, 2, 3, 4, 5), {1: 9, 2: 8}, 0),
    ],
)
def test_majority_committed_index(
    voters: tuple[int, ...], acked: dict[int, int], committed: int
) -> None:
    known = acked_by(acked)
    assert majority(*voters).committed_index(known.get) == committed


def test_empty_majority_commits_everything() -> None:
    assert majority().committed_index(lambda _: Index(3)) == INFINITE_INDEX


@pytest.mark.parametrize(
    ("voters", "votes", "result"),
    [
        ((), {}, VoteResult.WON),
        ((1,), {}, VoteResult.PENDING),
        ((1,), {1: True}, VoteResult.WON),
        ((1,), {1: False}, VoteResult.LOST),
        ((1, 2, 3), {1: True}, VoteResult.PENDING),
        ((1, 2, 3), {1: True, 2: True}, VoteResult.WON),
        ((1, 2, 3), {1: True, 2: False}, VoteResult.PENDING),
        ((1, 2, 3), {1: False, 2: False}, VoteResult.LOST),
        ((1, 2, 3, 4), {1: True, 2: True}, VoteResult.PENDING),
        ((1, 2, 3, 4), {1: True, 2: True, 3: False, 4: False}, VoteResult.LOST),
        ((1, 2, 3), {1: True, 2: True, 9: False}, VoteResult.WON),  # non-voters ignored
    ],
)
def test_majority_vote_result(
    voters: tuple[int, ...], votes: dict[int, bool], result: VoteResult
) -> None:
    assert majority(*voters).vote_result({NodeId(k): v for k, v in votes.items()}) is result


def test_joint_committed_index_is_the_minimum_of_both_halves() -> None:
    joint = JointConfig(majority(1, 2, 3), majority(3, 4, 5))
    acked = acked_by({1: 10, 2: 10, 3: 6, 4: 4, 5: 3})
    # Incoming commits 10, outgoing only 4.
    assert joint.committed_index(acked.get) == 4


def test_joint_with_empty_outgoing_behaves_as_majority() -> None:
    joint = JointConfig(majority(1, 2, 3))
    acked = acked_by({1: 7, 2: 5, 3: 1})
    assert joint.committed_index(acked.get) == 5
    assert not joint.is_joint()
    assert joint.vote_result({NodeId(1): True, NodeId(2): True}) is VoteResult.WON


@pytest.mark.parametrize(
    ("votes", "result"),
    [
        ({1: True, 2: True}, VoteResult.PENDING),  # incoming won, outgoing pending
        ({1: True, 2: True, 4: True, 5: True}, VoteResult.WON),
        ({1: True, 2: True, 4: False, 5: False}, VoteResult.LOST),  # outgoing lost
        ({1: False, 2: False, 4: True, 5: True}, VoteResult.LOST),
        ({3: True}, VoteResult.PENDING),
        ({2: True, 3: True, 4: True}, VoteResult.WON),  # 3 counts in both halves
    ],
)
def test_joint_vote_result_needs_both_halves(votes: dict[int, bool], result: VoteResult) -> None:
    joint = JointConfig(majority(1, 2, 3), majority(3, 4, 5))
    assert joint.vote_result({NodeId(k): v for k, v in votes.items()}) is result


def test_joint_ids_are_the_union() -> None:
    joint = JointConfig(majority(1, 2), majority(2, 3))
    assert joint.ids() == {1, 2, 3}
    assert str(joint) == "(1 2)&&(2 3)"
