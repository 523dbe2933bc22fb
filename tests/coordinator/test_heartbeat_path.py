"""One heartbeat path: the per-participant Heartbeat stream and HeartbeatBatch reach a member's
detection through the same group API (``liveness.port.LivenessPort``).

The servicers run over a real ``RendezvousSupervisor`` (the port's implementation) on the fake
member's state machine, so what the streams did is read from the detectors themselves.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import AsyncIterator

import grpc
import pytest

from rallypoint.coordinator.leader.supervisor import RendezvousSupervisor
from rallypoint.coordinator.liveness.local import GROUP_JOB
from rallypoint.coordinator.liveness.port import LivenessPort
from rallypoint.coordinator.state.commands import Command
from rallypoint.proto.v1 import rendezvous_pb2 as pb
from rallypoint.proto.v1.rendezvous_pb2_grpc import RendezvousStub as Stub

from .fake_node import FakeNode, join_round, open_session, serving, until


class SupervisedNode(FakeNode):
    """The fake member, with a real supervisor as its liveness."""

    def __init__(self) -> None:
        super().__init__()

        async def propose(command: Command) -> None:
            return None

        self.supervisor = RendezvousSupervisor(self.state, propose, lambda: self.clock_ms)
        self.supervisor.promote()

    @property
    def liveness(self) -> LivenessPort:  # type: ignore[override]
        return self.supervisor


@contextlib.asynccontextmanager
async def joined(count: int) -> AsyncIterator[tuple[SupervisedNode, Stub, list[int]]]:
    """A supervised fake member serving the public API, a Rendezvous stub to it, and the
    participant ids of a round of ``count`` joined there."""
    node = SupervisedNode()
    async with serving(node) as channel:
        answers = await join_round(channel, await open_session(node), "j", count)
        yield node, Stub(channel), [answer.participant_id for answer in answers]


async def test_both_streams_feed_groups_and_only_per_participant_groups_give_readings() -> None:
    async with joined(3) as (node, stub, (a, b, c)):
        single = stub.Heartbeat()
        for pid in (a, b):
            await single.write(pb.HeartbeatRequest(job="j", participant_id=pid))
            assert isinstance(await single.read(), pb.HeartbeatResponse)
        batch = stub.HeartbeatBatch()
        await batch.write(pb.HeartbeatBatchRequest(job="j", participant_ids=[c], seq=1))
        assert isinstance(await batch.read(), pb.HeartbeatBatchResponse)
        detection = node.supervisor.local
        # Every detector is a group's: a group of one per participant of the per-participant
        # stream, and one for the batch stream.
        tracked = detection.detectors.tracked()
        assert len(tracked) == 3 and all(key[0] == GROUP_JOB for key in tracked)
        carried = [("j", a), ("j", b), ("j", c)]
        assert detection.carried() == carried
        # The leader is sent readings of the participants watched one by one, as before.
        now_ms = int(detection.detectors.last_heartbeat_ms(tracked[0]) or 0)
        assert [key for key, _, _ in detection.readings(now_ms)] == carried[:2]
        # The per-participant stream ends abnormally: each of its participants is left alone
        # with the evidence; the batch stream's participant is untouched.
        single.cancel()
        await until(lambda: ("j", a) in detection.detectors)
        await until(lambda: ("j", b) in detection.detectors)
        for pid in (a, b):
            key = ("j", pid)
            assert detection.detectors.stream_closed_ms(key) is not None
            later = int(detection.detectors.stream_closed_ms(key) or 0) + 10_000
            assert math.isinf(detection.phi(key, later) or 0.0)
        assert ("j", c) not in detection.detectors
        batch.cancel()


async def test_a_cut_off_member_ends_the_per_participant_stream_and_lets_it_go(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with joined(1) as (node, stub, (pid,)):
        call = stub.Heartbeat()
        await call.write(pb.HeartbeatRequest(job="j", participant_id=pid))
        assert isinstance(await call.read(), pb.HeartbeatResponse)
        detection = node.supervisor.local
        assert detection.take_report([]).attach == [("j", pid)]
        monkeypatch.setattr(node.supervisor, "serves_heartbeats", lambda: False)
        await call.write(pb.HeartbeatRequest(job="j", participant_id=pid))
        assert await call.code() == grpc.StatusCode.UNAVAILABLE
        # Released, not suspected: no detector is left, and the leader hears it was let go.
        await until(lambda: not detection.carries(("j", pid)))
        assert detection.detectors.tracked() == []
        assert detection.take_report([]).detach == [("j", pid)]
