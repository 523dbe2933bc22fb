"""RoleLog: one line per role or leader change, with the term and the reason."""

from __future__ import annotations

import logging

import pytest

from rallypoint.coordinator.role_log import RoleLog
from rallypoint.raft import SoftState, StateType
from rallypoint.raft.types import NONE, NodeId

F, P, C, L = StateType.FOLLOWER, StateType.PRE_CANDIDATE, StateType.CANDIDATE, StateType.LEADER


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records]


def soft(lead: int, state: StateType) -> SoftState:
    return SoftState(NodeId(lead), state)


def test_an_election_after_the_leader_went_silent(
    clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    role_log = RoleLog(1, clock, logging.getLogger("t"))
    role_log.observe(soft(2, F), 3)
    caplog.clear()
    clock.now += 1.0
    role_log.observe(soft(NONE, P), 3)
    clock.now += 0.4
    role_log.observe(soft(NONE, C), 4)
    role_log.observe(soft(1, L), 4)
    assert lines(caplog) == [
        "member 1 started an election at term 3 (pre-candidate): no word from leader 2 for "
        "an election timeout",
        "member 1 became leader at term 4 after 0.4 s without one",
    ]


def test_step_downs_name_their_cause(clock: Clock, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    role_log = RoleLog(1, clock, logging.getLogger("t"))
    role_log.observe(soft(1, L), 4)
    caplog.clear()
    role_log.observe(soft(NONE, F), 4)  # same term, no leader: check-quorum
    role_log.observe(soft(1, L), 6)
    role_log.observe(soft(3, F), 7)  # a higher term
    role_log.observe(soft(1, L), 8)
    role_log.observe(soft(2, F), 9, lead_transferee=2)
    messages = lines(caplog)
    assert "stepped down as leader at term 4: no quorum answered" in messages[0]
    assert any("at term 7: a member is at a higher term (7 > 6)" in m for m in messages)
    assert any("at term 9: handed leadership to member 2" in m for m in messages)
    assert "member 1: leader is member 2 at term 9" in messages


def test_a_transfer_to_this_member_is_named_as_such(
    clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    role_log = RoleLog(2, clock, logging.getLogger("t"))
    role_log.observe(soft(1, F), 5)
    caplog.clear()
    role_log.observe(soft(1, C), 6)  # straight to candidate with pre-vote on
    assert lines(caplog) == [
        "member 2 started an election at term 6 (candidate): leadership is being transferred to it"
    ]


def test_a_lasting_absence_of_a_leader_is_reported_every_few_seconds(
    clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    role_log = RoleLog(3, clock, logging.getLogger("t"), leaderless_report_s=5.0)
    role_log.observe(soft(1, F), 2)
    role_log.observe(soft(NONE, P), 2)
    caplog.clear()
    for _ in range(130):  # 13 s of 100 ms ticks
        clock.now += 0.1
        role_log.check_leaderless()
    reports = lines(caplog)
    assert len(reports) == 2
    assert reports[0].startswith("member 3 has known no leader for 5.")
    assert "s (term 2, pre-candidate)" in reports[0]
    assert reports[0].endswith("the last leader was member 1")
    role_log.observe(soft(2, F), 3)
    caplog.clear()
    clock.now += 10
    role_log.check_leaderless()
    assert lines(caplog) == []
