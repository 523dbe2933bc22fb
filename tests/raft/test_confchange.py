"""Configuration changes: simple, joint consensus, learners, and restore from a ConfState."""

from __future__ import annotations

import pytest

from rallypoint.raft import (
    ConfChangeError,
    ConfChangeSingle,
    ConfChangeType,
    ConfState,
    Index,
    NodeId,
)
from rallypoint.raft.confchange import Changer, restore
from rallypoint.raft.tracker import ProgressMap, ProgressTracker, TrackerConfig

ADD = ConfChangeType.ADD_NODE
REMOVE = ConfChangeType.REMOVE_NODE
LEARNER = ConfChangeType.ADD_LEARNER_NODE


def cc(*changes: tuple[ConfChangeType, int]) -> list[ConfChangeSingle]:
    return [ConfChangeSingle(t, NodeId(i)) for t, i in changes]


class Harness:
    """A tracker with a last index, applying changes the way the leader does."""

    def __init__(self, last_index: int = 10) -> None:
        self.tracker = ProgressTracker(max_inflight=10)
        self.last_index = Index(last_index)

    def _swap(self, result: tuple[TrackerConfig, ProgressMap]) -> ConfState:
        self.tracker.config, self.tracker.progress = result
        return self.tracker.conf_state()

    def simple(self, *changes: tuple[ConfChangeType, int]) -> ConfState:
        return self._swap(Changer(self.tracker, self.last_index).simple(cc(*changes)))

    def enter_joint(self, auto_leave: bool, *changes: tuple[ConfChangeType, int]) -> ConfState:
        changer = Changer(self.tracker, self.last_index)
        return self._swap(changer.enter_joint(auto_leave, cc(*changes)))

    def leave_joint(self) -> ConfState:
        return self._swap(Changer(self.tracker, self.last_index).leave_joint())


def state(
    voters: tuple[int, ...] = (),
    learners: tuple[int, ...] = (),
    outgoing: tuple[int, ...] = (),
    learners_next: tuple[int, ...] = (),
    auto_leave: bool = False,
) -> ConfState:
    def as_ids(values: tuple[int, ...]) -> tuple[NodeId, ...]:
        return tuple(NodeId(v) for v in values)

    return ConfState(
        voters=as_ids(voters),
        learners=as_ids(learners),
        voters_outgoing=as_ids(outgoing),
        learners_next=as_ids(learners_next),
        auto_leave=auto_leave,
    )


def test_simple_changes_one_voter_at_a_time() -> None:
    h = Harness()
    assert h.simple((ADD, 1)) == state(voters=(1,))
    assert h.simple((ADD, 2)) == state(voters=(1, 2))
    assert h.simple((ADD, 2)) == state(voters=(1, 2))  # idempotent
    assert h.simple((LEARNER, 3)) == state(voters=(1, 2), learners=(3,))
    assert h.simple((ADD, 3)) == state(voters=(1, 2, 3))  # promotion
    assert h.simple((REMOVE, 2)) == state(voters=(1, 3))
    assert h.simple((REMOVE, 9)) == state(voters=(1, 3))  # unknown: nothing to do


def test_new_peer_progress_starts_probing_at_last_index() -> None:
    h = Harness(last_index=10)
    h.simple((ADD, 1))
    pr = h.tracker.progress[NodeId(1)]
    assert (pr.match, pr.next, pr.recent_active) == (0, 10, True)


def test_simple_change_of_two_voters_is_refused() -> None:
    h = Harness()
    h.simple((ADD, 1))
    with pytest.raises(ConfChangeError, match="more than one voter"):
        h.simple((ADD, 2), (ADD, 3))
    # A voter swap also changes two voters.
    h.simple((ADD, 2))
    with pytest.raises(ConfChangeError):
        h.simple((ADD, 3), (REMOVE, 1))
    assert h.tracker.conf_state() == state(voters=(1, 2))  # untouched on failure


def test_removing_all_voters_is_refused() -> None:
    h = Harness()
    h.simple((ADD, 1))
    with pytest.raises(ConfChangeError, match="removed all voters"):
        h.simple((REMOVE, 1))


def test_enter_and_leave_joint_configuration() -> None:
    h = Harness()
    for i in (1, 2, 3):
        h.simple((ADD, i))
    joint = h.enter_joint(True, (REMOVE, 1), (ADD, 4), (ADD, 5))
    assert joint == state(voters=(2, 3, 4, 5), outgoing=(1, 2, 3), auto_leave=True)
    # Node 1 keeps its progress while it is an outgoing voter.
    assert NodeId(1) in h.tracker.progress
    with pytest.raises(ConfChangeError, match="already joint"):
        h.enter_joint(False, (ADD, 6))
    with pytest.raises(ConfChangeError, match="simple config change in joint"):
        h.simple((ADD, 6))
    assert h.leave_joint() == state(voters=(2, 3, 4, 5))
    assert NodeId(1) not in h.tracker.progress
    with pytest.raises(ConfChangeError, match="non-joint"):
        h.leave_joint()


def test_demoting_a_voter_goes_through_learners_next() -> None:
    h = Harness()
    for i in (1, 2, 3):
        h.simple((ADD, i))
    joint = h.enter_joint(False, (LEARNER, 3))
    assert joint == state(voters=(1, 2), outgoing=(1, 2, 3), learners_next=(3,))
    assert not h.tracker.progress[NodeId(3)].is_learner  # still votes in the outgoing half
    assert h.leave_joint() == state(voters=(1, 2), learners=(3,))
    assert h.tracker.progress[NodeId(3)].is_learner


def test_promoting_a_learner_in_joint_config() -> None:
    h = Harness()
    h.simple((ADD, 1))
    h.simple((LEARNER, 2))
    assert h.enter_joint(True, (ADD, 2)) == state(voters=(1, 2), outgoing=(1,), auto_leave=True)
    assert not h.tracker.progress[NodeId(2)].is_learner
    assert h.leave_joint() == state(voters=(1, 2))


def test_cannot_make_zero_voter_config_joint() -> None:
    with pytest.raises(ConfChangeError, match="zero-voter"):
        Harness().enter_joint(False, (ADD, 1))


def test_blanked_changes_are_skipped() -> None:
    h = Harness()
    h.simple((ADD, 1))
    assert h.simple((ADD, 0)) == state(voters=(1,))


@pytest.mark.parametrize(
    "conf_state",
    [
        state(voters=(1, 2, 3)),
        state(voters=(1, 2, 3), learners=(4, 5)),
        state(voters=(1, 2, 3), learners=(5,), outgoing=(1, 2, 4, 6), learners_next=(4,)),
        state(voters=(2, 3), outgoing=(1, 2, 3), auto_leave=True),
        state(voters=(1,), learners=(2,), outgoing=(1, 3), learners_next=(3,), auto_leave=True),
        state(),
    ],
)
def test_restore_rebuilds_the_conf_state(conf_state: ConfState) -> None:
    tracker = ProgressTracker(max_inflight=10)
    restore(Changer(tracker, Index(20)), conf_state)
    assert tracker.conf_state() == conf_state
    expected_ids = (
        set(conf_state.voters) | set(conf_state.learners) | set(conf_state.voters_outgoing)
    )
    assert set(tracker.progress) == expected_ids
    for node_id, pr in tracker.progress.items():
        assert pr.is_learner is (node_id in conf_state.learners)
