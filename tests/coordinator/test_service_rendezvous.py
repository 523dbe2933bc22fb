"""The Rendezvous service over a real gRPC server and the fake member: jobs, joins, the
heartbeat stream, watches, job status, and every documented failure."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
import pytest

from rallypoint.coordinator.service import rendezvous as rendezvous_service
from rallypoint.coordinator.service.heartbeats import HEARTBEAT_ANSWER_EVERY
from rallypoint.coordinator.state import Limits
from rallypoint.coordinator.state.jobs import RendezvousLimits
from rallypoint.proto.v1 import common_pb2, rendezvous_pb2_grpc
from rallypoint.proto.v1 import rendezvous_pb2 as pb

from .fake_node import (
    FakeNode,
    Headers,
    fails,
    job_config,
    join_round,
    open_session,
    rpc_failure,
    serving,
    until,
)

Code = grpc.StatusCode
LIMITS = Limits(
    rendezvous=RendezvousLimits(max_jobs=2, max_waiting=1, max_name_chars=8, max_metadata_bytes=8)
)


@dataclass
class Client:
    node: FakeNode
    channel: grpc.aio.Channel
    headers: Headers
    stub: rendezvous_pb2_grpc.RendezvousStub

    async def join(self, job: str, name: str, headers: Headers | None = None) -> pb.JoinResponse:
        request = pb.JoinRequest(
            header=(headers or self.headers)(), job=job, name=name, config=job_config(2, 2)
        )
        return await self.stub.Join(request)


@pytest.fixture
async def client() -> AsyncIterator[Client]:
    node = FakeNode(LIMITS)
    async with serving(node) as channel:
        headers = await open_session(node)
        yield Client(node, channel, headers, rendezvous_pb2_grpc.RendezvousStub(channel))


# ---------------------------------------------------------------------- commands


async def test_configure_creates_changes_and_refuses_an_incompatible_config(
    client: Client,
) -> None:
    created = await client.stub.Configure(
        pb.ConfigureRequest(header=client.headers(), job="j", config=job_config(2, 3))
    )
    assert created.created and created.round.job_revision == client.node.index
    info = created.round
    assert (info.job, info.round, info.state, info.store_namespace) == (
        "j",
        1,
        pb.ROUND_STATE_JOINING,
        "j/1",
    )
    assert info.reason.startswith("0 of min 2 joined; last call not started")
    changed = await client.stub.Configure(
        pb.ConfigureRequest(header=client.headers(), job="j", config=job_config(1, 3))
    )
    assert not changed.created
    await join_round(client.channel, client.headers, "k", 2)
    conflict = await fails(
        client.stub.Configure(
            pb.ConfigureRequest(header=client.headers(), job="k", config=job_config(1, 1))
        )
    )
    assert (conflict.code, conflict.reason) == (Code.FAILED_PRECONDITION, "CONFIG_CONFLICT")
    assert "max_nodes 1 is below the round's 2 members" in conflict.details


async def test_joins_close_the_round_at_max_and_late_joiners_wait(client: Client) -> None:
    first = await client.join("j", "a")
    assert first.participant_id == client.node.index and not first.waiting
    assert first.round.state == pb.ROUND_STATE_JOINING
    assert [(m.name, m.rank) for m in first.round.members] == [("a", -1)]
    second = await client.join("j", "b")
    info = second.round
    assert (info.state, info.world_size, info.fencing_token) == (
        pb.ROUND_STATE_ACTIVE,
        2,
        client.node.index,
    )
    assert [(m.participant_id, m.rank) for m in info.members] == [
        (first.participant_id, 0),
        (second.participant_id, 1),
    ]
    assert info.reason.startswith("active since leader time")
    late = await client.join("j", "c")
    assert late.waiting and [m.name for m in late.round.waiting] == ["c"]
    again = await client.join("j", "a")
    assert again.participant_id == first.participant_id


async def test_a_join_replacing_a_member_takes_its_seat_in_one_round_change(
    client: Client,
) -> None:
    a = await client.join("j", "a")
    b = await client.join("j", "b")
    assert b.round.state == pb.ROUND_STATE_ACTIVE and b.round.round == 1
    request = pb.JoinRequest(
        header=client.headers(), job="j", name="b2", config=job_config(2, 2),
        replaces=b.participant_id,
    )  # fmt: skip
    b2 = await client.stub.Join(request)
    info = b2.round
    assert (info.round, info.state, b2.waiting) == (2, pb.ROUND_STATE_ACTIVE, False)
    assert [(m.participant_id, m.rank) for m in info.members] == [
        (a.participant_id, 0),
        (b2.participant_id, 1),
    ]


async def test_join_failures_have_their_documented_status(client: Client) -> None:
    missing = await fails(
        client.stub.Join(pb.JoinRequest(header=client.headers(), job="nope", name="a"))
    )
    assert (missing.code, missing.reason) == (Code.NOT_FOUND, "JOB_NOT_FOUND")
    await client.join("j", "a")
    other = await open_session(client.node)
    taken = await fails(client.join("j", "a", other))
    assert (taken.code, taken.reason) == (Code.ALREADY_EXISTS, "NAME_TAKEN")
    different = pb.JoinRequest(header=client.headers(), job="j", name="b", config=job_config(1, 2))
    conflict = await fails(client.stub.Join(different))
    assert (conflict.code, conflict.reason) == (Code.FAILED_PRECONDITION, "CONFIG_CONFLICT")
    big = pb.JoinRequest(header=client.headers(), job="j", name="b", metadata=b"x" * 9)
    too_big = await fails(client.stub.Join(big))
    assert (too_big.code, too_big.reason) == (Code.RESOURCE_EXHAUSTED, "LIMIT_EXCEEDED")
    await client.join("j", "b")
    await client.join("j", "c")
    full = await fails(client.join("j", "d"))
    assert (full.code, full.reason) == (Code.RESOURCE_EXHAUSTED, "LIMIT_EXCEEDED")
    await client.stub.CloseJob(pb.CloseJobRequest(header=client.headers(), job="j"))
    closed = await fails(client.join("j", "e"))
    assert (closed.code, closed.reason) == (Code.FAILED_PRECONDITION, "JOB_CLOSED")
    gone = await fails(client.stub.Join(pb.JoinRequest(header=Headers(999)(), job="j", name="f")))
    assert (gone.code, gone.reason) == (Code.NOT_FOUND, "SESSION_EXPIRED")


async def test_leave_and_evict_end_the_active_round_and_close_job_ends_everything(
    client: Client,
) -> None:
    joined_a = await client.join("j", "a")
    joined_b = await client.join("j", "b")
    waiting = await client.join("j", "c")
    left = await client.stub.Leave(
        pb.LeaveRequest(header=client.headers(), job="j", participant_id=joined_a.participant_id)
    )
    assert left.ended_round == 1
    # Round 2 closed at once with the survivor and the waiter.
    evicted = await client.stub.Evict(
        pb.EvictRequest(header=client.headers(), job="j", participant_id=waiting.participant_id)
    )
    assert evicted.ended_round == 2
    unknown_leave = await fails(
        client.stub.Leave(pb.LeaveRequest(header=client.headers(), job="j", participant_id=99))
    )
    unknown_evict = await fails(
        client.stub.Evict(pb.EvictRequest(header=client.headers(), job="j", participant_id=99))
    )
    for unknown in (unknown_leave, unknown_evict):
        assert (unknown.code, unknown.reason) == (Code.NOT_FOUND, "PARTICIPANT_NOT_FOUND")
    no_job = await fails(
        client.stub.Leave(pb.LeaveRequest(header=client.headers(), job="x", participant_id=1))
    )
    assert (no_job.code, no_job.reason) == (Code.NOT_FOUND, "JOB_NOT_FOUND")
    closed = await client.stub.CloseJob(pb.CloseJobRequest(header=client.headers(), job="j"))
    assert closed.ended_round == 3
    again = await client.stub.CloseJob(pb.CloseJobRequest(header=client.headers(), job="j"))
    assert again.ended_round == 0
    job = await client.stub.GetJob(pb.GetJobRequest(job="j"))
    assert job.round.job_closed and job.round.state == pb.ROUND_STATE_ENDED
    # The closed round's members are named from its record.
    assert [m.name for m in job.round.members] == ["b"]
    assert [m.participant_id for m in job.round.members] == [joined_b.participant_id]
    reasons = [(r.round, r.end_reason, r.ended_by) for r in job.history]
    assert reasons == [
        (1, pb.ROUND_END_REASON_MEMBER_LEFT, joined_a.participant_id),
        (2, pb.ROUND_END_REASON_MEMBER_EVICTED, waiting.participant_id),
        (3, pb.ROUND_END_REASON_JOB_CLOSED, 0),
    ]
    missing = await fails(
        client.stub.CloseJob(pb.CloseJobRequest(header=client.headers(), job="x"))
    )
    assert (missing.code, missing.reason) == (Code.NOT_FOUND, "JOB_NOT_FOUND")


# ---------------------------------------------------------------------- validation


def _bad_requests() -> list[tuple[str, str, object]]:
    h = Headers(1)
    unsequenced = common_pb2.RequestHeader(session_id=1)
    return [
        ("Configure", "header", pb.ConfigureRequest(job="j", config=job_config(1, 1))),
        ("Configure", "job", pb.ConfigureRequest(header=h(), job="a b", config=job_config(1, 1))),
        ("Configure", "job", pb.ConfigureRequest(header=h(), job="", config=job_config(1, 1))),
        ("Configure", "job", pb.ConfigureRequest(header=h(), job="j" * 129)),
        ("Configure", "config", pb.ConfigureRequest(header=h(), job="j")),
        *(
            ("Configure", f"config.{name}", pb.ConfigureRequest(header=h(), job="j", config=c))
            for name, c in [
                ("min_nodes", job_config(0, 1)),
                ("max_nodes", job_config(2, 1)),
                ("max_nodes", job_config(1, 200_000)),
                ("last_call_ms", job_config(1, 1, last_call_ms=-1)),
                ("join_timeout_ms", job_config(1, 1, join_timeout_ms=0)),
                ("heartbeat_interval_ms", job_config(1, 1, heartbeat_interval_ms=0)),
                ("phi_threshold", job_config(1, 1, phi_threshold=0.0)),
                ("phi_threshold", job_config(1, 1, phi_threshold=math.nan)),
                ("phi_window", job_config(1, 1, phi_window=1)),
                ("min_std_ms", job_config(1, 1, min_std_ms=0)),
                ("acceptable_pause_ms", job_config(1, 1, acceptable_pause_ms=-5)),
                ("keep_checkpoints", job_config(1, 1, keep_checkpoints=0)),
            ]
        ),
        ("Join", "name", pb.JoinRequest(header=h(), job="j", name="")),
        ("Join", "name", pb.JoinRequest(header=h(), job="j", name="n" * 9)),
        (
            "Join",
            "config.min_nodes",
            pb.JoinRequest(header=h(), job="j", name="a", config=job_config(0, 1)),
        ),
        ("Leave", "participant_id", pb.LeaveRequest(header=h(), job="j")),
        (
            "Leave",
            "header.sequence",
            pb.LeaveRequest(header=unsequenced, job="j", participant_id=1),
        ),
        ("Evict", "participant_id", pb.EvictRequest(header=h(), job="j")),
        ("CloseJob", "job", pb.CloseJobRequest(header=h(), job="?")),
        ("GetJob", "job", pb.GetJobRequest(job="")),
    ]


@pytest.mark.parametrize(("method", "field", "request_"), _bad_requests())
async def test_malformed_requests_are_refused_naming_the_field(
    client: Client, method: str, field: str, request_: object
) -> None:
    failure = await fails(getattr(client.stub, method)(request_))
    assert (failure.code, failure.reason) == (Code.INVALID_ARGUMENT, "INVALID_REQUEST")
    assert failure.details.startswith(f"{field}: "), failure.details
    assert client.node.proposals == []


# ---------------------------------------------------------------------- reads


async def test_get_job_reports_config_ranks_phi_history_and_latest_checkpoint(
    client: Client,
) -> None:
    a, b = await join_round(client.channel, client.headers, "j", 2, phi_threshold=8.5)
    client.node.phis[("j", a.participant_id)] = 0.25
    client.node.phis[("j", b.participant_id)] = math.inf
    client.node.heartbeat_ages[("j", b.participant_id)] = 1_234
    barriers = client.node.read_barriers
    job = await client.stub.GetJob(pb.GetJobRequest(job="j"))
    assert client.node.read_barriers == barriers + 1
    assert job.config == job_config(2, 2, phi_threshold=8.5)
    assert [(m.name, m.rank, m.phi) for m in job.round.members] == [
        ("w0", 0, 0.25),
        ("w1", 1, math.inf),
    ]
    assert [m.heartbeat_age_ms for m in job.round.members] == [0, 1_234]
    assert not job.history and not job.HasField("latest_checkpoint")
    # A follower has no detectors: phi is 0 there, as the contract says.
    client.node.not_leader(2, "10.0.0.2:2379")
    stale = await client.stub.GetJob(pb.GetJobRequest(job="j", serializable=True))
    assert [m.phi for m in stale.round.members] == [0.0, 0.0]
    assert [m.heartbeat_age_ms for m in stale.round.members] == [0, 0]
    refused = await fails(client.stub.GetJob(pb.GetJobRequest(job="j")))
    assert (refused.code, refused.leader) == (Code.UNAVAILABLE, "10.0.0.2:2379")
    client.node.not_leader(1, None)
    missing = await fails(client.stub.GetJob(pb.GetJobRequest(job="nope")))
    assert (missing.code, missing.reason) == (Code.NOT_FOUND, "JOB_NOT_FOUND")


async def test_the_reason_string_uses_the_leader_clock(client: Client) -> None:
    config = job_config(1, 3, last_call_ms=10_000)
    await client.stub.Join(
        pb.JoinRequest(header=client.headers(), job="j", name="a", config=config)
    )
    client.node.clock_ms += 4_000
    job = await client.stub.GetJob(pb.GetJobRequest(job="j"))
    assert job.round.reason.startswith("1 of min 1 joined; last call ends in 6.0 s")


async def test_list_jobs_in_id_order_without_history(client: Client) -> None:
    await join_round(client.channel, client.headers, "b", 1)
    await client.join("a", "x")
    listed = await client.stub.ListJobs(pb.ListJobsRequest())
    assert [(j.job, j.state) for j in listed.jobs] == [
        ("a", pb.ROUND_STATE_JOINING),
        ("b", pb.ROUND_STATE_ACTIVE),
    ]
    barriers = client.node.read_barriers
    await client.stub.ListJobs(pb.ListJobsRequest(serializable=True))
    assert client.node.read_barriers == barriers


# ---------------------------------------------------------------------- watches


async def test_watch_sends_the_current_round_then_each_change(client: Client) -> None:
    await client.join("j", "a")
    barriers = client.node.read_barriers
    call = client.stub.WatchJob(pb.WatchJobRequest(job="j"))
    first = await call.read()
    assert isinstance(first, pb.WatchJobResponse)
    assert client.node.read_barriers == barriers + 1
    assert [m.name for m in first.round.members] == ["a"]
    await until(lambda: client.node.apply_waits > 0)
    await client.join("j", "b")
    closed = await call.read()
    assert isinstance(closed, pb.WatchJobResponse)
    assert closed.round.state == pb.ROUND_STATE_ACTIVE
    assert closed.round.job_revision > first.round.job_revision
    await client.stub.CloseJob(pb.CloseJobRequest(header=client.headers(), job="j"))
    ended = await call.read()
    assert isinstance(ended, pb.WatchJobResponse) and ended.round.job_closed
    call.cancel()


async def test_watch_coalesces_joins_but_sends_a_state_change_at_once(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Joins within one round and state wait for the coalescing window (here: for ever);
    # the round closing goes at once and carries everything that happened meanwhile.
    monkeypatch.setattr(rendezvous_service, "WATCH_COALESCE_S", 1_000.0)

    async def join(name: str) -> None:
        request = pb.JoinRequest(
            header=client.headers(), job="big", name=name, config=job_config(12, 12)
        )
        await client.stub.Join(request)

    await join("p0")
    call = client.stub.WatchJob(pb.WatchJobRequest(job="big"))
    first = await call.read()
    assert isinstance(first, pb.WatchJobResponse)
    assert len(first.round.members) == 1
    for i in range(1, 12):  # the twelfth join closes the round
        await join(f"p{i}")
    closed = await asyncio.wait_for(call.read(), 20)
    assert isinstance(closed, pb.WatchJobResponse)
    assert closed.round.state == pb.ROUND_STATE_ACTIVE
    assert len(closed.round.members) == 12
    call.cancel()


async def test_watch_ends_with_not_found_when_the_job_is_missing_or_dropped(
    client: Client,
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as never:
        await client.stub.WatchJob(pb.WatchJobRequest(job="nope")).read()
    assert (rpc_failure(never.value).code, rpc_failure(never.value).reason) == (
        Code.NOT_FOUND,
        "JOB_NOT_FOUND",
    )
    await client.join("j", "a")
    await client.join("k", "a")
    await client.stub.CloseJob(pb.CloseJobRequest(header=client.headers(), job="j"))
    call = client.stub.WatchJob(pb.WatchJobRequest(job="j"))
    assert isinstance(await call.read(), pb.WatchJobResponse)
    # With max_jobs = 2, a third job takes the place of the oldest closed one.
    await client.join("l", "a")
    with pytest.raises(grpc.aio.AioRpcError) as dropped:
        await call.read()
    assert rpc_failure(dropped.value).code == Code.NOT_FOUND


# ---------------------------------------------------------------------- heartbeats


def _beat(job: str, pid: int, round_number: int) -> pb.HeartbeatRequest:
    return pb.HeartbeatRequest(job=job, participant_id=pid, round=round_number)


async def test_heartbeats_feed_the_detector_and_answer_on_change_or_every_n(
    client: Client,
) -> None:
    a, b = await join_round(client.channel, client.headers, "j", 2)
    pid = a.participant_id
    call = client.stub.Heartbeat()
    for _ in range(HEARTBEAT_ANSWER_EVERY):
        await call.write(_beat("j", pid, 1))
    first = await call.read()
    assert isinstance(first, pb.HeartbeatResponse)
    assert (first.current_round, first.state) == (1, pb.ROUND_STATE_ACTIVE)
    periodic = await call.read()
    assert isinstance(periodic, pb.HeartbeatResponse) and periodic.current_round == 1
    await until(lambda: len(client.node.heartbeats) == HEARTBEAT_ANSWER_EVERY)
    # The other member leaves: round 2 opens; the next heartbeat (still naming round 1)
    # learns of it at once.
    await client.stub.Leave(
        pb.LeaveRequest(header=client.headers(), job="j", participant_id=b.participant_id)
    )
    await call.write(_beat("j", pid, 1))
    changed = await call.read()
    assert isinstance(changed, pb.HeartbeatResponse)
    assert (changed.current_round, changed.state) == (2, pb.ROUND_STATE_JOINING)
    assert client.node.heartbeats == [("j", pid)] * (HEARTBEAT_ANSWER_EVERY + 1)
    # A worker that left closes its stream: no evidence of anything.
    await client.stub.Leave(pb.LeaveRequest(header=client.headers(), job="j", participant_id=pid))
    await call.done_writing()
    assert await call.read() == grpc.aio.EOF
    assert await call.code() == Code.OK
    assert client.node.closed_streams == []


@pytest.mark.parametrize("cancel", [True, False])
async def test_a_stream_ending_is_reported_for_each_participant_it_carried_still_in_the_job(
    client: Client, cancel: bool
) -> None:
    a, b, c = await join_round(client.channel, client.headers, "j", 3)
    call = client.stub.Heartbeat()
    for joined in (c, a, b):
        await call.write(_beat("j", joined.participant_id, 1))
        assert isinstance(await call.read(), pb.HeartbeatResponse)
    await client.stub.Leave(
        pb.LeaveRequest(header=client.headers(), job="j", participant_id=b.participant_id)
    )
    # A cancellation and a half-close reach the server alike (the end of the requests).
    if cancel:
        call.cancel()
    else:
        await call.done_writing()
    await until(lambda: len(client.node.closed_streams) == 2)
    assert client.node.closed_streams == [("j", a.participant_id), ("j", c.participant_id)]


async def test_heartbeat_is_served_by_a_follower_and_refused_by_a_cut_off_member(
    client: Client,
) -> None:
    (joined,) = await join_round(client.channel, client.headers, "j", 1)
    client.node.not_leader(2, "10.0.0.2:2379")
    call = client.stub.Heartbeat()
    await call.write(_beat("j", joined.participant_id, 1))
    answer = await call.read()
    assert isinstance(answer, pb.HeartbeatResponse) and answer.current_round == 1
    assert client.node.heartbeats == [("j", joined.participant_id)]
    # Cut off from the leader (its reports not taken): the worker is sent elsewhere and the
    # participant released here, not suspected.
    client.node.cut_off = True
    await call.write(_beat("j", joined.participant_id, 1))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call.read()
    failure = rpc_failure(info.value)
    assert (failure.code, failure.reason) == (Code.UNAVAILABLE, "NO_LEADER")
    assert client.node.closed_streams == []
    assert client.node.released == [("j", joined.participant_id)]


@pytest.mark.parametrize(
    ("request_", "code", "reason"),
    [
        (_beat("j", 999, 1), Code.NOT_FOUND, "PARTICIPANT_NOT_FOUND"),
        (_beat("nope", 1, 1), Code.NOT_FOUND, "JOB_NOT_FOUND"),
        (_beat("j", 0, 1), Code.INVALID_ARGUMENT, "INVALID_REQUEST"),
        (_beat("a b", 1, 1), Code.INVALID_ARGUMENT, "INVALID_REQUEST"),
    ],
)
async def test_heartbeat_for_an_unknown_or_malformed_participant_ends_the_stream(
    client: Client, request_: pb.HeartbeatRequest, code: grpc.StatusCode, reason: str
) -> None:
    await join_round(client.channel, client.headers, "j", 1)
    call = client.stub.Heartbeat()
    await call.write(request_)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call.read()
    assert (rpc_failure(info.value).code, rpc_failure(info.value).reason) == (code, reason)


async def test_a_config_from_a_client_that_predates_hang_detection_gets_its_defaults(
    client: Client,
) -> None:
    """Fields added to JobConfig later read 0 (absent) as their default; sent, they are
    checked like the others."""
    older = job_config(2, 3)
    for name in (
        "hang_factor",
        "hang_floor_ms",
        "startup_timeout_ms",
        "straggler_factor",
        "straggler_windows",
        "straggler_window_ms",
        "unit_size",
        "straggler_hold_windows",
    ):
        older.ClearField(name)
    await client.stub.Configure(pb.ConfigureRequest(header=client.headers(), job="j", config=older))
    job = await client.stub.GetJob(pb.GetJobRequest(job="j"))
    assert job.config == job_config(2, 3)
    bad = job_config(2, 3, hang_factor=-1.0)
    refused = await fails(
        client.stub.Configure(pb.ConfigureRequest(header=client.headers(), job="k", config=bad))
    )
    assert refused.code is Code.INVALID_ARGUMENT and "hang_factor" in refused.details


# ------------------------------------------------------------ collective failure reports


def _report(job: str, pid: int, round_number: int) -> pb.ReportCollectiveFailureRequest:
    return pb.ReportCollectiveFailureRequest(
        job=job, participant_id=pid, round=round_number, detail="gloo: Connection reset"
    )


async def test_a_collective_failure_report_is_taken_only_from_a_current_member_for_its_round(
    client: Client,
) -> None:
    """The fence of ReportCollectiveFailure: a waiter (no member of the round), a round
    that has not begun, an ended round and an unknown job are refused, hasten nothing and end
    nothing; a member of the current round, for that round, is taken and names the round's
    other members to this member's detection."""
    a = await client.join("j", "a")
    b = await client.join("j", "b")
    waiter = await client.join("j", "c")
    assert b.round.state == pb.ROUND_STATE_ACTIVE and waiter.waiting
    refusals = [
        _report("j", waiter.participant_id, 1),  # not a member of round 1
        _report("j", a.participant_id, 2),  # round 2 does not exist yet
        _report("j", 12345, 1),  # no such participant
    ]
    for request in refusals:
        failure = await fails(client.stub.ReportCollectiveFailure(request))
        assert (failure.code, failure.reason) == (Code.FAILED_PRECONDITION, "STALE_ROUND")
    missing = await fails(client.stub.ReportCollectiveFailure(_report("nope", 1, 1)))
    assert missing.code == Code.NOT_FOUND
    assert client.node.collective_reports == []
    job = await client.stub.GetJob(pb.GetJobRequest(job="j"))
    assert (job.round.round, job.round.state) == (1, pb.ROUND_STATE_ACTIVE)
    # b leaves: round 2 is a and the former waiter; a report for round 1 is now stale.
    await client.stub.Leave(
        pb.LeaveRequest(header=client.headers(), job="j", participant_id=b.participant_id)
    )
    stale = await fails(client.stub.ReportCollectiveFailure(_report("j", a.participant_id, 1)))
    assert (stale.code, stale.reason) == (Code.FAILED_PRECONDITION, "STALE_ROUND")
    assert client.node.collective_reports == []
    taken = await client.stub.ReportCollectiveFailure(_report("j", a.participant_id, 2))
    assert list(taken.confirmed) == []  # no stream of the peer closed here
    ((job_id, peers, report),) = client.node.collective_reports
    assert (job_id, peers) == ("j", (waiter.participant_id,))
    assert report.startswith(f"rank 0 (participant {a.participant_id}) reported a failed")
    job = await client.stub.GetJob(pb.GetJobRequest(job="j"))
    assert (job.round.round, job.round.state) == (2, pb.ROUND_STATE_ACTIVE)
