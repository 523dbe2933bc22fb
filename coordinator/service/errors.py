"""The one place where outcomes become gRPC statuses.

Servicers never choose a status code. They raise: :class:`Unauthenticated` for a call
without a known token, :class:`PermissionDenied` for a call its role does not allow,
:class:`InvalidArgument` for a malformed request, :class:`RequestFailed` for a
state-machine :class:`~..state.errors.Failure`, :class:`PreconditionFailed` for a
well-formed request the current state forbids, :class:`WaitTimedOut` for a round-store wait
that reached its timeout, or let a member's :class:`~..node.api.NodeError` propagate. The
handler wrapper installed by ``add_services`` catches whatever escapes a handler and calls
:func:`status_for`, which decides the code, the message and the trailing metadata
(``rallypoint-error-reason``, the name of an ``ErrorReason`` value, and ``rallypoint-leader``
for the not-leader hint), exactly as common.proto documents. Anything else is a bug:
INTERNAL, logged with its traceback, and the server keeps serving.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import grpc

from ..node.api import (
    CompactedWatchError,
    LearnerNotReadyError,
    MemberNotFoundError,
    MemberStoppingError,
    NodeError,
    NoLeaderError,
    NotLeaderError,
    ProposalDroppedError,
    ProposalTimeoutError,
)
from ..state.errors import (
    AddOverflow,
    CheckpointIncomplete,
    CheckpointNotFound,
    Compacted,
    ConfigConflict,
    Failure,
    HeldOut,
    InvalidCommand,
    JobClosed,
    JobNotFound,
    KeyTooLarge,
    LeaseNotFound,
    LimitExceeded,
    NameTaken,
    NotAnInteger,
    ParticipantNotFound,
    SequenceDiscarded,
    SessionExpired,
    StaleFence,
    StaleRound,
    StaleToken,
    TooManyOutstanding,
    ValueTooLarge,
)
from ..version import ClusterVersionError

log = logging.getLogger(__name__)

REASON_KEY = "rallypoint-error-reason"
LEADER_KEY = "rallypoint-leader"
# The reason sent when no ErrorReason value fits better; the status code still decides.
UNSPECIFIED = "ERROR_REASON_UNSPECIFIED"

Code = grpc.StatusCode


class ServiceError(Exception):
    """Base of the errors the servicers raise themselves."""


class InvalidArgument(ServiceError):
    """A request field is malformed; ``field`` is its path in the request ("header.sequence")."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field


class RequestFailed(ServiceError):
    """The state machine answered the request with a typed failure."""

    def __init__(self, failure: Failure) -> None:
        super().__init__(failure.message)
        self.failure = failure


class Unauthenticated(ServiceError):
    """The call carried no bearer token, or one the member does not know."""


class PermissionDenied(ServiceError):
    """The caller's role does not allow the call (``authz.py``); the message names the role
    and what it lacked."""


class WaitTimedOut(ServiceError):
    """A round-store wait ended at its own timeout (``timeout_ms``) with a key still missing:
    DEADLINE_EXCEEDED, as torch's store reports a wait that timed out."""


class PreconditionFailed(ServiceError):
    """The request is well-formed but the current state forbids it (a retry alone will not
    help): promoting a voter, transferring leadership to a learner, removing the last voter."""


@dataclass(frozen=True, slots=True)
class Status:
    code: grpc.StatusCode
    message: str
    reason: str
    # The leader's client address for the not-leader hint; None when unknown or irrelevant.
    leader_address: str | None = None

    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        metadata: tuple[tuple[str, str], ...] = ((REASON_KEY, self.reason),)
        if self.leader_address:
            metadata += ((LEADER_KEY, self.leader_address),)
        return metadata


# Each failure of the state machine, by class, to its status code (common.proto, "Errors").
# The reason is the failure's own ``reason`` (an ErrorReason name).
_FAILURE_CODES: dict[type[Failure], grpc.StatusCode] = {
    InvalidCommand: Code.INVALID_ARGUMENT,
    SessionExpired: Code.NOT_FOUND,
    LeaseNotFound: Code.NOT_FOUND,
    SequenceDiscarded: Code.FAILED_PRECONDITION,
    StaleFence: Code.FAILED_PRECONDITION,
    NotAnInteger: Code.FAILED_PRECONDITION,
    TooManyOutstanding: Code.RESOURCE_EXHAUSTED,
    KeyTooLarge: Code.RESOURCE_EXHAUSTED,
    ValueTooLarge: Code.RESOURCE_EXHAUSTED,
    AddOverflow: Code.OUT_OF_RANGE,
    Compacted: Code.OUT_OF_RANGE,
    # Rendezvous, round store and checkpoints (rendezvous.proto, "Errors").
    JobNotFound: Code.NOT_FOUND,
    ParticipantNotFound: Code.NOT_FOUND,
    CheckpointNotFound: Code.NOT_FOUND,
    JobClosed: Code.FAILED_PRECONDITION,
    ConfigConflict: Code.FAILED_PRECONDITION,
    StaleRound: Code.FAILED_PRECONDITION,
    StaleToken: Code.FAILED_PRECONDITION,
    CheckpointIncomplete: Code.FAILED_PRECONDITION,
    HeldOut: Code.FAILED_PRECONDITION,
    NameTaken: Code.ALREADY_EXISTS,
    LimitExceeded: Code.RESOURCE_EXHAUSTED,
}


def failure_status(failure: Failure) -> Status:
    code = _FAILURE_CODES.get(type(failure))
    if code is None:
        raise AssertionError(f"no status code for failure {type(failure).__name__}")
    return Status(code, failure.message, failure.reason)


def node_error_status(error: NodeError, deadline_passed: bool) -> Status:
    message = str(error)
    if isinstance(error, NoLeaderError):
        return Status(Code.UNAVAILABLE, message, "NO_LEADER")
    if isinstance(error, NotLeaderError):
        reason = "NOT_LEADER" if error.leader_id else "NO_LEADER"
        return Status(Code.UNAVAILABLE, message, reason, error.leader_address)
    if isinstance(error, ProposalTimeoutError):
        # The request may still apply; the client's own deadline decides which code it sees.
        code = Code.DEADLINE_EXCEEDED if deadline_passed else Code.UNAVAILABLE
        return Status(code, message or "the request timed out inside the cluster", UNSPECIFIED)
    if isinstance(error, MemberStoppingError):
        # Not INTERNAL: a graceful stop (a rolling upgrade) is expected, and the proposal may
        # still commit; UNAVAILABLE makes the client retry elsewhere with the same sequence.
        return Status(Code.UNAVAILABLE, message, UNSPECIFIED)
    if isinstance(error, ProposalDroppedError):
        return Status(Code.UNAVAILABLE, message or "the proposal was dropped; retry", UNSPECIFIED)
    if isinstance(error, CompactedWatchError):
        return Status(Code.OUT_OF_RANGE, message, "COMPACTED")
    if isinstance(error, LearnerNotReadyError):
        return Status(Code.FAILED_PRECONDITION, message, UNSPECIFIED)
    if isinstance(error, MemberNotFoundError):
        return Status(Code.NOT_FOUND, message, "MEMBER_NOT_FOUND")
    raise AssertionError(f"no status code for member error {type(error).__name__}")


def status_for(error: Exception, deadline_passed: bool) -> Status:
    """The status answering a request whose handler raised ``error``.

    ``deadline_passed``: the client's deadline has expired (decides DEADLINE_EXCEEDED over
    UNAVAILABLE for a proposal that timed out).
    """
    try:
        status = _expected_status(error, deadline_passed)
    except AssertionError as unmapped:
        unmapped.__cause__ = error
        error, status = unmapped, None
    if status is not None:
        return status
    log.error("internal error while serving a request", exc_info=error)
    return Status(Code.INTERNAL, f"internal error: {type(error).__name__}: {error}", UNSPECIFIED)


def _expected_status(error: Exception, deadline_passed: bool) -> Status | None:
    """The status of an expected outcome; None for anything else (a bug)."""
    if isinstance(error, InvalidArgument):
        return Status(Code.INVALID_ARGUMENT, str(error), "INVALID_REQUEST")
    if isinstance(error, RequestFailed):
        return failure_status(error.failure)
    if isinstance(error, PreconditionFailed):
        return Status(Code.FAILED_PRECONDITION, str(error), UNSPECIFIED)
    if isinstance(error, Unauthenticated):
        return Status(Code.UNAUTHENTICATED, str(error), UNSPECIFIED)
    if isinstance(error, PermissionDenied):
        return Status(Code.PERMISSION_DENIED, str(error), UNSPECIFIED)
    if isinstance(error, WaitTimedOut):
        return Status(Code.DEADLINE_EXCEEDED, str(error), UNSPECIFIED)
    if isinstance(error, NodeError):
        return node_error_status(error, deadline_passed)
    if isinstance(error, ClusterVersionError):
        # A retry does not help until every member is upgraded: not UNAVAILABLE.
        return Status(Code.FAILED_PRECONDITION, str(error), "CLUSTER_VERSION")
    return None
