"""The client's one error hierarchy, and the one place gRPC failures are mapped into it.

Users of :mod:`rallypoint.client` never see a ``grpc`` exception. Every failed RPC goes through
:func:`map_rpc_error`, which picks the class from the status code and the machine-readable
reason the server sends in the trailing metadata key ``rallypoint-error-reason`` (see
``proto/v1/common.proto``), and keeps the server's message, the reason and the
``rallypoint-leader`` hint on the exception.

Transport failures. A member always sends a reason with its refusals; a status without one
was made by gRPC itself (no connection, no answer in time, a broken stream) or by a server
that is not a member (a peer port, an HTTP server, a service of another kind). Those become
a sentence in our words that names the endpoint, says what happened and what to check ("no
member answered at 127.0.0.1:2379 (connection refused): is a member running there, and is
that its client port?"; ``transport_failures.py`` holds the words). gRPC's own text, which
means little to a user ("failed to connect to all addresses; last error: UNKNOWN:
ipv4:..."), is kept on the error (``grpc_code``, ``grpc_detail``) and in the debug log, never
in the message; which failure it was is the error's ``failure`` (a ``FailureKind``). The
transport tells a member's peer port (which closes a gRPC connection at once) from a server
down by opening the members' peer protocol on the same port (``peer_port``). An endpoint
that is not a member's client port at all raises :class:`WrongEndpointError`, which the
transport does not wait on.

Retry rule: only :class:`UnavailableError` is retried inside the client (the request was
fine, this member could not serve it now). Everything else describes the request or the
state and is raised at once.

Unknown outcomes. A write that fails with :class:`UnavailableError` or
:class:`DeadlineExceededError` after the client gave up retrying, or with
:class:`OutcomeUnknownError`, may or may not have been applied. Every other error means the
write was not applied.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import grpc
import grpc.aio

from .transport_failures import FailureKind, check_for, classify, transport_message

log = logging.getLogger("rallypoint.client")

REASON_KEY = "rallypoint-error-reason"
LEADER_KEY = "rallypoint-leader"
UNSPECIFIED_REASON = "ERROR_REASON_UNSPECIFIED"


class RallypointError(Exception):
    """Base of every error the client raises.

    ``reason`` is the server's ErrorReason name ("" when none was sent), ``leader_hint`` the
    leader's client address when the server named one, ``server_message`` the server's own text.
    """

    def __init__(self, message: str, *, reason: str = "", leader_hint: str | None = None) -> None:
        super().__init__(message)
        self.server_message = message
        self.reason = reason
        self.leader_hint = leader_hint
        # The endpoint whose answer (or silence) this is, when one call made it; gRPC's own
        # status code and text for a failure gRPC reported (kept for debugging, never shown).
        self.endpoint: str | None = None
        self.grpc_code = ""
        self.grpc_detail = ""
        # What went wrong in the transport (None: the member itself refused the request).
        self.failure: FailureKind | None = None

    def carry_from(self, other: RallypointError) -> None:
        """Keep ``other``'s endpoint and gRPC detail (a refinement of the same failure)."""
        self.endpoint, self.failure = other.endpoint, other.failure
        self.grpc_code, self.grpc_detail = other.grpc_code, other.grpc_detail

    def __str__(self) -> str:
        text = self.server_message or type(self).__name__
        # The unspecified reason adds nothing to the class and the message.
        shown = self.reason not in ("", UNSPECIFIED_REASON)
        return f"{text} [{self.reason}]" if shown else text


class UnavailableError(RallypointError):
    """No member could serve the request: none reachable, or no leader, within the deadline."""


class WrongEndpointError(UnavailableError):
    """The endpoint is not a member's client port: a member's peer port, a server that does
    not speak gRPC or lacks rallypoint's API, or a TLS setting that does not match. Retried on
    the other endpoints; raised at once when every endpoint is wrong."""


class DeadlineExceededError(RallypointError):
    """The call did not complete within its deadline."""


class InvalidArgumentError(RallypointError):
    """The request is malformed (empty key, non-positive TTL, ...)."""


class InvalidValueError(InvalidArgumentError, ValueError):
    """Raised client-side, before anything is sent: a value given to the client is out of
    range (a negative TTL, a timeout of 0, an endpoint without a port, ...)."""


class NotFoundError(RallypointError):
    """The named lease, session or member does not exist."""


class LeaseNotFoundError(NotFoundError):
    pass


class SessionExpiredError(NotFoundError):
    """The client's session ended on the server (it expired or was closed)."""


class OutcomeUnknownError(SessionExpiredError):
    """A write was sent, its answer was lost, and its session expired before a retry could ask
    again: the write may or may not have been applied. Read the state to find out."""


class MemberNotFoundError(NotFoundError):
    pass


class FailedPreconditionError(RallypointError):
    """The request is well-formed but the current state refuses it; a retry will not help."""


class StaleFenceError(FailedPreconditionError):
    """The write's fencing token is stale: the lease is gone or a newer holder wrote."""


class NotAnIntegerError(FailedPreconditionError):
    """``add`` on a value that is not a decimal integer."""


class SequenceDiscardedError(FailedPreconditionError):
    """The session already discarded this request's answer (a client bug if it happens)."""


class ClusterVersionError(FailedPreconditionError):
    """The request needs a feature newer than the cluster version: some member runs an older
    release. The message names the feature and the version it needs; upgrade every member
    (docs/operations.md, "Upgrading") and the cluster version rises by itself."""


class ResourceExhaustedError(RallypointError):
    pass


class KeyTooLargeError(ResourceExhaustedError):
    pass


class ValueTooLargeError(ResourceExhaustedError):
    pass


class TooManyOutstandingError(ResourceExhaustedError):
    pass


class OutOfRangeError(RallypointError):
    pass


class AddOverflowError(OutOfRangeError):
    """``add`` would leave the signed 64-bit range."""


class CompactedError(OutOfRangeError):
    """A watch asked for history that was compacted away. ``compact_revision`` is the oldest
    revision still available (0 when the server did not say): re-read the state and watch
    from the read's revision + 1."""

    def __init__(
        self,
        message: str,
        *,
        reason: str = "COMPACTED",
        leader_hint: str | None = None,
        compact_revision: int = 0,
    ) -> None:
        super().__init__(message, reason=reason, leader_hint=leader_hint)
        self.compact_revision = compact_revision


# How a caller of the client library passes a token; each interface names its own ways
# (the CLI's --token, torchrun's --rdzv-conf token=, elastic_training's token=).
TOKEN_OPTIONS = "Client(..., token=...) or $RALLYPOINT_TOKEN"


class UnauthenticatedError(RallypointError):
    """The cluster requires a bearer token and the client sent none, or one it does not know
    (``Client(..., token=...)``). The message names the member, which of the two it was and
    how to pass a token, in the words of the interface in use (``Client(token_hint=...)``)."""

    # Whether the refused call carried a token; None when the mapping did not know.
    token_sent: bool | None = None


def unauthenticated_message(endpoint: str | None, token_sent: bool, options: str) -> str:
    """One line for a refused token: the member, what was sent, how to send one."""
    where = endpoint or "the cluster"
    if token_sent:
        return (
            f"{where} refused the token: the cluster does not know it (check the token given "
            f"with {options})"
        )
    return f"{where} requires a token and none was sent: pass one with {options}"


class PermissionDeniedError(RallypointError):
    """The token is known but its role may not make this request: a ``read`` token writing,
    a ``job:<id>`` token touching another job or the key-value store, anything but ``admin``
    changing the cluster. The message names the role and what it lacked."""


class InternalError(RallypointError):
    """The server failed in a way the API does not describe (INTERNAL, UNKNOWN, ...)."""


_S = grpc.StatusCode
# reason -> (the status code the contract sends it with, the class).
_BY_REASON: dict[str, tuple[grpc.StatusCode, type[RallypointError]]] = {
    "LEASE_NOT_FOUND": (_S.NOT_FOUND, LeaseNotFoundError),
    "SESSION_EXPIRED": (_S.NOT_FOUND, SessionExpiredError),
    "MEMBER_NOT_FOUND": (_S.NOT_FOUND, MemberNotFoundError),
    "STALE_FENCE": (_S.FAILED_PRECONDITION, StaleFenceError),
    "NOT_AN_INTEGER": (_S.FAILED_PRECONDITION, NotAnIntegerError),
    "SEQUENCE_DISCARDED": (_S.FAILED_PRECONDITION, SequenceDiscardedError),
    "CLUSTER_VERSION": (_S.FAILED_PRECONDITION, ClusterVersionError),
    "KEY_TOO_LARGE": (_S.RESOURCE_EXHAUSTED, KeyTooLargeError),
    "VALUE_TOO_LARGE": (_S.RESOURCE_EXHAUSTED, ValueTooLargeError),
    "TOO_MANY_OUTSTANDING": (_S.RESOURCE_EXHAUSTED, TooManyOutstandingError),
    "ADD_OVERFLOW": (_S.OUT_OF_RANGE, AddOverflowError),
    "COMPACTED": (_S.OUT_OF_RANGE, CompactedError),
}

_BY_CODE: dict[grpc.StatusCode, type[RallypointError]] = {
    grpc.StatusCode.UNAVAILABLE: UnavailableError,
    # The server went away mid-call (shutdown, connection reset): another member may serve it.
    grpc.StatusCode.CANCELLED: UnavailableError,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceededError,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
    grpc.StatusCode.NOT_FOUND: NotFoundError,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPreconditionError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhaustedError,
    grpc.StatusCode.OUT_OF_RANGE: OutOfRangeError,
    grpc.StatusCode.UNAUTHENTICATED: UnauthenticatedError,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDeniedError,
}


def _metadata_value(metadata: Iterable[object] | None, key: str) -> str | None:
    # grpc.aio gives a Metadata of (key, value) pairs; the type stubs describe the sync API's
    # objects, hence the loose type and the shape check.
    for item in metadata or ():
        if isinstance(item, tuple) and len(item) == 2 and item[0] == key:
            value = item[1]
            return value.decode() if isinstance(value, bytes) else str(value)
    return None


def failure_check(error: RallypointError) -> str:
    """What to check about ``error``'s transport failure ("" for a member's own refusal)."""
    return check_for(error.failure) if error.failure is not None else ""


_KIND_CLASS: dict[FailureKind, type[RallypointError]] = {
    FailureKind.TLS: WrongEndpointError,
    FailureKind.NOT_GRPC: WrongEndpointError,
    FailureKind.PEER_PORT: WrongEndpointError,
    FailureKind.NOT_RALLYPOINT: WrongEndpointError,
    FailureKind.NO_ANSWER: DeadlineExceededError,
}


def map_rpc_error(
    error: grpc.aio.AioRpcError,
    endpoint: str | None = None,
    *,
    timeout_s: float | None = None,
    peer_port: bool = False,
    token_sent: bool | None = None,
    token_hint: str = TOKEN_OPTIONS,
) -> RallypointError:
    """The client error for a failed RPC: the one mapping from gRPC to rallypoint errors.

    ``endpoint``: the address called (named in transport failures); ``timeout_s``: the
    attempt's timeout (said when it passed with no answer); ``peer_port``: the transport found
    the members' peer protocol on the endpoint that lacked ours (see :class:`FailureKind`);
    ``token_sent``: whether the call carried a token (an UNAUTHENTICATED answer then says
    which of "none sent" and "not known" it was, and names ``token_hint`` as the ways to pass
    one)."""
    code = error.code()
    details = error.details() or ""
    trailing = error.trailing_metadata()
    reason = _metadata_value(trailing, REASON_KEY) or ""
    leader_hint = _metadata_value(trailing, LEADER_KEY) or None
    failure = None if reason else classify(code, details)
    result: RallypointError
    if failure is not None:
        kind, words = failure
        if peer_port:
            kind = FailureKind.PEER_PORT
        where = endpoint or "the member"
        message = transport_message(kind, where, words, timeout_s=timeout_s)
        cls = _KIND_CLASS.get(kind, UnavailableError)
        result = cls(message, leader_hint=leader_hint)
        result.failure = kind
        log.debug("%s: %s (gRPC %s: %s)", where, kind.value, code.name, details)
    else:
        by_reason = _BY_REASON.get(reason)
        if by_reason is not None and by_reason[0] is code:
            cls = by_reason[1]
        else:
            # No reason, or one under an unexpected code: the status code decides
            # (common.proto: "the status code alone decides retry behaviour").
            cls = _BY_CODE.get(code, InternalError)
        message = details or code.name.lower().replace("_", " ")
        if cls is InternalError:
            message = f"{message} (status {code.name})"
        if cls is UnauthenticatedError and token_sent is not None:
            message = unauthenticated_message(endpoint, token_sent, token_hint)
        result = cls(message, reason=reason, leader_hint=leader_hint)
        if isinstance(result, UnauthenticatedError):
            result.token_sent = token_sent
    result.endpoint = endpoint
    result.grpc_code, result.grpc_detail = code.name, details
    return result
