"""The leader's rendezvous duties: who gets declared failed, and when not to believe phi."""

from __future__ import annotations

import asyncio

import pytest

from rallypoint.coordinator.leader import supervisor as supervisor_module
from rallypoint.coordinator.leader.supervisor import RendezvousSupervisor
from rallypoint.coordinator.state.commands import Command, MemberFailed

from .job_replica import JobReplica


class Clock:
    def __init__(self) -> None:
        self.ms = 1_000_000

    def __call__(self) -> int:
        return self.ms


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(supervisor_module, "monotonic_ms", clock)
    return clock


async def _supervise(replica: JobReplica, clock: Clock) -> tuple[RendezvousSupervisor, list]:
    proposed: list[Command] = []

    async def propose(command: Command) -> None:
        proposed.append(command)

    sup = RendezvousSupervisor(replica.sm, propose, clock, grace_ms=0)
    sup.promote()
    return sup, proposed


async def _step(sup: RendezvousSupervisor) -> None:
    sup.step()
    await asyncio.sleep(0)  # let the proposal tasks run


async def test_one_silent_worker_is_declared_failed(clock: Clock) -> None:
    replica = JobReplica()
    pids = replica.workers(4)
    sup, proposed = await _supervise(replica, clock)
    for _ in range(20):  # 2 s of regular heartbeats from everyone but the last
        clock.ms += 100
        for pid in pids[:-1]:
            sup.heartbeat("j", pid)
        await _step(sup)
    # (Proposed again after a second: the fake proposal is never applied.)
    failed = {c.participant_id for c in proposed if isinstance(c, MemberFailed)}
    assert failed == {pids[-1]}


async def test_phi_against_most_of_a_job_at_once_waits_before_believing_it(clock: Clock) -> None:
    replica = JobReplica()
    pids = replica.workers(4)
    sup, proposed = await _supervise(replica, clock)
    for _ in range(10):
        clock.ms += 100
        for pid in pids:
            sup.heartbeat("j", pid)
        await _step(sup)
    # The leader hears nothing from three of four workers for 2 s: not yet believed.
    clock.ms += 2_000
    sup.heartbeat("j", pids[0])
    await _step(sup)
    assert not [c for c in proposed if isinstance(c, MemberFailed)]
    # Still silent past the hold: believed.
    for _ in range(60):
        clock.ms += 100
        sup.heartbeat("j", pids[0])
        await _step(sup)
    failed = {c.participant_id for c in proposed if isinstance(c, MemberFailed)}
    assert failed == set(pids[1:])


async def test_a_closed_stream_is_believed_even_for_many(clock: Clock) -> None:
    replica = JobReplica()
    pids = replica.workers(4)
    sup, proposed = await _supervise(replica, clock)
    for pid in pids[1:]:
        sup.stream_closed("j", pid)
    for _ in range(5):
        clock.ms += 100
        sup.heartbeat("j", pids[0])
        await _step(sup)
    failed = {c.participant_id for c in proposed if isinstance(c, MemberFailed)}
    assert failed == set(pids[1:])


async def test_no_suspicion_right_after_the_leader_itself_stalled(clock: Clock) -> None:
    replica = JobReplica()
    pids = replica.workers(4)
    sup, proposed = await _supervise(replica, clock)
    clock.ms += 100
    for pid in pids:
        sup.heartbeat("j", pid)
    # The leader's loop did not run for 1.5 s; the workers' heartbeats are still queued.
    clock.ms += 1_500
    sup.loop_stalled(1_500)
    await _step(sup)
    assert not proposed
