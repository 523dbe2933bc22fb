"""The domain hold's end (rendezvous.py, "Failure domains"): from cluster version 3 a held
round records the domains holding it (``Round.hold_domains``) and ends its hold once none
of their participants remains; below it every member keeps the older rule (the hold runs
its time), and nothing of format 4 is written."""

from __future__ import annotations

from dataclasses import replace

import pytest

from rallypoint.coordinator.state import codec
from rallypoint.coordinator.state.commands import ClusterVersion, MemberFailed
from rallypoint.coordinator.state.jobs import EndReason, Round, RoundState
from rallypoint.coordinator.state.machine import StateMachine
from rallypoint.coordinator.state.results import ClusterVersionResult, RemoveResult
from rallypoint.coordinator.state.versions import HOLD_DOMAINS_VERSION, required_version

from .test_state_shapes import HOLD_MS, SHAPED, ShapedReplica

# Host a (4) and host b (4) trained as units of 2; host c (4) waits as spares.
SPARE = replace(SHAPED, unit_size=2, min_nodes=2, max_nodes=8)


def replica(version: int = HOLD_DOMAINS_VERSION) -> ShapedReplica:
    r = ShapedReplica()
    if version > 1:
        assert r.apply(ClusterVersion(version)) == ClusterVersionResult(version, True)
    return r


def fail_one_by_one(r: ShapedReplica, pids: list[int]) -> None:
    """The detector's verdicts on ``pids``, 10 ms apart, each naming the failed round."""
    for pid in pids:
        r.time_ms += 10
        assert r.apply(MemberFailed("j", pid, 1, "phi 12.0")).removed  # type: ignore[attr-defined]


def test_a_host_lost_whole_closes_the_round_at_its_last_participants_removal() -> None:
    r = replica()
    a, b, c = r.hosts(SPARE, a=4, b=4, c=4)
    assert r.units() == [a[:2], a[2:], b[:2], b[2:]] and r.job().waiting == c
    fail_one_by_one(r, b[:3])
    held = r.job().round
    assert held.state is RoundState.JOINING and held.hold_domains == ("b",)
    assert held.hold_until_ms == r.time_ms + HOLD_MS
    assert str(r.sm.rendezvous.reason("j", r.time_ms)).endswith(
        f"held until leader time {held.hold_until_ms} ms for the participants of failed domain b"
    )
    fail_one_by_one(r, b[3:])
    # Nobody of host b is left to wait for: the spare host fills in at once, 40 ms after
    # the first verdict, not two heartbeat intervals after the last.
    assert r.job().round.state is RoundState.ACTIVE
    assert r.job().round.number == 2 and r.job().round.closed_ms == r.time_ms
    assert sorted(r.job().round.member_ids) == sorted([*a, *c])
    assert [rec.end_reason for rec in r.job().history] == [EndReason.MEMBER_FAILED]


def test_below_cluster_version_3_the_hold_runs_its_time_and_names_no_domain() -> None:
    r = replica(version=2)
    _, b, _ = r.hosts(SPARE, a=4, b=4, c=4)
    fail_one_by_one(r, b)
    held = r.job().round
    assert held.state is RoundState.JOINING and held.hold_domains == ()
    assert held.hold_until_ms == r.time_ms - 10 + HOLD_MS  # the third verdict's
    # Nothing of Round format 4 is in the state an older member may read.
    assert required_version(held) == (1, "")
    assert r.sm.rendezvous.closes_due(held.hold_until_ms - 1) == []
    assert r.sm.rendezvous.closes_due(held.hold_until_ms) == [("j", 2)]


def test_the_hold_of_two_failed_hosts_ends_when_the_last_of_both_is_removed() -> None:
    r = replica()
    a, b, c = r.hosts(replace(SPARE, unit_size=1), a=4, b=4, c=4)
    fail_one_by_one(r, [b[0]])
    # A verdict on host c's participant lands in the held successor too.
    r.time_ms += 10
    assert r.apply(MemberFailed("j", c[0], 1, "phi 12.0")) == RemoveResult("j", c[0], True, 0)
    assert r.job().round.hold_domains == ("b", "c")
    fail_one_by_one(r, b[1:])
    # Host b is gone, host c still has participants whose fate is not known: held.
    held = r.job().round
    assert held.state is RoundState.JOINING and held.hold_domains == ("c",)
    # One time for all the domains: the latest extension's (b[2]'s removal).
    assert held.hold_until_ms == r.time_ms - 10 + HOLD_MS
    fail_one_by_one(r, c[1:])
    assert r.job().round.state is RoundState.ACTIVE
    assert sorted(r.job().round.member_ids) == sorted(a)


def test_an_alive_host_mate_keeps_the_hold_to_its_end() -> None:
    r = replica()
    _, b, _ = r.hosts(SPARE, a=4, b=4, c=4)
    fail_one_by_one(r, b[:2])
    held = r.job().round
    # b[2] and b[3] are alive (heard after the failure): they are readmitted at the
    # hold's end, not before.
    assert held.hold_domains == ("b",)
    assert r.sm.rendezvous.closes_due(held.hold_until_ms - 1) == []
    assert r.sm.rendezvous.closes_due(held.hold_until_ms) == [("j", 2)]


def test_a_new_hold_after_an_expired_one_names_only_its_own_domain() -> None:
    r = replica()
    a, b, _ = r.hosts(replace(SPARE, min_nodes=10, max_nodes=10), a=4, b=4, c=4)
    fail_one_by_one(r, [a[0]])
    # Below min_nodes the round stays JOINING past its hold; a later failure on host b
    # holds it again, for b alone: host a's readmitted participants hold nothing.
    r.time_ms = r.job().round.hold_until_ms + 1_000
    r.time_ms += 10
    assert r.apply(MemberFailed("j", b[0], 2, "phi 12.0")).removed  # type: ignore[attr-defined]
    assert r.job().round.hold_domains == ("b",)
    assert r.job().round.hold_until_ms == r.time_ms + HOLD_MS


@pytest.mark.parametrize("held", [True, False])
def test_a_held_round_with_its_domains_round_trips_through_a_snapshot(held: bool) -> None:
    r = replica()
    _, b, _ = r.hosts(SPARE, a=4, b=4, c=4)
    fail_one_by_one(r, b[:2] if held else [])
    image = r.sm.snapshot()
    restored = StateMachine()
    restored.restore(image)
    assert restored.snapshot() == image
    assert restored.cluster_version == restored.rendezvous.cluster_version == 3
    job = restored.rendezvous.jobs["j"]
    assert job.round == r.job().round
    fields = codec.to_obj(job.round)
    # Round format 4 (its hold_domains) is written only while a hold names a domain.
    assert (len(fields) - 1 == len(Round.__dataclass_fields__)) is held
    # The restored machine applies the version-3 rule too.
    copy = ShapedReplica()
    copy.sm, copy.index, copy.time_ms = restored, r.index, r.time_ms
    if held:
        fail_one_by_one(copy, b[2:])
        assert copy.job().round.state is RoundState.ACTIVE
