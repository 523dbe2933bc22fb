"""What every servicer shares: response headers, key-value conversion, deadlines, proposing."""

from __future__ import annotations

import functools
from typing import Any, TypeVar

import grpc

from rallypoint.proto.v1 import common_pb2, rendezvous_pb2

from ..node.api import Header, ServerNode
from ..state.commands import Command
from ..state.errors import Failure, JobNotFound
from ..state.jobs import RoundState
from ..state.results import Result, Success
from ..state.values import KeyValue
from ..state.view import JobView
from .errors import PreconditionFailed, RequestFailed

# The longest a servicer waits for a proposal or a read barrier, whatever the client's
# deadline: a request with no deadline (or a very long one) must not pin the server forever.
MAX_WAIT_S = 10.0

SuccessT = TypeVar("SuccessT", bound=Success)
Context = grpc.aio.ServicerContext[Any, Any]


# A round's state on the wire (the Rendezvous service and its heartbeat streams).
ROUND_STATES = {
    RoundState.JOINING: rendezvous_pb2.ROUND_STATE_JOINING,
    RoundState.ACTIVE: rendezvous_pb2.ROUND_STATE_ACTIVE,
    RoundState.ENDED: rendezvous_pb2.ROUND_STATE_ENDED,
}


@functools.lru_cache(maxsize=1)
def header_pb(header: Header) -> common_pb2.ResponseHeader:
    """``header`` as its message. Consecutive calls with an equal header return the same
    message (the answers of one batch carry the same header): copy it into an answer (a
    constructor argument or ``CopyFrom``, as every caller does), never change it."""
    return common_pb2.ResponseHeader(
        revision=header.revision,
        raft_term=header.raft_term,
        leader_id=header.leader_id,
        member_id=header.member_id,
    )


def job_view(node: ServerNode, job_id: str) -> JobView:
    """The job as this member has applied it; NOT_FOUND if it has none by that id."""
    job = node.state.rendezvous.jobs.get(job_id)
    if job is None:
        raise RequestFailed(JobNotFound(job_id))
    return job


def fill_kv(target: common_pb2.KeyValue, kv: KeyValue) -> None:
    """Write ``kv`` into ``target``, a field of an answer being built (cheaper than making a
    KeyValue message and copying it in)."""
    target.key = kv.key
    target.value = kv.value
    target.create_revision = kv.create_revision
    target.mod_revision = kv.mod_revision
    target.version = kv.version
    target.lease_id = kv.lease_id


def kv_pb(kv: KeyValue, keys_only: bool = False) -> common_pb2.KeyValue:
    message = common_pb2.KeyValue()
    fill_kv(message, kv)
    if keys_only:
        message.value = b""
    return message


def wait_s(context: Context, cap_s: float = MAX_WAIT_S) -> float:
    """How long this request may wait inside the cluster: the client's remaining deadline
    (grpc reports None when the client set none), at most ``cap_s``."""
    remaining_s: float | None = context.time_remaining()
    if remaining_s is None:
        return cap_s
    return max(0.0, min(remaining_s, cap_s))


def expect(result: Success | Failure, kind: type[SuccessT]) -> SuccessT:
    """The successful answer of the expected kind; a failure is raised for the one mapping in
    :mod:`.errors`, and any other answer is a broken invariant."""
    if isinstance(result, Failure):
        raise RequestFailed(result)
    if not isinstance(result, kind):
        raise AssertionError(f"expected {kind.__name__}, the state machine answered {result!r}")
    return result


async def propose(
    node: ServerNode,
    command: Command,
    context: Context,
    kind: type[SuccessT],
    header: common_pb2.RequestHeader | None = None,
    session_id: int = 0,
    first_unacked: int = 0,
    timeout_s: float | None = None,
    term: int | None = None,
) -> SuccessT:
    """Propose ``command`` under the request's session header (a validated
    ``RequestHeader``), or, for session commands, under ``session_id`` with no sequence.
    ``timeout_s``: how long to wait, when not the call's own (:func:`wait_s`); ``term``:
    only as this leader's entry of that term (``ServerNode.propose``)."""
    if header is not None:
        session_id, sequence, first_unacked = (
            header.session_id,
            header.sequence,
            header.first_unacked,
        )
    else:
        sequence = 0
    result = await node.propose(
        command,
        session_id=session_id,
        sequence=sequence,
        first_unacked=first_unacked,
        timeout_s=wait_s(context) if timeout_s is None else timeout_s,
        term=term,
    )
    return answered(result, kind, session_id, sequence)


def answered(result: Result, kind: type[SuccessT], session_id: int, sequence: int) -> SuccessT:
    """The proposal's applied ``result`` as its caller's answer of ``kind`` (``propose``)."""
    if sequence and not isinstance(result, (Failure, kind)):
        # The state machine answers a command with its own kind of result, except from the
        # session's cache: this sequence was used before, for another kind of request.
        raise PreconditionFailed(
            f"session {session_id} sequence {sequence} already answered another request "
            f"(a {type(result).__name__}): a retry repeats its request, a new request takes "
            "the next sequence"
        )
    return expect(result, kind)


async def read_barrier(
    node: ServerNode, context: Context, serializable: bool, timeout_s: float | None = None
) -> None:
    """Make the following read linearizable, unless the client asked for a serializable one.
    ``timeout_s``: how long to wait, when not the call's own (:func:`wait_s`)."""
    if not serializable:
        await node.read_barrier(timeout_s=wait_s(context) if timeout_s is None else timeout_s)
