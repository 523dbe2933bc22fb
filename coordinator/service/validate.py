"""Request validation, done before anything is proposed or read.

Each check names the offending field by its path in the request (``header.sequence``,
``fence.token``) so a client can tell exactly what to fix. Size limits are the cluster's
(``node.state.limits``) and are refused with the state machine's own failures
(KEY_TOO_LARGE, VALUE_TOO_LARGE), so a request is refused the same way whether the servicer
or the state machine notices first; refusing here keeps oversized requests out of the log.
"""

from __future__ import annotations

from rallypoint.proto.v1 import common_pb2

from ..state.errors import KeyTooLarge, ValueTooLarge
from ..state.machine import Limits
from ..state.values import Fence
from .errors import InvalidArgument, RequestFailed


def session_header(
    present: bool, header: common_pb2.RequestHeader, field: str = "header"
) -> common_pb2.RequestHeader:
    """The (session_id, sequence, first_unacked) of a mutating request, checked."""
    if not present:
        raise InvalidArgument(
            field, "required on a mutating request (session_id from Session.Open, sequence >= 1)"
        )
    if header.session_id == 0:
        raise InvalidArgument(f"{field}.session_id", "must be non-zero (from Session.Open)")
    if header.sequence == 0:
        raise InvalidArgument(f"{field}.sequence", "must be >= 1")
    if header.first_unacked > header.sequence:
        raise InvalidArgument(
            f"{field}.first_unacked",
            f"must not exceed {field}.sequence ({header.sequence}): this request is still "
            f"unanswered, got {header.first_unacked}",
        )
    return header


def key(value: bytes, limits: Limits, field: str = "key", allow_empty: bool = False) -> bytes:
    if not value and not allow_empty:
        raise InvalidArgument(field, "must not be empty")
    if len(value) > limits.max_key_bytes:
        raise RequestFailed(KeyTooLarge(len(value), limits.max_key_bytes))
    return value


def value(data: bytes, limits: Limits) -> bytes:
    if len(data) > limits.max_value_bytes:
        raise RequestFailed(ValueTooLarge(len(data), limits.max_value_bytes))
    return data


def optional_lease_id(lease_id: int, field: str = "lease_id") -> int:
    """A lease to attach a key to: 0 for none."""
    if lease_id < 0:
        raise InvalidArgument(field, f"must be >= 0 (0 for no lease), got {lease_id}")
    return lease_id


def lease_id(lease_id: int, field: str = "lease_id") -> int:
    """A lease the request is about: must name one."""
    if lease_id <= 0:
        raise InvalidArgument(field, f"must be a lease id (> 0), got {lease_id}")
    return lease_id


def fence(present: bool, fence: common_pb2.Fence, field: str = "fence") -> Fence | None:
    if not present:
        return None
    lease_id(fence.lease_id, f"{field}.lease_id")
    if fence.token == 0:
        raise InvalidArgument(f"{field}.token", "must be the fencing token of the lease's grant")
    return Fence(fence.lease_id, fence.token)


def positive(amount: int, field: str) -> int:
    if amount <= 0:
        raise InvalidArgument(field, f"must be > 0, got {amount}")
    return amount


def non_negative(amount: int, field: str) -> int:
    if amount < 0:
        raise InvalidArgument(field, f"must be >= 0, got {amount}")
    return amount


def session_id(session: int, field: str = "session_id") -> int:
    if session == 0:
        raise InvalidArgument(field, "must be non-zero (from Session.Open)")
    return session


def member_id(member: int, field: str = "id") -> int:
    if member == 0:
        raise InvalidArgument(field, "must be a member id (non-zero)")
    return member


def address(text: str, field: str) -> str:
    """A "host:port" address: a non-empty host and a port in 1..65535."""
    host, colon, port = text.rpartition(":")
    if not text:
        raise InvalidArgument(field, 'must not be empty (expected "host:port")')
    if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidArgument(field, f'must be "host:port" with a port in 1..65535, got {text!r}')
    if host.startswith("[") != host.endswith("]"):
        raise InvalidArgument(field, f"unbalanced brackets around an IPv6 host in {text!r}")
    return text
