"""Registration: status mapping of member errors, token auth, health, unexpected errors."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rallypoint.coordinator.node.api import (
    CompactedWatchError,
    MemberNotFoundError,
    MemberStoppingError,
    ProposalDroppedError,
    ProposalTimeoutError,
)
from rallypoint.coordinator.service import SERVICE_NAMES
from rallypoint.coordinator.service.errors import RequestFailed, failure_status, status_for
from rallypoint.coordinator.state import errors as failures
from rallypoint.coordinator.version import ClusterVersionError
from rallypoint.proto.v1 import (
    common_pb2,
    kv_pb2,
    kv_pb2_grpc,
    session_pb2,
    session_pb2_grpc,
    watch_pb2,
    watch_pb2_grpc,
)

from .fake_node import FakeNode, fails, rpc_failure, serving

Code = grpc.StatusCode
TOKEN = "s3cret-token"


@pytest.fixture
async def node() -> FakeNode:
    return FakeNode()


@pytest.fixture
async def channel(node: FakeNode) -> AsyncIterator[grpc.aio.Channel]:
    async with serving(node) as channel:
        yield channel


def _put() -> kv_pb2.PutRequest:
    return kv_pb2.PutRequest(
        header=common_pb2.RequestHeader(session_id=1, sequence=1), key=b"k", value=b"v"
    )


async def test_not_leader_with_a_known_leader_hints_its_address(
    node: FakeNode, channel: grpc.aio.Channel
) -> None:
    node.not_leader(2, "10.0.0.2:2379")
    kv = kv_pb2_grpc.KVStub(channel)
    for call in (kv.Put(_put()), kv.Get(kv_pb2.GetRequest(key=b"k"))):
        failure = await fails(call)
        assert (failure.code, failure.reason, failure.leader) == (
            Code.UNAVAILABLE,
            "NOT_LEADER",
            "10.0.0.2:2379",
        )
        assert "leader is member 2 at 10.0.0.2:2379" in failure.details


async def test_not_leader_without_an_address_and_with_no_leader(
    node: FakeNode, channel: grpc.aio.Channel
) -> None:
    kv = kv_pb2_grpc.KVStub(channel)
    node.not_leader(2, None)
    known = await fails(kv.Put(_put()))
    assert (known.code, known.reason, known.leader) == (Code.UNAVAILABLE, "NOT_LEADER", None)
    node.not_leader(0, None)
    election = await fails(kv.Put(_put()))
    assert (election.code, election.reason, election.leader) == (
        Code.UNAVAILABLE,
        "NO_LEADER",
        None,
    )
    assert "no leader" in election.details


async def test_timeouts_and_dropped_proposals_are_unavailable(
    node: FakeNode, channel: grpc.aio.Channel
) -> None:
    kv = kv_pb2_grpc.KVStub(channel)
    node.fail_next = ProposalTimeoutError("the proposal did not commit within 0.5 s")
    timed_out = await fails(kv.Put(_put(), timeout=30))
    assert (timed_out.code, timed_out.details) == (
        Code.UNAVAILABLE,
        "the proposal did not commit within 0.5 s",
    )
    node.fail_next = ProposalDroppedError("a leadership transfer is in progress")
    dropped = await fails(kv.Get(kv_pb2.GetRequest(key=b"k")))
    assert dropped.code == Code.UNAVAILABLE and dropped.reason == "ERROR_REASON_UNSPECIFIED"


def test_a_timeout_past_the_clients_deadline_is_deadline_exceeded() -> None:
    error = ProposalTimeoutError("the read barrier did not complete")
    assert status_for(error, deadline_passed=True).code == Code.DEADLINE_EXCEEDED
    assert status_for(error, deadline_passed=False).code == Code.UNAVAILABLE


def test_a_request_its_member_stopped_waiting_for_is_unavailable_not_internal() -> None:
    # A graceful stop (a rolling upgrade) fails the member's waiters; the proposal may still
    # commit through the others, so the client must retry with the same sequence (answered
    # from the session cache), not take it as a definite failure (INTERNAL did: the set
    # workload read an element whose add had failed).
    stopping = status_for(MemberStoppingError(3), deadline_passed=False)
    assert stopping.code == Code.UNAVAILABLE
    assert stopping.message == (
        "member 3 is shutting down; the request may still apply: retry at another member"
    )


def test_a_feature_newer_than_the_cluster_version_is_a_failed_precondition() -> None:
    refused = status_for(ClusterVersionError("Put.keep_lease", 2, 1), deadline_passed=False)
    assert (refused.code, refused.reason) == (Code.FAILED_PRECONDITION, "CLUSTER_VERSION")
    assert refused.message == (
        "Put.keep_lease needs cluster version 2; the cluster is at version 1 (some member "
        "runs an older release): upgrade every member first"
    )


def test_every_member_error_and_state_failure_has_its_documented_status() -> None:
    compacted = status_for(CompactedWatchError(3, 10), deadline_passed=False)
    assert (compacted.code, compacted.reason) == (Code.OUT_OF_RANGE, "COMPACTED")
    missing = status_for(MemberNotFoundError(4), deadline_passed=False)
    assert (missing.code, missing.reason) == (Code.NOT_FOUND, "MEMBER_NOT_FOUND")
    expected = {
        failures.InvalidCommand("x"): Code.INVALID_ARGUMENT,
        failures.SessionExpired(1): Code.NOT_FOUND,
        failures.SequenceDiscarded(1, 1, 2): Code.FAILED_PRECONDITION,
        failures.TooManyOutstanding(1, 8): Code.RESOURCE_EXHAUSTED,
        failures.StaleFence(b"k", 1, 1, "old"): Code.FAILED_PRECONDITION,
        failures.LeaseNotFound(1): Code.NOT_FOUND,
        failures.KeyTooLarge(9, 8): Code.RESOURCE_EXHAUSTED,
        failures.ValueTooLarge(9, 8): Code.RESOURCE_EXHAUSTED,
        failures.NotAnInteger(b"k"): Code.FAILED_PRECONDITION,
        failures.AddOverflow(b"k"): Code.OUT_OF_RANGE,
        failures.Compacted(5): Code.OUT_OF_RANGE,
        failures.JobNotFound("j"): Code.NOT_FOUND,
        failures.ParticipantNotFound("j", 3): Code.NOT_FOUND,
        failures.CheckpointNotFound("j", 7): Code.NOT_FOUND,
        failures.JobClosed("j"): Code.FAILED_PRECONDITION,
        failures.ConfigConflict("j", "max_nodes 8 != 4"): Code.FAILED_PRECONDITION,
        failures.StaleRound("j", 1, 2, "round 1 has ended"): Code.FAILED_PRECONDITION,
        failures.StaleToken("j", 2, 5, 9): Code.FAILED_PRECONDITION,
        failures.CheckpointIncomplete("j", 7, (1, 2)): Code.FAILED_PRECONDITION,
        failures.HeldOut("j", "w2", 3, 9_000, 4_000): Code.FAILED_PRECONDITION,
        failures.NameTaken("j", "w", 3): Code.ALREADY_EXISTS,
        failures.LimitExceeded("jobs", 4): Code.RESOURCE_EXHAUSTED,
    }
    # Compared by name: a slotted dataclass replaces its class, and both stay subclasses.
    defined = {
        c.__name__ for c in _subclasses(failures.Failure) if c.__module__ == failures.__name__
    }
    assert {type(f).__name__ for f in expected} == defined
    for failure, code in expected.items():
        status = failure_status(failure)
        assert (status.code, status.message, status.reason) == (
            code,
            failure.message,
            failure.reason,
        )
        assert status.reason in common_pb2.ErrorReason.keys()  # noqa: SIM118 (not a dict)


def _subclasses(cls: type) -> list[type]:
    found = []
    for sub in cls.__subclasses__():
        found += [sub, *_subclasses(sub)]
    return found


async def test_an_unexpected_error_is_internal_logged_and_the_server_keeps_serving(
    node: FakeNode, channel: grpc.aio.Channel, caplog: pytest.LogCaptureFixture
) -> None:
    kv = kv_pb2_grpc.KVStub(channel)
    node.raise_next = RuntimeError("disk on fire")
    with caplog.at_level(logging.ERROR, logger="rallypoint.coordinator.service.errors"):
        failure = await fails(kv.Get(kv_pb2.GetRequest(key=b"k")))
    assert (failure.code, failure.details) == (
        Code.INTERNAL,
        "internal error: RuntimeError: disk on fire",
    )
    (logged,) = caplog.records
    assert logged.exc_info is not None and logged.exc_info[0] is RuntimeError
    assert not (await kv.Get(kv_pb2.GetRequest(key=b"k"))).HasField("kv")


def test_a_failure_without_a_status_is_a_broken_invariant() -> None:
    @dataclass(frozen=True, slots=True)
    class Unmapped(failures.Failure):
        @property
        def message(self) -> str:
            return "no one mapped me"

    with pytest.raises(AssertionError, match="no status code for failure Unmapped"):
        failure_status(Unmapped())
    internal = status_for(RequestFailed(Unmapped()), deadline_passed=False)
    assert internal.code == Code.INTERNAL


async def test_health_reports_serving_for_the_server_and_each_service(
    channel: grpc.aio.Channel,
) -> None:
    health = health_pb2_grpc.HealthStub(channel)
    for service in ("", *SERVICE_NAMES):
        response = await health.Check(health_pb2.HealthCheckRequest(service=service))
        assert response.status == health_pb2.HealthCheckResponse.SERVING, service
    unknown = await fails(health.Check(health_pb2.HealthCheckRequest(service="nope")))
    assert unknown.code == Code.NOT_FOUND


async def test_token_auth_refuses_calls_without_the_bearer_token() -> None:
    node = FakeNode()
    async with serving(node, auth_token=TOKEN) as channel:
        sessions = session_pb2_grpc.SessionStub(channel)
        open_request = session_pb2.SessionOpenRequest(ttl_ms=1000)
        for metadata in ((), (("authorization", "Bearer wrong"),), (("authorization", TOKEN),)):
            refused = await fails(sessions.Open(open_request, metadata=metadata))
            assert refused.code == Code.UNAUTHENTICATED
            assert "authorization: Bearer <token>" in refused.details
        assert node.proposals == []

        watch = watch_pb2_grpc.WatchStub(channel).Watch(watch_pb2.WatchRequest(key=b"k"))
        with pytest.raises(grpc.aio.AioRpcError) as streaming:
            await watch.read()
        assert rpc_failure(streaming.value).code == Code.UNAUTHENTICATED
        assert node.open_watches == 0

        good = (("authorization", f"Bearer {TOKEN}"),)
        opened = await sessions.Open(open_request, metadata=good)
        assert opened.session_id == node.index

        health = health_pb2_grpc.HealthStub(channel)
        checked = await health.Check(health_pb2.HealthCheckRequest())
        assert checked.status == health_pb2.HealthCheckResponse.SERVING


async def test_a_request_that_does_not_parse_is_refused_after_authentication() -> None:
    """grpc's own parsing answered UNKNOWN (with the parser's traceback logged), before the
    token was checked. Corrupt bytes and a string that is not UTF-8, on a unary call, a
    server stream and a bidirectional stream."""
    corrupt = b"\xff\xff\xff"
    job_not_utf8 = b"\x0a\x02\xc3\x28"  # GetJobRequest.job = b"\xc3("
    calls = [
        ("/rallypoint.v1.KV/Get", "unary", corrupt),
        ("/rallypoint.v1.Rendezvous/GetJob", "unary", job_not_utf8),
        ("/rallypoint.v1.Watch/Watch", "server-stream", corrupt),
        ("/rallypoint.v1.Lease/KeepAlive", "bidi", corrupt),
    ]
    node = FakeNode()
    async with serving(node, auth_token=TOKEN) as channel:
        for credentials, expected in (
            ((("authorization", f"Bearer {TOKEN}"),), Code.INVALID_ARGUMENT),
            ((), Code.UNAUTHENTICATED),
        ):
            for method, kind, payload in calls:
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    if kind == "unary":
                        await channel.unary_unary(method)(payload, metadata=credentials)
                    elif kind == "server-stream":
                        await channel.unary_stream(method)(payload, metadata=credentials).read()
                    else:
                        call = channel.stream_stream(method)(iter([payload]), metadata=credentials)
                        await call.read()
                failure = rpc_failure(refused.value)
                assert failure.code == expected, (method, credentials, failure)
                if expected == Code.INVALID_ARGUMENT:
                    assert failure.reason == "INVALID_REQUEST", failure
                    assert failure.details.startswith("request: does not parse"), failure
        assert node.proposals == []
