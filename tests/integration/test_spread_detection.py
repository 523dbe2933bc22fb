"""Failure detection spread over the members, with real member processes.

Participants heartbeat in batches (``HeartbeatBatch``) to every member, a third of them to
each. Claims: followers serve heartbeat streams (nothing goes through the leader); a member
killed while it carries a third of the participants costs no false suspicion, because they
reconnect to the other members, which watch them with a grace period; and a participant
that goes silent afterwards is still detected and its round ended. Each participant learns
its own assignment (round, rank, world size) from its stream's answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

import grpc
import grpc.aio
import pytest

from rallypoint.proto.v1 import (
    common_pb2,
    rendezvous_pb2,
    rendezvous_pb2_grpc,
    session_pb2,
    session_pb2_grpc,
)

from .harness import ProcessCluster, running_cluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

JOB = "spread"
PARTICIPANTS = 12
INTERVAL_S = 0.1
CONFIG = rendezvous_pb2.JobConfig(
    min_nodes=PARTICIPANTS,
    max_nodes=PARTICIPANTS,
    heartbeat_interval_ms=int(INTERVAL_S * 1000),
    phi_threshold=8.0,
    phi_window=100,
    min_std_ms=50,
    # A loaded 2-core machine runs three members, this test and its streams.
    acceptable_pause_ms=500,
    join_timeout_ms=600_000,
    keep_checkpoints=3,
    hang_factor=2.5,
    hang_floor_ms=1500,
    startup_timeout_ms=60_000,
    straggler_windows=3,
    straggler_window_ms=10_000,
)


class Stream:
    """One HeartbeatBatch stream to one member, carrying some participants."""

    def __init__(self, member: int, address: str) -> None:
        self.member = member
        self.channel = grpc.aio.insecure_channel(address)
        self.stub = rendezvous_pb2_grpc.RendezvousStub(self.channel)
        self.pids: list[int] = []
        self.rounds: dict[int, int] = {}
        self.assignments: dict[int, rendezvous_pb2.Assignment] = {}
        self.broken = asyncio.Event()
        self.answers = 0
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._run())

    async def _requests(self):  # type: ignore[no-untyped-def]
        seq = 0
        while True:
            seq += 1
            yield rendezvous_pb2.HeartbeatBatchRequest(
                job=JOB,
                participant_ids=list(self.pids),
                rounds=[self.rounds.get(pid, 0) for pid in self.pids],
                seq=seq,
                sent_ms=int(time.monotonic() * 1000),
            )
            await asyncio.sleep(INTERVAL_S)

    async def _run(self) -> None:
        call = self.stub.HeartbeatBatch(self._requests())
        try:
            async for answer in call:
                self.answers += 1
                assert answer.header.member_id == self.member
                for assignment in answer.assignments:
                    self.assignments[assignment.participant_id] = assignment
                    self.rounds[assignment.participant_id] = assignment.round
        except grpc.aio.AioRpcError:
            pass
        finally:
            self.broken.set()

    async def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
        await self.channel.close(grace=None)


async def join_all(address: str) -> list[int]:
    async with grpc.aio.insecure_channel(address) as channel:
        sessions = session_pb2_grpc.SessionStub(channel)
        opened = await sessions.Open(session_pb2.SessionOpenRequest(ttl_ms=120_000), timeout=20)
        stub = rendezvous_pb2_grpc.RendezvousStub(channel)
        pids = []
        for i in range(PARTICIPANTS):
            header = common_pb2.RequestHeader(
                session_id=opened.session_id, sequence=i + 1, first_unacked=i + 1
            )
            joined = await stub.Join(
                rendezvous_pb2.JoinRequest(header=header, job=JOB, name=f"p{i}", config=CONFIG),
                timeout=20,
            )
            pids.append(joined.participant_id)
        return pids


async def history(address: str) -> list[rendezvous_pb2.RoundRecord]:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = rendezvous_pb2_grpc.RendezvousStub(channel)
        got = await stub.GetJob(rendezvous_pb2.GetJobRequest(job=JOB), timeout=10)
        return list(got.history)


async def wait_for(condition, timeout_s: float, what: str) -> float:  # type: ignore[no-untyped-def]
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout_s:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        await asyncio.sleep(0.05)
    return time.monotonic() - started


def address_of(cluster: ProcessCluster, member: int) -> str:
    return cluster.endpoints[member - 1]


async def test_a_member_dies_with_a_third_of_the_heartbeats_and_nobody_is_falsely_suspected(
    tmp_path: Path,
) -> None:
    with running_cluster(tmp_path, 3) as cluster:
        leader = cluster.leader()
        victim = next(m for m in (1, 2, 3) if m != leader)
        pids = await join_all(address_of(cluster, leader))
        streams = {m: Stream(m, address_of(cluster, m)) for m in (1, 2, 3)}
        for i, pid in enumerate(pids):
            streams[1 + i % 3].pids.append(pid)
        for stream in streams.values():
            stream.start()
        try:
            # Every participant is told its own seat once the round closes: ranks 0..11.
            def all_active() -> bool:
                seen = [s.assignments.get(p) for s in streams.values() for p in s.pids]
                return all(
                    a is not None and a.state == rendezvous_pb2.ROUND_STATE_ACTIVE for a in seen
                )

            await wait_for(all_active, 30, "every participant told its ACTIVE round")
            seats = [s.assignments[p] for s in streams.values() for p in s.pids]
            assert sorted(a.rank for a in seats) == list(range(PARTICIPANTS))
            assert {a.world_size for a in seats} == {PARTICIPANTS}
            assert len({a.round for a in seats}) == 1
            first_round = seats[0].round
            assert all(a.store_namespace == f"{JOB}/{first_round}" for a in seats)
            # Followers served streams too.
            assert all(s.answers > 0 for s in streams.values())

            # Kill a follower carrying a third of the participants; they reconnect to the
            # other members (spread over both), as a client does when its stream breaks.
            cluster.kill(victim)
            await asyncio.wait_for(streams[victim].broken.wait(), 10)
            moved = streams.pop(victim).pids
            await asyncio.sleep(0)
            survivors = sorted(streams)
            for i, pid in enumerate(moved):
                target = streams[survivors[i % 2]]
                target.pids.append(pid)
                target.rounds[pid] = first_round
            # Well past detection bounds and the leader's grace for moved participants.
            await asyncio.sleep(8)
            records = await history(address_of(cluster, leader))
            failed = [r for r in records if r.ended_by]
            assert not failed, f"false suspicion after a member died: {failed}"

            # A participant that goes silent afterwards is still detected.
            silent_stream = streams[survivors[0]]
            silent = silent_stream.pids.pop()
            started = time.monotonic()

            async def ended() -> list[rendezvous_pb2.RoundRecord]:
                return [r for r in await history(address_of(cluster, leader)) if r.ended_by]

            found: list[rendezvous_pb2.RoundRecord] = []
            while not found and time.monotonic() - started < 20:
                await asyncio.sleep(0.1)
                found = await ended()
            assert found, "the silent participant was never declared failed"
            assert found[0].ended_by == silent
            assert found[0].end_reason == rendezvous_pb2.ROUND_END_REASON_MEMBER_FAILED
            print(f"silent participant declared failed after {time.monotonic() - started:.2f} s")
            # The others learn of the new round from their own streams.
            await wait_for(
                lambda: all(
                    s.assignments[p].round > first_round for s in streams.values() for p in s.pids
                ),
                20,
                "survivors told of the next round",
            )
        finally:
            for stream in list(streams.values()):
                await stream.close()
