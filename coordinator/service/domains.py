"""Failure domains on the wire: checking a Drain, Undrain or ListDrained request, who may
drain what, and the answers.

Theory of operation. A drain is cluster-wide and replicated (``state.commands.Drain``): the
state machine records the domain and ends every ACTIVE round with a member in it. What the
servicer adds is the check of the request (a domain of 1..``max_domain_chars`` characters, a
reason of at most ``max_leave_detail_chars``) and the one rule that the authorization table
cannot state by itself, since a DrainRequest names no job: a job's worker role
(``job:J``) may drain a domain only when a participant of job J that the request's own
session joined is in that domain (a worker's health check drains its own host, and nobody
else's). The guard has already checked that the session is the caller's own
(``authz.Rule.session``); this module checks the participant, against this member's applied
state after a read barrier (the worker's join may have been applied on the leader only). The
check and the apply are not one step: a participant that leaves between them does
not undo a drain its own worker asked for, which is the intent anyway. Admin may drain any
domain (and only admin may undrain one: a drained host comes back when an operator says so);
a read-only role holds neither permission and is refused by the guard.
"""

from __future__ import annotations

from rallypoint.proto.v1 import common_pb2, rendezvous_pb2

from ..state.commands import Drain
from ..state.jobs import RendezvousLimits
from ..state.results import DrainResult
from ..state.view import RendezvousView
from .authz import CALLER, RoleKind
from .errors import InvalidArgument, PermissionDenied


def domain(name: str, limits: RendezvousLimits, field: str = "domain") -> str:
    """A participant's domain: "" (none) or at most ``max_domain_chars`` characters."""
    if len(name) > limits.max_domain_chars:
        raise InvalidArgument(
            field, f"must be at most {limits.max_domain_chars} characters, got {len(name)}"
        )
    return name


def named_domain(name: str, limits: RendezvousLimits, field: str = "domain") -> str:
    """The domain a Drain or Undrain is about: 1..``max_domain_chars`` characters."""
    if not name:
        raise InvalidArgument(field, "must name a failure domain (e.g. a host), got nothing")
    return domain(name, limits, field)


def join_domains(
    domains: list[str], names: int, limits: RendezvousLimits, field: str = "domains"
) -> tuple[str, ...]:
    """A JoinBatchRequest's domains: empty (none declared) or one per name."""
    if domains and len(domains) != names:
        raise InvalidArgument(
            field, f"must be empty or one per name: {len(domains)} for {names} names"
        )
    for entry, name in enumerate(domains):
        domain(name, limits, f"{field}[{entry}]")
    return tuple(domains)


def drain_command(
    request: rendezvous_pb2.DrainRequest | rendezvous_pb2.UndrainRequest,
    limits: RendezvousLimits,
    detail_chars: int,
) -> Drain:
    name = named_domain(request.domain, limits)
    if isinstance(request, rendezvous_pb2.UndrainRequest):
        return Drain(domain=name, drain=False)
    if len(request.reason) > detail_chars:
        raise InvalidArgument("reason", f"at most {detail_chars} characters")
    return Drain(domain=name, drain=True, reason=request.reason)


def checks_participants() -> bool:
    """Whether the caller's drain depends on its participants: a job's worker role (admin,
    and a member that requires no credentials, may drain any domain)."""
    role = CALLER.get()
    return role is not None and role.kind is RoleKind.JOB


def check_may_drain(
    rendezvous: RendezvousView, header: common_pb2.RequestHeader, name: str
) -> None:
    """Refuse (PermissionDenied) a job's worker role that drains a domain none of its own
    session's participants is in; admin, and a member that requires no credentials, pass.
    Read after a read barrier: the worker's join is then applied here."""
    role = CALLER.get()
    if role is None or role.kind is not RoleKind.JOB:
        return
    job = rendezvous.jobs.get(role.job)
    if job is not None and any(
        p.session_id == header.session_id and p.domain == name for p in job.participants.values()
    ):
        return
    raise PermissionDenied(
        f"permission denied: role {role.name!r} may drain only a domain in which a "
        f"participant of its own session is; session {header.session_id} has none in job "
        f"{role.job!r} in domain {name!r} (Rendezvous/Drain)"
    )


def drain_pb(
    result: DrainResult, header: common_pb2.ResponseHeader
) -> rendezvous_pb2.DrainResponse:
    return rendezvous_pb2.DrainResponse(
        header=header,
        changed=result.changed,
        ended=[rendezvous_pb2.DrainedRound(job=job, round=number) for job, number in result.ended],
    )


def drained_pb(
    rendezvous: RendezvousView, header: common_pb2.ResponseHeader
) -> rendezvous_pb2.ListDrainedResponse:
    return rendezvous_pb2.ListDrainedResponse(
        header=header,
        domains=[
            rendezvous_pb2.DrainedDomain(domain=d.domain, reason=d.reason, since_ms=d.since_ms)
            for d in rendezvous.drained_domains()
        ],
    )


def spares(rendezvous: RendezvousView, waiting: list[str]) -> int:
    """How many of a job's waiting participants (their domains, ``waiting``) a round could
    admit: those not in a drained domain."""
    drained = {d.domain for d in rendezvous.drained_domains()} if waiting else set()
    return sum(1 for name in waiting if not name or name not in drained)
