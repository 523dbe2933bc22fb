"""The leader ends a held round's hold once the failed member's host-mates are known alive
(supervisor.py, ``_end_hold``; cluster version 4): heard on an open stream a heartbeat
interval after the failure, or at once by a heartbeat naming the round the failure opened,
or the reporters of the failed collective. A host-mate not known alive keeps the hold (the
host may be lost whole). Clocks are the test's own."""

from __future__ import annotations

import asyncio

import pytest

from rallypoint.coordinator.leader import supervisor as supervisor_module
from rallypoint.coordinator.liveness.local import MemberDetection
from rallypoint.coordinator.liveness.report import LivenessReport
from rallypoint.coordinator.liveness.report import decode as decode_report
from rallypoint.coordinator.liveness.report import encode as encode_report
from rallypoint.coordinator.state.commands import CloseRound, ClusterVersion, Command, JoinBatch
from rallypoint.coordinator.state.jobs import EndReason, JobConfig, RoundState
from rallypoint.coordinator.state.versions import HOLD_OVER_VERSION

from .job_replica import JobReplica
from .test_supervisor import Clock, StreamedSupervisor, _host_loss_with_a_late_stream_end, _step
from .test_supervisor import clock as _clock

clock = _clock  # the fixture, under its name

# Host a: a0-a2, host b: b0.
NAMES = ("a0", "a1", "a2", "b0")


def _job(clock: Clock, version: int) -> tuple[JobReplica, dict[str, int]]:
    """Job "j" in round 1 at cluster ``version``: host a's a0-a2 and host b's b0."""
    replica = JobReplica()
    replica.time_ms = clock.ms
    if version > 1:
        replica.apply(ClusterVersion(version))
    config = JobConfig(min_nodes=1, max_nodes=4, last_call_ms=0)
    domains = tuple(n[0] for n in NAMES)
    replica.do(replica.open(), JoinBatch("j", NAMES, (), config, True, domains))
    job = replica.job()
    pids = {job.participants[s.participant_id].name: s.participant_id for s in job.round.members}
    return replica, pids


async def _supervised(
    replica: JobReplica, clock: Clock
) -> tuple[StreamedSupervisor, list[Command]]:
    """A leader's supervisor whose proposals are recorded, then applied stamped with its
    clock; everyone heard on its own stream before the failure."""
    proposed: list[Command] = []

    async def propose(command: Command) -> None:
        proposed.append(command)
        replica.time_ms = clock.ms
        replica.apply(command)

    sup = StreamedSupervisor(replica.sm, propose, clock, grace_ms=0)
    sup.promote()
    for pid in replica.job().participants:
        sup.heartbeat("j", pid)
    await _step(sup)
    return sup, proposed


async def _fail_a0(
    clock: Clock, version: int, report: bool, verdict_after_ms: int = 5
) -> tuple[JobReplica, dict[str, int], StreamedSupervisor, list[Command], int]:
    """a0 is SIGKILLed: a1's collective fails (reported here if ``report``) and a0's
    stream ends; its verdict, ``verdict_after_ms`` later, opens round 2, held until
    ``hold_until_ms`` (returned)."""
    replica, pids = _job(clock, version)
    sup, proposed = await _supervised(replica, clock)
    clock.ms += 20
    sup.stream_closed("j", pids["a0"])
    if report:
        peers = [pid for name, pid in pids.items() if name != "a1"]
        sup.collective_failed("j", 1, peers, "a1: all_reduce failed", clock.ms)
    clock.ms += verdict_after_ms
    replica.time_ms = clock.ms
    replica.fail(pids["a0"])
    held = replica.job().round
    assert held.number == 2 and held.state is RoundState.JOINING
    assert held.hold_until_ms == clock.ms + 200
    return replica, pids, sup, proposed, held.hold_until_ms


@pytest.mark.parametrize("report", [False, True])
async def test_one_process_of_three_fails_and_the_round_closes_once_its_mates_are_heard(
    clock: Clock, report: bool
) -> None:
    replica, pids, sup, proposed, hold_until_ms = await _fail_a0(clock, 4, report)
    failed_ms = hold_until_ms - 200
    # Heard within an interval of the failure: not yet evidence (the heartbeat may have
    # been sent before a death); a1's report of the failed collective is.
    clock.ms = failed_ms + 50
    for name in ("a1", "a2", "b0"):
        sup.heartbeat("j", pids[name])
    await _step(sup)
    assert replica.job().round.state is RoundState.JOINING
    clock.ms = failed_ms + 100
    for name in ("a2", "b0") if report else ("a1", "a2", "b0"):
        sup.heartbeat("j", pids[name])
    await _step(sup)
    r = replica.job().round
    assert r.state is RoundState.ACTIVE and r.closed_ms == failed_ms + 100 < hold_until_ms
    assert sorted(r.member_ids) == sorted(pids[n] for n in ("a1", "a2", "b0"))
    assert proposed[-1] == CloseRound("j", 2, hold_over=True)
    assert [rec.end_reason for rec in replica.job().history] == [EndReason.MEMBER_FAILED]


async def test_the_failure_is_dated_by_the_first_report_of_its_collective(clock: Clock) -> None:
    # The verdict came 60 ms after a1's report (a loaded member): a heartbeat an interval
    # after the report was sent after the death that failed the collective.
    replica, pids, sup, _, hold_until_ms = await _fail_a0(clock, 4, True, verdict_after_ms=60)
    reported_ms = hold_until_ms - 200 - 60
    clock.ms = reported_ms + 99
    for name in ("a2", "b0"):
        sup.heartbeat("j", pids[name])
    await _step(sup)
    assert replica.job().round.state is RoundState.JOINING
    clock.ms = reported_ms + 100
    for name in ("a2", "b0"):
        sup.heartbeat("j", pids[name])
    await _step(sup)
    r = replica.job().round
    assert r.state is RoundState.ACTIVE and r.closed_ms == reported_ms + 100


async def test_a_mate_not_heard_since_the_failure_keeps_the_hold(clock: Clock) -> None:
    replica, pids, sup, proposed, hold_until_ms = await _fail_a0(clock, 4, True)
    # a2 is silent (dead with a0, its stream's end not seen yet): the hold runs on.
    while clock.ms < hold_until_ms - 10:
        clock.ms += 10
        if clock.ms % 100 == 0:
            for name in ("a1", "b0"):
                sup.heartbeat("j", pids[name])
        await _step(sup)
        assert replica.job().round.state is RoundState.JOINING, clock.ms
    assert not any(isinstance(c, CloseRound) and c.hold_over for c in proposed)


async def test_below_cluster_version_4_the_leader_waits_for_the_hold(clock: Clock) -> None:
    replica, pids, sup, proposed, hold_until_ms = await _fail_a0(clock, 3, True)
    clock.ms = hold_until_ms - 100
    for name in ("a1", "a2", "b0"):
        sup.heartbeat("j", pids[name])
    while clock.ms < hold_until_ms - 1:
        clock.ms += 1
        await _step(sup)
    assert replica.job().round.state is RoundState.JOINING
    assert [c for c in proposed if isinstance(c, CloseRound)] == []
    clock.ms = hold_until_ms
    await _step(sup)
    assert replica.job().round.state is RoundState.ACTIVE
    assert [c for c in proposed if isinstance(c, CloseRound)] == [CloseRound("j", 2)]


@pytest.mark.parametrize("late_ms", [10, 150, 190])
async def test_a_host_loss_still_ends_one_round_at_cluster_version_4(
    clock: Clock, late_ms: int
) -> None:
    # As test_supervisor's host loss, with the hold's early end on: b0 reports the failed
    # collective and b1 heartbeats, but a3 (host a, not heard) keeps host a's hold.
    replica = await _host_loss_with_a_late_stream_end(clock, late_ms, HOLD_OVER_VERSION)
    job = replica.job()
    assert job.round.state is RoundState.ACTIVE and len(job.round.members) == 2, job.round
    failed = [r for r in job.history if r.end_reason is EndReason.MEMBER_FAILED]
    assert [r.number for r in failed] == [1], failed


async def _joining_until_the_margin(
    clock: Clock,
    sup: StreamedSupervisor,
    replica: JobReplica,
    pid: int,
    failed_ms: int,
    named: int,
) -> None:
    """``pid`` heartbeats naming round ``named`` every 10 ms from 10 ms after the failure at
    ``failed_ms``: the round stays JOINING until one is read a heartbeat interval after it,
    and closes then."""
    while clock.ms < failed_ms + 100:
        assert replica.job().round.state is RoundState.JOINING, clock.ms
        sup.heartbeat("j", pid, round_number=named)
        await _step(sup)
        clock.ms += 10
    sup.heartbeat("j", pid, round_number=named)
    await _step(sup)
    r = replica.job().round
    assert r.state is RoundState.ACTIVE and r.closed_ms == failed_ms + 100


@pytest.mark.parametrize(("named", "margin"), [(2, False), (1, True)])
async def test_a_heartbeat_naming_the_round_the_failure_opened_ends_the_hold_at_once(
    clock: Clock, named: int, margin: bool
) -> None:
    # a1 reported the failed collective; a2, blocked in its own, is told of round 2 and
    # heartbeats naming it 10 ms after the verdict: sent after the failure, no margin. One
    # naming round 1 may have been sent before a death (queued behind it): it counts only
    # once read a heartbeat interval after the failure.
    replica, pids, sup, proposed, hold_until_ms = await _fail_a0(clock, 4, True)
    failed_ms = hold_until_ms - 200
    clock.ms = failed_ms + 5
    sup.heartbeat("j", pids["a2"], round_number=1)
    sup.heartbeat("j", pids["b0"], round_number=2)
    await _step(sup)
    assert replica.job().round.state is RoundState.JOINING  # a2 not known alive yet
    clock.ms = failed_ms + 10
    if margin:
        await _joining_until_the_margin(clock, sup, replica, pids["a2"], failed_ms, named)
        return
    sup.heartbeat("j", pids["a2"], round_number=named)
    await asyncio.sleep(0)  # as it comes: no pass needed
    r = replica.job().round
    assert r.state is RoundState.ACTIVE and r.closed_ms == failed_ms + 10
    assert sorted(r.member_ids) == sorted(pids[n] for n in ("a1", "a2", "b0"))
    assert proposed[-1] == CloseRound("j", 2, hold_over=True)


async def test_after_a_later_failure_in_the_held_round_its_name_is_no_proof(
    clock: Clock,
) -> None:
    # a1's verdict comes 50 ms into the held round 2 and pushes its hold: a heartbeat
    # naming round 2 may predate a1's death (a host-mate's, as far as the leader knows), so
    # only the margin after that later failure counts.
    replica, pids, sup, _, _ = await _fail_a0(clock, 4, False)
    clock.ms += 50
    replica.time_ms = clock.ms
    replica.fail(pids["a1"])
    r = replica.job().round
    assert r.number == 2 and r.hold_until_ms == clock.ms + 200
    second_ms = clock.ms
    clock.ms = second_ms + 10
    await _joining_until_the_margin(clock, sup, replica, pids["a2"], second_ms, 2)


async def test_another_members_word_of_a_named_round_ends_the_hold_as_it_comes(
    clock: Clock,
) -> None:
    # a2 streams to member 2, whose report says a2 named round 2 on its open stream: taken
    # as it comes, before the leader's next pass has seen the round held.
    replica, pids, sup, proposed, hold_until_ms = await _fail_a0(clock, 4, True)
    failed_ms = hold_until_ms - 200
    clock.ms = failed_ms + 10
    key = ("j", pids["a2"])
    report = LivenessReport(full=True, attach=[key], heard=[(key, 5)], named=[(key, 1)])
    report.boot, report.seq = 2, 1
    assert sup.take_report(2, encode_report(report))
    await asyncio.sleep(0)
    assert replica.job().round.state is RoundState.JOINING  # the ended round: no proof
    report = LivenessReport(heard=[(key, 1)], named=[(key, 2)])
    report.boot, report.seq = 2, 2
    assert sup.take_report(2, encode_report(report))
    await asyncio.sleep(0)
    r = replica.job().round
    assert r.state is RoundState.ACTIVE and r.closed_ms == failed_ms + 10
    assert proposed[-1] == CloseRound("j", 2, hold_over=True)


async def test_a_follower_reports_a_newer_round_named_in_a_held_job_as_it_comes(
    clock: Clock,
) -> None:
    replica, pids = _job(clock, 4)
    sent: list[bytes] = []

    async def send_report(leader: int, payload: bytes) -> bool:
        sent.append(payload)
        return True

    async def never(command: Command) -> None:
        raise AssertionError(f"a follower proposed {command}")

    follower = StreamedSupervisor(
        replica.sm, never, clock, member_id=2, leader_id=lambda: 1, send_report=send_report
    )
    for name in NAMES:
        follower.heartbeat("j", pids[name], round_number=1)
    await _step(follower)
    await asyncio.sleep(0)
    clock.ms += 20
    replica.time_ms = clock.ms
    replica.fail(pids["a0"])
    clock.ms += 300  # its last report is long past: the next pass would report anyway
    await _step(follower)
    await asyncio.sleep(0)
    before = len(sent)
    follower.heartbeat("j", pids["a2"], round_number=2)
    await asyncio.sleep(0)
    assert len(sent) == before + 1
    assert (("j", pids["a2"]), 2) in decode_report(sent[-1]).named
    follower.heartbeat("j", pids["a2"], round_number=2)  # nothing newer: no report
    await asyncio.sleep(0)
    assert len(sent) == before + 1


async def test_a_large_rounds_heartbeats_naming_it_cost_the_leader_no_walk_each(
    clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 1,200 participants on 300 hosts; host h0's p0 dies. Every survivor is told of round
    # 2 at once and names it in its next heartbeat, one by one on the leader. The leader
    # takes each from what it named, and judges the hold by the held host's 3 mates (kept
    # per job revision), not by a walk of every participant or seat per heartbeat: 1,200 x
    # 1,200 steps at this size, minutes at 100,000.
    hosts, per_host = 300, 4
    names = tuple(f"h{h}p{p}" for h in range(hosts) for p in range(per_host))
    replica = JobReplica()
    replica.time_ms = clock.ms
    replica.apply(ClusterVersion(HOLD_OVER_VERSION))
    config = JobConfig(min_nodes=1, max_nodes=len(names), last_call_ms=0)
    domains = tuple(name.split("p")[0] for name in names)
    replica.do(replica.open(), JoinBatch("j", names, (), config, True, domains))
    job = replica.job()
    pids = {job.participants[s.participant_id].name: s.participant_id for s in job.round.members}
    sup, proposed = await _supervised(replica, clock)
    walks = {"named": 0, "seats": 0}
    named, seats = MemberDetection.named, supervisor_module.seats_to_check

    def counted_named(self: MemberDetection, jobs: frozenset[str]) -> list:
        walks["named"] += 1
        return named(self, jobs)

    def counted_seats(*args: object) -> tuple[int, ...]:
        walks["seats"] += 1
        return seats(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(MemberDetection, "named", counted_named)
    monkeypatch.setattr(supervisor_module, "seats_to_check", counted_seats)
    clock.ms += 20
    sup.stream_closed("j", pids["h0p0"])
    clock.ms += 5
    replica.time_ms = clock.ms
    replica.fail(pids["h0p0"])
    assert replica.job().round.number == 2 and replica.job().round.hold_until_ms
    clock.ms += 10
    mates = [f"h0p{p}" for p in range(1, per_host)]
    for name in [n for n in names if n not in mates and n != "h0p0"] + mates:
        assert replica.job().round.state is RoundState.JOINING, name
        sup.heartbeat("j", pids[name], round_number=2)
    await asyncio.sleep(0)
    r = replica.job().round
    assert r.state is RoundState.ACTIVE and len(r.members) == len(names) - 1
    assert proposed[-1] == CloseRound("j", 2, hold_over=True)
    assert walks["named"] == 0, walks
    assert walks["seats"] <= 2, walks
