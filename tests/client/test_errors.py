"""Every status code and reason becomes one client error class; no grpc exception escapes."""

from __future__ import annotations

import grpc
import pytest

from rallypoint.client import (
    AddOverflowError,
    Client,
    CompactedError,
    FailedPreconditionError,
    InternalError,
    InvalidArgumentError,
    KeyTooLargeError,
    LeaseNotFoundError,
    MemberNotFoundError,
    NotAnIntegerError,
    NotFoundError,
    OutOfRangeError,
    PermissionDeniedError,
    RallypointError,
    SequenceDiscardedError,
    SessionExpiredError,
    StaleFenceError,
    TooManyOutstandingError,
    UnauthenticatedError,
    ValueTooLargeError,
)

from .fake_server import FakeCluster, Refusal

S = grpc.StatusCode

CASES = [
    (S.INVALID_ARGUMENT, "INVALID_REQUEST", InvalidArgumentError),
    (S.NOT_FOUND, "", NotFoundError),
    (S.NOT_FOUND, "LEASE_NOT_FOUND", LeaseNotFoundError),
    (S.NOT_FOUND, "MEMBER_NOT_FOUND", MemberNotFoundError),
    (S.FAILED_PRECONDITION, "STALE_FENCE", StaleFenceError),
    (S.FAILED_PRECONDITION, "NOT_AN_INTEGER", NotAnIntegerError),
    (S.FAILED_PRECONDITION, "SEQUENCE_DISCARDED", SequenceDiscardedError),
    (S.FAILED_PRECONDITION, "CLUSTER_MISMATCH", FailedPreconditionError),
    (S.RESOURCE_EXHAUSTED, "KEY_TOO_LARGE", KeyTooLargeError),
    (S.RESOURCE_EXHAUSTED, "VALUE_TOO_LARGE", ValueTooLargeError),
    (S.RESOURCE_EXHAUSTED, "TOO_MANY_OUTSTANDING", TooManyOutstandingError),
    (S.OUT_OF_RANGE, "ADD_OVERFLOW", AddOverflowError),
    (S.OUT_OF_RANGE, "COMPACTED", CompactedError),
    (S.OUT_OF_RANGE, "", OutOfRangeError),
    (S.UNAUTHENTICATED, "", UnauthenticatedError),
    (S.PERMISSION_DENIED, "", PermissionDeniedError),
    (S.PERMISSION_DENIED, "ERROR_REASON_UNSPECIFIED", PermissionDeniedError),
    (S.INTERNAL, "", InternalError),
    # A reason under a code the contract does not pair it with: the code decides.
    (S.INVALID_ARGUMENT, "STALE_FENCE", InvalidArgumentError),
]


@pytest.mark.parametrize(("code", "reason", "expected"), CASES)
async def test_status_and_reason_map_to_one_class(
    cluster: FakeCluster,
    client: Client,
    code: grpc.StatusCode,
    reason: str,
    expected: type[RallypointError],
) -> None:
    for member in cluster.members:
        member.switches.fail_with = Refusal(code, reason, "the server says why")
    with pytest.raises(RallypointError) as raised:
        await client.get("k")
    error = raised.value
    assert type(error) is expected
    assert error.reason == reason
    if expected is UnauthenticatedError:
        # Our words: the member, that no token was sent, how to send one; the member's own
        # are kept for --debug.
        assert str(error) == (
            f"{error.endpoint} requires a token and none was sent: pass one with "
            "Client(..., token=...) or $RALLYPOINT_TOKEN"
        )
        assert error.grpc_detail.startswith("the server says why")
        return
    assert "the server says why" in str(error)
    if reason and reason != "ERROR_REASON_UNSPECIFIED":
        assert f"[{reason}]" in str(error)
    else:
        assert "[" not in str(error)
    assert not isinstance(error, grpc.RpcError)


async def test_a_session_that_ends_between_calls_is_not_surfaced(
    cluster: FakeCluster, client: Client
) -> None:
    # A NOT_FOUND / SESSION_EXPIRED from a read is just an error of that class.
    for member in cluster.members:
        member.switches.fail_with = Refusal(S.NOT_FOUND, "SESSION_EXPIRED", "gone")
    with pytest.raises(SessionExpiredError):
        await client.get("k")


async def test_real_refusals_from_the_store(cluster: FakeCluster, client: Client) -> None:
    with pytest.raises(InvalidArgumentError):
        await client.put("", b"v")
    with pytest.raises(KeyTooLargeError, match="above the limit"):
        await client.put("k" * 100, b"v")
    with pytest.raises(ValueTooLargeError):
        await client.put("k", b"v" * 5000)
    with pytest.raises(LeaseNotFoundError):
        await client.put("k", b"v", lease=424242)
    await client.put("text", b"hello")
    with pytest.raises(NotAnIntegerError):
        await client.add("text", 1)
    with pytest.raises(MemberNotFoundError):
        await client.member_remove(99)
    # A refused write is not retried: applied (refused) once.
    assert cluster.store.applies["Add"] == 1
