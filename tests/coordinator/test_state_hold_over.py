"""A hold ended by the leader's word (rendezvous.py, "Failure domains"): from cluster version
4, ``CloseRound.hold_over`` says every remaining participant of the held domains was heard
from since the failure, and the round's hold ends at once (it closes if it may); below it the
field is not written and changes nothing. Times are the commands' own (the leader's)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from rallypoint.coordinator.state.commands import CloseRound, ClusterVersion, MemberFailed
from rallypoint.coordinator.state.jobs import EndReason, JobConfig, RoundState
from rallypoint.coordinator.state.results import CloseRoundResult, ClusterVersionResult
from rallypoint.coordinator.state.versions import (
    HOLD_DOMAINS_VERSION,
    HOLD_OVER_VERSION,
    required_version,
)

from .test_state_shapes import HOLD_MS, SHAPED, ShapedReplica

# Host a (3 processes) and host b (3), one unit each process.
HOSTS = replace(SHAPED, unit_size=1, min_nodes=2, max_nodes=6)


def held_after_one_process_fails(
    version: int, config: JobConfig = HOSTS
) -> tuple[ShapedReplica, list[int], list[int]]:
    """A replica at cluster ``version`` whose job lost a[0] (one process of host a): round
    2 is JOINING, held for a's two others until two heartbeat intervals after the verdict."""
    r = ShapedReplica()
    if version > 1:
        assert r.apply(ClusterVersion(version)) == ClusterVersionResult(version, True)
    a, b = r.hosts(config, a=3, b=3)
    assert r.job().round.state is RoundState.ACTIVE and r.job().round.number == 1
    r.time_ms += 10
    assert r.apply(MemberFailed("j", a[0], 1, "heartbeat stream closed")).removed  # type: ignore[attr-defined]
    held = r.job().round
    assert held.number == 2 and held.state is RoundState.JOINING
    assert held.hold_until_ms == r.time_ms + HOLD_MS
    assert held.hold_domains == (("a",) if version >= HOLD_DOMAINS_VERSION else ())
    return r, a, b


def test_the_leaders_word_that_the_host_mates_are_alive_closes_the_held_round_at_once() -> None:
    r, a, b = held_after_one_process_fails(HOLD_OVER_VERSION)
    hold_until_ms = r.job().round.hold_until_ms
    # a[1] and a[2] were heard from 110 ms after the failure: the leader ends the hold.
    r.time_ms += 110
    assert r.apply(CloseRound("j", 2, hold_over=True)) == CloseRoundResult("j", 2, True)
    closed = r.job().round
    assert closed.state is RoundState.ACTIVE and closed.closed_ms == r.time_ms < hold_until_ms
    assert sorted(closed.member_ids) == sorted([*a[1:], *b])
    assert [rec.end_reason for rec in r.job().history] == [EndReason.MEMBER_FAILED]


def test_a_hold_ended_below_min_nodes_leaves_the_round_joining_without_its_hold() -> None:
    r, a, _ = held_after_one_process_fails(HOLD_OVER_VERSION, replace(HOSTS, min_nodes=6))
    r.time_ms += 110
    assert r.apply(CloseRound("j", 2, hold_over=True)) == CloseRoundResult("j", 2, False)
    assert r.job().round.state is RoundState.JOINING
    assert (r.job().round.hold_until_ms, r.job().round.hold_domains) == (0, ())
    # A later failure holds it again, for its own domain.
    r.time_ms += 10
    assert r.apply(MemberFailed("j", a[1], 2, "phi 12.0")).removed  # type: ignore[attr-defined]
    assert r.job().round.hold_until_ms == r.time_ms + HOLD_MS
    assert r.job().round.hold_domains == ("a",)


@pytest.mark.parametrize("version", [1, 3])
def test_below_cluster_version_4_the_word_is_not_written_and_changes_nothing(
    version: int,
) -> None:
    r, _, _ = held_after_one_process_fails(version)
    held = r.job().round
    # What a leader of this cluster may propose: hold_over needs version 4.
    assert required_version(CloseRound("j", 2)) == (1, "")
    assert required_version(CloseRound("j", 2, hold_over=True)) == (4, "CloseRound.hold_over")
    # Applied anyway (a member must not act on it below the version): the hold runs on.
    r.time_ms += 110
    assert r.apply(CloseRound("j", 2, hold_over=True)) == CloseRoundResult("j", 2, False)
    assert r.job().round == held
    r.time_ms = held.hold_until_ms
    assert r.apply(CloseRound("j", 2)) == CloseRoundResult("j", 2, True)


def test_the_word_for_another_round_or_after_the_hold_changes_only_what_a_close_does() -> None:
    r, _, _ = held_after_one_process_fails(HOLD_OVER_VERSION)
    held = r.job().round
    r.time_ms += 50
    assert r.apply(CloseRound("j", 1, hold_over=True)) == CloseRoundResult("j", 1, False)
    assert r.apply(CloseRound("k", 2, hold_over=True)) == CloseRoundResult("k", 2, False)
    assert r.job().round == held
    # Past the hold it is a close like any other.
    r.time_ms = held.hold_until_ms + 5
    assert r.apply(CloseRound("j", 2, hold_over=True)) == CloseRoundResult("j", 2, True)
    assert r.job().round.closed_ms == held.hold_until_ms + 5


def test_a_host_lost_whole_is_not_ended_early_by_its_own_removals() -> None:
    # The host-loss case keeps its rule: the hold ends at the last removal (version 3),
    # with no word from the leader needed, and one round change.
    r, a, b = held_after_one_process_fails(HOLD_OVER_VERSION)
    for pid in a[1:]:
        r.time_ms += 10
        assert r.apply(MemberFailed("j", pid, 1, "phi 12.0")).removed  # type: ignore[attr-defined]
    assert r.job().round.state is RoundState.ACTIVE
    assert sorted(r.job().round.member_ids) == sorted(b)
    assert [rec.end_reason for rec in r.job().history] == [EndReason.MEMBER_FAILED]
