"""One heartbeat path: the per-participant Heartbeat stream and HeartbeatBatch reach a member's
detection through the same group API (``liveness.port.LivenessPort``).

The servicers run over a real ``RendezvousSupervisor`` (the port's implementation) on the fake
member's state machine, so what the streams did is read from the detectors themselves.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator

import grpc
import pytest

from rallypoint.coordinator.leader.supervisor import RendezvousSupervisor
from rallypoint.coordinator.liveness.local import GROUP_JOB
from rallypoint.coordinator.liveness.port import LivenessPort
from rallypoint.coordinator.state.commands import Command
from rallypoint.proto.v1 import rendezvous_pb2 as pb
from rallypoint.proto.v1 import rendezvous_pb2_grpc

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


@pytest.fixture
async def served() -> AsyncIterator[tuple[SupervisedNode, grpc.aio.Channel]]:
    node = SupervisedNode()
    async with serving(node) as channel:
        yield node, channel


async def test_both_streams_feed_group_detectors_and_only_one_by_one_groups_report_readings(
    served: tuple[SupervisedNode, grpc.aio.Channel],
) -> None:
    node, channel = served
    headers = await open_session(node)
    a, b, c = await join_round(channel, headers, "j", 3)
    stub = rendezvous_pb2_grpc.RendezvousStub(channel)
    single = stub.Heartbeat()
    for joined in (a, b):
        await single.write(pb.HeartbeatRequest(job="j", participant_id=joined.participant_id))
        assert isinstance(await single.read(), pb.HeartbeatResponse)
    batch = stub.HeartbeatBatch()
    await batch.write(pb.HeartbeatBatchRequest(job="j", participant_ids=[c.participant_id], seq=1))
    assert isinstance(await batch.read(), pb.HeartbeatBatchResponse)
    detection = node.supervisor.local
    # Every detector is a group's: a group of one per participant of the per-participant
    # stream, and one for the batch stream.
    tracked = detection.detectors.tracked()
    assert len(tracked) == 3 and all(key[0] == GROUP_JOB for key in tracked)
    carried = [("j", a.participant_id), ("j", b.participant_id), ("j", c.participant_id)]
    assert detection.carried() == carried
    # The leader is sent readings of the participants watched one by one, as before.
    now_ms = int(detection.detectors.last_heartbeat_ms(tracked[0]) or 0)
    assert [key for key, _, _ in detection.readings(now_ms)] == carried[:2]
    # The per-participant stream ends abnormally: each of its participants is left alone
    # with the evidence; the batch stream's participant is untouched.
    single.cancel()
    await until(lambda: ("j", a.participant_id) in detection.detectors)
    await until(lambda: ("j", b.participant_id) in detection.detectors)
    for joined in (a, b):
        key = ("j", joined.participant_id)
        assert detection.detectors.stream_closed_ms(key) is not None
        later = int(detection.detectors.stream_closed_ms(key) or 0) + 10_000
        assert math.isinf(detection.phi(key, later) or 0.0)
    assert ("j", c.participant_id) not in detection.detectors
    batch.cancel()


async def test_a_cut_off_member_ends_the_per_participant_stream_and_lets_it_go(
    served: tuple[SupervisedNode, grpc.aio.Channel],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    node, channel = served
    headers = await open_session(node)
    (joined,) = await join_round(channel, headers, "j", 1)
    stub = rendezvous_pb2_grpc.RendezvousStub(channel)
    call = stub.Heartbeat()
    await call.write(pb.HeartbeatRequest(job="j", participant_id=joined.participant_id))
    assert isinstance(await call.read(), pb.HeartbeatResponse)
    detection = node.supervisor.local
    assert detection.take_report([]).attach == [("j", joined.participant_id)]
    monkeypatch.setattr(node.supervisor, "serves_heartbeats", lambda: False)
    await call.write(pb.HeartbeatRequest(job="j", participant_id=joined.participant_id))
    assert await call.code() == grpc.StatusCode.UNAVAILABLE
    # Released, not suspected: no detector is left, and the leader hears it was let go.
    await until(lambda: not detection.carries(("j", joined.participant_id)))
    assert detection.detectors.tracked() == []
    assert detection.take_report([]).detach == [("j", joined.participant_id)]
