"""The leader's soft-state lessor, driven by a hand-moved clock."""

from __future__ import annotations

from rallypoint.coordinator.leader.lessor import Lessor
from rallypoint.coordinator.state.leases import LeaseInfo


class ManualClock:
    def __init__(self) -> None:
        self.now_ms = 0

    def __call__(self) -> int:
        return self.now_ms


def test_only_the_leader_reports_expired_leases_in_id_order() -> None:
    clock = ManualClock()
    lessor = Lessor(clock)
    lessor.grant(9, 1_000)
    lessor.grant(4, 1_000)
    lessor.grant(7, 5_000)
    clock.now_ms = 1_000
    assert lessor.expired() == []  # a follower never decides expiry
    lessor.promote()  # full TTL from now: deadlines 2_000, 2_000, 6_000
    clock.now_ms = 1_999
    assert lessor.expired() == []
    clock.now_ms = 2_000
    assert lessor.expired() == [4, 9]
    assert lessor.remaining_ms(4) == 0 and lessor.remaining_ms(7) == 4_000


def test_keep_alive_extends_and_unknown_leases_answer_none() -> None:
    clock = ManualClock()
    lessor = Lessor(clock)
    lessor.promote()
    lessor.grant(3, 1_000)
    clock.now_ms = 900
    assert lessor.keep_alive(3) == 1_000
    clock.now_ms = 1_500
    assert lessor.expired() == [] and lessor.remaining_ms(3) == 400
    assert lessor.keep_alive(99) is None and lessor.remaining_ms(99) is None
    lessor.forget(3)
    assert lessor.keep_alive(3) is None


def test_a_reported_lease_is_reported_again_only_after_the_retry_interval() -> None:
    clock = ManualClock()
    lessor = Lessor(clock, retry_ms=500)
    lessor.promote()
    lessor.grant(1, 100)
    clock.now_ms = 100
    assert lessor.expired() == [1]
    clock.now_ms = 599
    assert lessor.expired() == []  # the LeaseExpire proposal may still commit
    clock.now_ms = 600
    assert lessor.expired() == [1]  # it did not: propose again


def test_leader_change_gives_every_lease_a_full_ttl() -> None:
    clock = ManualClock()
    old_leader, new_leader = Lessor(clock), Lessor(clock)
    for lessor in (old_leader, new_leader):
        lessor.grant(5, 1_000)
    old_leader.promote()
    clock.now_ms = 800
    old_leader.demote()
    assert old_leader.expired() == []
    new_leader.promote()  # deadline 1_800, although the grant alone said 1_000
    clock.now_ms = 1_500
    assert new_leader.expired() == []
    clock.now_ms = 1_800
    assert new_leader.expired() == [5]


def test_sync_matches_the_state_machine_after_a_restore() -> None:
    clock = ManualClock()
    lessor = Lessor(clock)
    lessor.grant(1, 1_000)
    lessor.grant(2, 1_000)
    clock.now_ms = 500
    lessor.sync([LeaseInfo(2, 2, 1_000, ()), LeaseInfo(8, 8, 3_000, ())])
    assert lessor.remaining_ms(1) is None
    assert lessor.remaining_ms(2) == 500  # known leases keep their deadline
    assert lessor.remaining_ms(8) == 3_000  # new ones get a full TTL
