"""HeartbeatBatch over a real gRPC server and the fake member: one request beats for many
participants, every request is answered, each participant is pushed its own assignment only
when its round changed (O(N) bytes per round change in all), and a stream's end is evidence
only for those it still carried."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest

from rallypoint.coordinator.state import Limits
from rallypoint.coordinator.state.jobs import RendezvousLimits
from rallypoint.proto.v1 import rendezvous_pb2 as pb
from rallypoint.proto.v1 import rendezvous_pb2_grpc

from .fake_node import FakeNode, Headers, join_round, open_session, rpc_failure, serving, until

Code = grpc.StatusCode
LIMITS = Limits(rendezvous=RendezvousLimits(max_waiting=64))


@pytest.fixture
async def served() -> AsyncIterator[tuple[FakeNode, grpc.aio.Channel, Headers]]:
    node = FakeNode(LIMITS)
    async with serving(node) as channel:
        yield node, channel, await open_session(node)


def batch(
    seq: int, pids: list[int], rounds: list[int] | None = None, **fields: object
) -> pb.HeartbeatBatchRequest:
    return pb.HeartbeatBatchRequest(
        job="j",
        participant_ids=pids,
        rounds=rounds if rounds is not None else [],
        seq=seq,
        **fields,  # type: ignore[arg-type]
    )


async def test_one_request_beats_for_many_and_each_is_told_its_own_seat(
    served: tuple[FakeNode, grpc.aio.Channel, Headers],
) -> None:
    node, channel, headers = served
    joined = await join_round(channel, headers, "j", 4)
    pids = [j.participant_id for j in joined]
    call = rendezvous_pb2_grpc.RendezvousStub(channel).HeartbeatBatch()
    await call.write(batch(1, pids, sent_ms=1_000))
    first = await call.read()
    assert isinstance(first, pb.HeartbeatBatchResponse) and first.seq == 1
    seats = {a.participant_id: a for a in first.assignments}
    assert sorted(seats) == sorted(pids)
    token = seats[pids[0]].fencing_token
    for rank, pid in enumerate(pids):
        a = seats[pid]
        assert (a.round, a.state, a.rank, a.world_size) == (1, pb.ROUND_STATE_ACTIVE, rank, 4)
        assert (a.fencing_token, a.store_namespace, a.waiting, a.gone) == (
            token,
            "j/1",
            False,
            False,
        )
    assert token > 0
    assert node.carried == [("j", p) for p in pids]
    assert node.heartbeats == [("j", p) for p in pids]
    # Told already, and naming the current round: answered, with nothing to say.
    await call.write(batch(2, pids, [1] * 4, sent_ms=1_100))
    second = await call.read()
    assert isinstance(second, pb.HeartbeatBatchResponse)
    assert (second.seq, len(second.assignments)) == (2, 0)
    assert node.heartbeats == [("j", p) for p in pids] * 2
    assert len(node.lags) == 2  # the member measures its intake on every request
    await call.done_writing()


async def test_a_round_change_is_pushed_to_each_and_the_departed_are_told_gone(
    served: tuple[FakeNode, grpc.aio.Channel, Headers],
) -> None:
    node, channel, headers = served
    stub = rendezvous_pb2_grpc.RendezvousStub(channel)
    pids = [j.participant_id for j in await join_round(channel, headers, "j", 3)]
    call = stub.HeartbeatBatch()
    await call.write(batch(1, pids))
    assert isinstance(await call.read(), pb.HeartbeatBatchResponse)
    await stub.Leave(pb.LeaveRequest(header=headers(), job="j", participant_id=pids[1]))
    # The round change is pushed at once, unasked (seq 0), to each participant it concerns.
    pushed = await call.read()
    assert isinstance(pushed, pb.HeartbeatBatchResponse) and pushed.seq == 0
    told = {a.participant_id: a for a in pushed.assignments}
    assert told[pids[1]].gone
    for pid in (pids[0], pids[2]):
        assert (told[pid].round, told[pid].state, told[pid].rank) == (2, pb.ROUND_STATE_JOINING, -1)
    # The departed one is no longer carried: its stream ending is no evidence.
    assert node.released == [("j", pids[1])]
    # The next request is answered with nothing new for those already told.
    await call.write(batch(2, [pids[0], pids[2]], [2, 2]))
    answer = await call.read()
    assert isinstance(answer, pb.HeartbeatBatchResponse)
    assert (answer.seq, len(answer.assignments)) == (2, 0)
    # An unknown participant is told it is gone, without ending the stream.
    await call.write(batch(3, [pids[0], 999_999], [2, 0]))
    answer = await call.read()
    assert isinstance(answer, pb.HeartbeatBatchResponse)
    assert [(a.participant_id, a.gone) for a in answer.assignments] == [(999_999, True)]
    # Released participants are let go quietly; the stream's end is evidence for the rest.
    await call.write(batch(4, [pids[2]], [2], released=[pids[0]]))
    assert isinstance(await call.read(), pb.HeartbeatBatchResponse)
    assert node.released[-1] == ("j", pids[0])
    call.cancel()
    await until(lambda: node.closed_streams == [("j", pids[2])])


@pytest.mark.parametrize(
    ("request_", "code"),
    [
        (pb.HeartbeatBatchRequest(job="nope", participant_ids=[1]), Code.NOT_FOUND),
        (pb.HeartbeatBatchRequest(job="a b", participant_ids=[1]), Code.INVALID_ARGUMENT),
        (
            pb.HeartbeatBatchRequest(job="j", participant_ids=[1, 2], rounds=[1]),
            Code.INVALID_ARGUMENT,
        ),
    ],
)
async def test_a_malformed_batch_ends_the_stream_saying_why(
    served: tuple[FakeNode, grpc.aio.Channel, Headers],
    request_: pb.HeartbeatBatchRequest,
    code: grpc.StatusCode,
) -> None:
    _, channel, headers = served
    await join_round(channel, headers, "j", 1)
    call = rendezvous_pb2_grpc.RendezvousStub(channel).HeartbeatBatch()
    await call.write(request_)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call.read()
    failure = rpc_failure(info.value)
    assert failure.code == code
    if code == Code.INVALID_ARGUMENT and request_.rounds:
        assert "give one per participant" in (info.value.details() or "")


async def test_served_by_a_follower_too(served: tuple[FakeNode, grpc.aio.Channel, Headers]) -> None:
    node, channel, headers = served
    (joined,) = await join_round(channel, headers, "j", 1)
    node.not_leader(2, "10.0.0.2:2379")
    call = rendezvous_pb2_grpc.RendezvousStub(channel).HeartbeatBatch()
    await call.write(batch(1, [joined.participant_id]))
    answer = await call.read()
    assert isinstance(answer, pb.HeartbeatBatchResponse) and answer.seq == 1
    assert node.heartbeats == [("j", joined.participant_id)]
    await call.done_writing()


async def _round_change_bytes(
    channel: grpc.aio.Channel, headers: Headers, job: str, size: int
) -> tuple[int, int]:
    """Bytes pushed to ``size`` participants carried by 4 batch streams for one round
    change, and bytes of the one RoundInfo a WatchJob watcher gets for the same change."""
    stub = rendezvous_pb2_grpc.RendezvousStub(channel)
    pids = [
        j.participant_id
        for j in await join_round(channel, headers, job, size, heartbeat_interval_ms=100)
    ]
    groups = [pids[i::4] for i in range(4)]
    calls = [stub.HeartbeatBatch() for _ in groups]
    for call, group in zip(calls, groups, strict=True):
        await call.write(pb.HeartbeatBatchRequest(job=job, participant_ids=group, seq=1))
        assert isinstance(await call.read(), pb.HeartbeatBatchResponse)
    watch = stub.WatchJob(pb.WatchJobRequest(job=job))
    assert isinstance(await watch.read(), pb.WatchJobResponse)
    # The round change: one participant leaves.
    await stub.Leave(pb.LeaveRequest(header=headers(), job=job, participant_id=pids[-1]))
    pushed = 0
    for call, group in zip(calls, groups, strict=True):
        answer = await call.read()  # pushed at once, unasked
        assert isinstance(answer, pb.HeartbeatBatchResponse) and answer.seq == 0
        assert len(answer.assignments) == len(group)
        pushed += answer.ByteSize()
        call.cancel()
    changed = await watch.read()
    assert isinstance(changed, pb.WatchJobResponse)
    watch.cancel()
    return pushed, changed.ByteSize()


async def test_a_round_change_costs_o_n_bytes_in_all_not_o_n_squared(
    served: tuple[FakeNode, grpc.aio.Channel, Headers],
) -> None:
    _, channel, headers = served
    small, watch_small = await _round_change_bytes(channel, headers, "small", 16)
    large, watch_large = await _round_change_bytes(channel, headers, "large", 64)
    per_small, per_large = small / 16, large / 64
    # Each participant is pushed its own assignment: bytes per participant do not grow with
    # the job (well under a KiB), where a watcher's RoundInfo grows with every member.
    assert per_large <= 1024
    assert per_large <= per_small * 1.25
    assert watch_large > 3 * watch_small


async def test_a_member_cut_off_from_the_leader_ends_its_streams_so_workers_move(
    served: tuple[FakeNode, grpc.aio.Channel, Headers],
) -> None:
    node, channel, headers = served
    (joined,) = await join_round(channel, headers, "j", 1)
    call = rendezvous_pb2_grpc.RendezvousStub(channel).HeartbeatBatch()
    await call.write(batch(1, [joined.participant_id]))
    assert isinstance(await call.read(), pb.HeartbeatBatchResponse)
    node.cut_off = True
    await call.write(batch(2, [joined.participant_id]))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call.read()
    failure = rpc_failure(info.value)
    assert (failure.code, failure.reason) == (Code.UNAVAILABLE, "NO_LEADER")
    assert "send heartbeats to another member" in (info.value.details() or "")


async def test_the_rounds_a_batch_names_reach_the_detection_when_they_change(
    served: tuple[FakeNode, grpc.aio.Channel, Headers],
) -> None:
    """A heartbeat naming a round a failure opened is word of life after that failure
    (coordinator/leader/held.py): the member passes on the rounds each participant
    names, once per change, never for one it does not carry."""
    node, channel, headers = served
    pids = [j.participant_id for j in await join_round(channel, headers, "j", 3)]
    call = rendezvous_pb2_grpc.RendezvousStub(channel).HeartbeatBatch()
    await call.write(batch(1, pids, [1, 1, 0]))
    assert isinstance(await call.read(), pb.HeartbeatBatchResponse)
    assert node.named == [("j", pids[0], 1), ("j", pids[1], 1)]
    await call.write(batch(2, pids, [1, 1, 0]))
    assert isinstance(await call.read(), pb.HeartbeatBatchResponse)
    assert len(node.named) == 2  # unchanged: nothing passed on
    await call.write(batch(3, [*pids, 999_999], [1, 2, 1, 2]))
    assert isinstance(await call.read(), pb.HeartbeatBatchResponse)
    assert node.named[2:] == [("j", pids[0], 1), ("j", pids[1], 2), ("j", pids[2], 1)]
    await call.done_writing()


async def test_the_round_a_single_heartbeat_names_reaches_the_detection(
    served: tuple[FakeNode, grpc.aio.Channel, Headers],
) -> None:
    node, channel, headers = served
    (joined,) = await join_round(channel, headers, "j", 1)
    pid = joined.participant_id
    call = rendezvous_pb2_grpc.RendezvousStub(channel).Heartbeat()
    await call.write(pb.HeartbeatRequest(job="j", participant_id=pid))
    await call.write(pb.HeartbeatRequest(job="j", participant_id=pid, round=1))
    await until(lambda: len(node.heartbeats) == 2)
    assert node.named == [("j", pid, 1)]
    await call.done_writing()
